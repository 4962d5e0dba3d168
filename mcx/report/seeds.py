"""Runs that differ from a run only in ``train.seed``: where a seed-spread band comes from.

``mcx reproduce`` on other hardware or topology cannot expect bitwise curves; how far a correct
rerun may stray is measured by how far the same training strays under another seed
(``mcx.report.verdict.seed_spread_band``). The seed runs are found among the project's recorded
runs (``.mcx/runs/*/``): finished, and with a fingerprint equal to the run's in every component
(code, environment, data, hardware) except the config, whose only difference is ``train.seed``.
So the spread measures the seed alone, on the hardware the run was recorded on. A sweep made with
``mcx run SPEC --set train.seed=N`` from the same commit is exactly that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.contract.status import Status
from mcx.errors import InputError
from mcx.fingerprint.record import load_record, record_from_dict
from mcx.jsonfile import read_json
from mcx.report.rundata import RunData, load_run_dir
from mcx.track.paths import run_dir, runs_dir

SAME = ("code", "environment", "data", "hardware")  # components that must be equal


@frozen
class SeedRun:
    run_id: str
    seed: Any  # the config's train.seed
    data: RunData


def seed_runs(project: Path, run_id: str) -> list[SeedRun]:
    """``run_id`` itself, then (by run ID) every finished run of the project that differs from it only
    in ``train.seed``, one per seed; each with its main stage's curves."""
    base = load_record(project, run_id)
    want = {name: base.component(name).id for name in SAME}
    want_config = base.config.without_seed()
    found = [SeedRun(run_id, base.config.seed, load_run_dir(run_dir(project, run_id)))]
    seeds = {found[0].seed}
    for d in sorted(p for p in runs_dir(project).iterdir() if p.is_dir() and p.name != run_id):
        raw = read_json(d / "fingerprint.json")
        if raw is None:
            continue
        try:
            record = record_from_dict(raw, str(d / "fingerprint.json"))
        except InputError:
            continue  # a damaged record is no evidence
        seed = record.config.seed
        if (seed in seeds or any(record.component(n).id != want[n] for n in SAME)
                or record.config.without_seed() != want_config):
            continue
        if (read_json(d / "run.json") or {}).get("status") != Status.FINISHED:
            continue
        data = load_run_dir(d)
        if not data.curves:
            continue
        found.append(SeedRun(d.name, seed, data))
        seeds.add(seed)
    return found
