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


def _golden(name: str):
    path = GOLDEN[0].parent / f"{name}.json"
    return record_from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))


def test_typed_views_of_a_record_made_before_modules_were_hashed():
    """A code id of the commit (before D52): the commit is read from it; no module list."""
    rec = _golden("tiny__before_d52")
    assert rec.code.modules is None
    assert rec.code.commit == rec.code.id["commit"] and rec.code.dirty is False
    assert rec.environment.lockfile == "cpu"


def test_typed_views_of_a_dirty_probed_record():
    rec = _golden("tiny__dirty_probed")
    assert rec.code.modules is not None and "mcx/train/loop.py" in rec.code.modules
    assert rec.code.dirty is True and rec.code.changes == {"README.md": "modified", "notes.bin": "untracked"}
    assert rec.hardware.device == "cpu" and rec.hardware.visible_gpus == []
    dataset = rec.data.paths["dataset"]
    assert dataset.source == "dvc" and dataset.subpath == "quickstart" and dataset.record.endswith("data.dvc")
    assert not dataset.pulled and rec.data.max_token_id is None and not rec.data.absent
    assert rec.config.seed == rec.config.id["train"]["seed"]
    assert "seed" not in rec.config.without_seed()["train"] and "seed" in rec.config.id["train"]


def test_a_component_view_never_changes_what_is_hashed():
    """with_path replaces a data path's info, never its id: the run ID stays."""
    from mcx.fingerprint.components import DataPath

    rec = _golden("tiny")
    dataset = rec.data.paths["dataset"]
    data = rec.data.with_path(DataPath(name="dataset", id=dataset.id, info={**dataset.info, "max_token_id": 7}))
    assert data.max_token_id == 7 and data.paths["dataset"].pulled is False
    assert data.digest() == rec.data.digest()
