"""Send what one run's recorder has pending: its journal, then every stage's metrics.

``RunRecorder.close`` (the end of ``mcx run``) and ``mcx sync`` (mcx.track.sync, for every run
directory) both end here, so the two send alike.
"""

from __future__ import annotations

from pathlib import Path

from attrs import frozen

from mcx.track.forward import MetricsForwarder, Recorder


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
    pending_records: tuple[str, ...] = ()  # what waits: "run" (the run's own record) and stage names, in order

    @property
    def state(self) -> str:
        if self.busy:
            return "busy"
        if self.ops_pending or self.pending_bytes:
            return "pending"
        return "synced"


def sync_recorder(record: Recorder, *, until: float | None = None) -> SyncEntry:
    """Send what one recorder has pending: its journal, then every stage's metrics, until
    ``time.monotonic()`` passes ``until`` (then the rest waits, as for a store that is down)."""
    flushed = record.flush(until=until)
    error = flushed.error
    busy = flushed.busy
    metrics_sent = pending_bytes = 0
    unreachable = flushed.error is not None and flushed.transient
    waiting: dict[str, None] = {}
    for stage in record.stages():
        fwd = MetricsForwarder(record, stage)
        if busy or unreachable:  # another process sends them, or the store is down: do not wait on it again
            left = fwd.pending_bytes()
        else:
            result = fwd.drain(until=until)
            metrics_sent += result.metrics
            left = result.pending_bytes
            busy = busy or result.busy
            error = error or result.error
        pending_bytes += left
        if left:
            waiting[stage] = None
    ops = record.journal.pending()
    for op in ops:
        name = str(op.get("record") or "run")
        waiting[name.removeprefix("stage:")] = None
    order = {"run": -1, **{s: i for i, s in enumerate(record.stages())}}
    return SyncEntry(
        run_id=record.run_id, run_dir=record.run_dir, target=record.target.name, ops_sent=flushed.sent,
        ops_pending=len(ops), metrics_sent=metrics_sent, pending_bytes=pending_bytes,
        error=error, busy=busy, pending_records=tuple(sorted(waiting, key=lambda n: order.get(n, len(order)))),
    )
