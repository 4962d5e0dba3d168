"""``mcx sync``: send every run's spooled records and unsent metrics to its tracking store.

For each run directory with tracking state (``.mcx/runs/<id>/track/``, reproductions included),
replay the unacknowledged journal, then drain every stage's metrics.jsonl from its cursor. Both are
idempotent and exactly-once (mcx.track.journal, mcx.track.forward), so ``sync`` can be run any time,
any number of times, also while nothing is pending. A run whose records another process is sending
right now (an ``mcx run`` still training it) is reported busy and left to that process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.track import paths
from mcx.track.forward import MetricsForwarder
from mcx.track.outage import Outage, Outages
from mcx.track.recorder import RUN, TARGET_FILE, RunRecorder
from mcx.track.send import SyncEntry, sync_recorder
from mcx.track.sweep_record import SweepRecorder

_NOT_RUN_DIRS = frozenset({"checkpoints", paths.TRACK_DIR, "plots"})


@frozen
class SyncReport:
    runs: tuple[SyncEntry, ...]
    seconds: float
    outages: tuple[Outage, ...] = ()  # the stores found unreachable (each waited on once)

    @property
    def ok(self) -> bool:
        """True when nothing is left to send (busy runs are being sent by their own process)."""
        return all(e.state in ("synced", "busy") for e in self.runs)

    @property
    def ops_sent(self) -> int:
        return sum(e.ops_sent for e in self.runs)

    @property
    def metrics_sent(self) -> int:
        return sum(e.metrics_sent for e in self.runs)

    def pending(self) -> list[SyncEntry]:
        return [e for e in self.runs if e.state == "pending"]


def tracked_run_dirs(project_root: Path, max_depth: int = 4) -> list[Path]:
    """Every directory under .mcx/runs holding tracking state, parents before their reproductions.

    Checkpoint directories (which can hold many thousand files) are not walked into.
    """
    root = paths.runs_dir(project_root)
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if (here / paths.TRACK_DIR / TARGET_FILE).is_file():
            found.append(here)
        depth = len(here.relative_to(root).parts)
        dirnames[:] = [] if depth >= max_depth else [d for d in dirnames if d not in _NOT_RUN_DIRS]
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def unsent(project_root: Path, run_dir: Path) -> tuple[int, int]:
    """What of ``run_dir``'s records its tracking store lacks, as far as the spool knows: journal
    operations and metrics-file bytes. Sends and writes nothing; (0, 0) for a run never recorded."""
    try:
        record = RunRecorder.load(project_root, run_dir)
    except InputError:
        return 0, 0
    return len(record.journal.pending()), sum(MetricsForwarder(record, s).pending_bytes() for s in record.stages())


def sync(project_root: Path, *, tracking_uri: str | None = None, run_ids: list[str] | None = None) -> SyncReport:
    """Send every spooled record of the project (or of ``run_ids``) to its tracking store.

    ``tracking_uri`` sends them to that store instead of the one each run was recorded for. The first
    request that finds a store unreachable marks it down for the rest of this call: the other runs
    recorded for it are reported pending without waiting on it again (mcx.track.outage).
    """
    t0 = time.perf_counter()
    wanted = {paths.check_run_id(r) for r in run_ids} if run_ids else None
    outages = Outages()
    entries = []
    targets: dict[str, None] = {}
    for run_dir in tracked_run_dirs(project_root):
        record = RunRecorder.load(project_root, run_dir, tracking_uri, outages)
        if wanted is not None and record.run_id not in wanted and record.reproduces not in wanted:
            continue
        entries.append(sync_recorder(record))
        targets[record.target.name] = None
    if wanted is None:  # after the runs: a sweep's record adopts its trials' runs
        for sweep_dir in tracked_sweep_dirs(project_root):
            record = SweepRecorder.load(project_root, sweep_dir, tracking_uri, outages)
            entries.append(sync_recorder(record))
            targets[record.target.name] = None
    down = tuple(o for o in map(outages.get, targets) if o is not None)
    return SyncReport(tuple(entries), time.perf_counter() - t0, down)


def tracked_sweep_dirs(project_root: Path) -> list[Path]:
    """Every sweep directory (.mcx/sweeps/<name>/) holding tracking state."""
    root = paths.sweeps_dir(project_root)
    return sorted(p for p in root.glob("*") if (p / paths.TRACK_DIR / TARGET_FILE).is_file()) if root.is_dir() else []


__all__ = ["RUN", "SyncEntry", "SyncReport", "sync", "sync_recorder", "tracked_run_dirs", "tracked_sweep_dirs", "unsent"]
