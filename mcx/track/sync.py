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
from mcx.track.recorder import RUN, TARGET_FILE, RunRecorder

_NOT_RUN_DIRS = frozenset({"checkpoints", paths.TRACK_DIR, "plots"})


@frozen
class SyncEntry:
    """One run directory after a sync attempt."""

    run_id: str
    run_dir: Path
    target: str  # "embedded" or the server URI
    ops_sent: int
    ops_pending: int
    metrics_sent: int
    pending_bytes: int  # metrics.jsonl bytes not yet in the store, over all stages
    error: str | None = None
    busy: bool = False

    @property
    def state(self) -> str:
        if self.busy:
            return "busy"
        if self.ops_pending or self.pending_bytes:
            return "pending"
        return "synced"


@frozen
class SyncReport:
    runs: tuple[SyncEntry, ...]
    seconds: float

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


def sync_recorder(rec: RunRecorder) -> SyncEntry:
    """Send what one recorder has pending: its journal, then every stage's metrics."""
    flushed = rec.flush()
    error = flushed.error
    busy = flushed.busy
    metrics_sent = pending_bytes = 0
    unreachable = flushed.error is not None and flushed.transient
    for stage in rec.stages():
        fwd = MetricsForwarder(rec, stage)
        if busy or unreachable:  # another process sends them, or the store is down: do not wait on it again
            pending_bytes += fwd.pending_bytes()
            continue
        result = fwd.drain()
        metrics_sent += result.metrics
        pending_bytes += result.pending_bytes
        busy = busy or result.busy
        error = error or result.error
    return SyncEntry(
        run_id=rec.run_id, run_dir=rec.run_dir, target=rec.target.name, ops_sent=flushed.sent,
        ops_pending=len(rec.journal.pending()), metrics_sent=metrics_sent, pending_bytes=pending_bytes,
        error=error, busy=busy,
    )


def unsent(project_root: Path, run_dir: Path) -> tuple[int, int]:
    """What of ``run_dir``'s records its tracking store lacks, as far as the spool knows: journal
    operations and metrics-file bytes. Sends and writes nothing; (0, 0) for a run never recorded."""
    try:
        rec = RunRecorder.load(project_root, run_dir)
    except InputError:
        return 0, 0
    return len(rec.journal.pending()), sum(MetricsForwarder(rec, s).pending_bytes() for s in rec.stages())


def sync(project_root: Path, *, tracking_uri: str | None = None, run_ids: list[str] | None = None) -> SyncReport:
    """Send every spooled record of the project (or of ``run_ids``) to its tracking store.

    ``tracking_uri`` sends them to that store instead of the one each run was recorded for.
    """
    t0 = time.perf_counter()
    wanted = {paths.check_run_id(r) for r in run_ids} if run_ids else None
    entries = []
    for run_dir in tracked_run_dirs(project_root):
        rec = RunRecorder.load(project_root, run_dir, tracking_uri)
        if wanted is not None and rec.run_id not in wanted and rec.reproduces not in wanted:
            continue
        entries.append(sync_recorder(rec))
    return SyncReport(tuple(entries), time.perf_counter() - t0)


__all__ = ["RUN", "SyncEntry", "SyncReport", "sync", "sync_recorder", "tracked_run_dirs", "unsent"]
