"""Recorded fingerprints read into the typed record and written back unchanged: same bytes, same run ID.

The records in tests/data/fingerprints/ were written before the components became typed classes (D54), by
this mcx and by an older one (its README says how each was made). A change to the record classes that moved
a key, a default or a type would change a hash, so every run ID recorded by earlier versions would be lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcx.fingerprint.record import record_from_dict, record_to_dict, run_id
from mcx.jsonfile import write_json_atomic

GOLDEN = sorted((Path(__file__).resolve().parent / "data" / "fingerprints").glob("*.json"))
EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def test_every_shipped_spec_has_a_golden_record():
    """A new spec in experiments/ gets its record here too (regenerate as the README says)."""
    names = {p.stem for p in GOLDEN}
    specs = {p.relative_to(EXPERIMENTS).with_suffix("").as_posix().replace("/", "__")
             for p in EXPERIMENTS.rglob("*.toml")}
    assert specs <= names, sorted(specs - names)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_record_round_trips_to_the_same_bytes_and_run_id(path, tmp_path):
    raw = path.read_bytes()
    data = json.loads(raw)
    record = record_from_dict(data, str(path))
    assert run_id(record) == data["run_id"]
    out = tmp_path / "fingerprint.json"
    write_json_atomic(out, record_to_dict(record))
    assert out.read_bytes() == raw
