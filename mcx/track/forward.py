"""MetricsForwarder: a stage's metrics.jsonl and system.jsonl -> MLflow, from a thread of the control plane.

The worker only appends lines to ``<stage>/metrics.jsonl``; it never waits for tracking. A thread in
the control-plane process polls the file, turns every complete new line into metrics and sends them
with ``log_batch`` (at most 1000 metrics a call, whole lines only). Metric keys are
``<kind>/<field>`` for every numeric field of a line except ``step`` and ``time`` (``train/loss``,
``train/mfu``, ``train/tokens_per_s_per_gpu``, ``valid/loss``, ``test/ppl``), the same names
mcx.report gives its curves; the line's ``step`` is the MLflow step and its ``time`` the timestamp
(eval lines, which carry none, take the time of the train line before them), so a value sent twice
is the same MLflow row.

Exactly once: the cursor ``<stage>/tracked.json`` holds the byte offset and line count already sent
and, per kind, the last step sent; it is replaced only after MLflow acknowledged a batch. A line's
identity is (stage, kind, step): a line at or below its kind's last sent step is never sent again.
When a resumed worker truncates the file (docs/stage-directory.md), the cursor notices (the file is
shorter, or the bytes before the offset are not the line it last sent), rescans from the top and
skips every identity already sent; MLflow then keeps the first value sent for a re-run step, while
metrics.jsonl holds the surviving timeline (they agree for deterministic runs).

System metrics (mcx.train.system_metrics) go the same way, one file per node (``system.jsonl``,
``system.<node>.jsonl``), each with its own cursor (``tracked.system.json``, ``tracked.system.<node>.json``)
and the names of mcx.track.lines (``system/gpu_0_utilization_percentage``). The MLflow step is the
training step the line names (the previous line's while the loop has not started, 0 at first), the
timestamp its ``time``. These files are only appended to; a line's identity is (file, time).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from attrs import frozen

from mcx.contract.files import SYSTEM_FILES
from mcx.hashing import digest_bytes
from mcx.track import paths
from mcx.track.journal import FlushResult, Journal
from mcx.track.lines import (
    SYSTEM,
    TRAINING,
    LineRule,
    line_metrics,
    system_metrics,
)
from mcx.track.mlflow_store import METRICS_PER_BATCH
from mcx.track.outage import Outages
from mcx.track.target import Target, describe_error, is_transient, outage_reason

if TYPE_CHECKING:
    from mcx.track.mlflow_store import MlflowStore

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20
TAIL_SCAN = 64 << 10  # how far back from a file's end a line's newline is looked for (lines are < 1 KiB)
MAX_BACKOFF_S = 30.0
# A send costs the store a transaction (about 5-20 ms of CPU for the embedded SQLite store, the same
# for 1 metric or 1000), so the thread sends at most every POLL_S: metrics appear in MLflow a few
# seconds late, and forwarding costs well under 1 % of a core.
POLL_S = 5.0
# A poll, and the stage's last drain, send for at most this long before they give the thread back: a
# store that answers, slowly, cannot hold the end of a stage on a long backlog (D50).
SEND_SLICE_S = 10.0


@frozen
class ForwardResult:
    """One drain: what was sent, what is left of the file, and why it stopped early."""

    metrics: int  # metric values sent
    lines: int  # lines consumed (sent or skipped as already sent)
    pending_bytes: int  # bytes of the stage's files (metrics.jsonl, system*.jsonl) not yet consumed
    error: str | None = None
    transient: bool = False
    busy: bool = False


class Cursor:
    """``<stage>/tracked*.json``: how much of one file (metrics.jsonl, system.jsonl) the tracking store holds."""

    def __init__(self, path: Path, target: str, run_uuid: str) -> None:
        self.path = path
        data = paths.read_json(path, {}) or {}
        if data.get("target") != target or data.get("mlflow_run") != run_uuid:
            data = {}  # another store or run: everything is sent there from the start
        self.target, self.run_uuid = target, run_uuid
        self.offset: int = int(data.get("offset", 0))
        self.lines: int = int(data.get("lines", 0))
        self.sent_through: dict[str, int] = dict(data.get("sent_through", {}))
        self.tail_sha: str | None = data.get("tail_sha")
        self.tail_len: int = int(data.get("tail_len", 0))
        self.last_time_ms: int = int(data.get("last_time_ms", 0))
        self.last_step: int = int(data.get("last_step", 0))
        self.metrics: int = int(data.get("metrics", 0))
        self.rescans: int = int(data.get("rescans", 0))

    def save(self) -> None:
        paths.write_json_atomic(self.path, {
            "target": self.target, "mlflow_run": self.run_uuid, "offset": self.offset, "lines": self.lines,
            "sent_through": self.sent_through, "tail_sha": self.tail_sha, "tail_len": self.tail_len,
            "last_time_ms": self.last_time_ms, "last_step": self.last_step, "metrics": self.metrics,
            "rescans": self.rescans,
        })

    def check(self, metrics_file: Path) -> None:
        """Start over from the top (keeping the identities sent) if the file was rewritten."""
        try:
            size = metrics_file.stat().st_size
        except FileNotFoundError:
            size = 0
        rewritten = size < self.offset
        if not rewritten and self.tail_len:
            with open(metrics_file, "rb") as f:
                f.seek(self.offset - self.tail_len)
                rewritten = digest_bytes(f.read(self.tail_len)) != self.tail_sha
        if rewritten:
            self.offset, self.lines, self.tail_sha, self.tail_len = 0, 0, None, 0
            self.last_time_ms = self.last_step = 0
            self.rescans += 1


@frozen
class Stream:
    """One file of the stage that is forwarded: where its cursor is and which rule reads its lines."""

    file: Path
    cursor: Path
    rule: LineRule


class Recorder(Protocol):
    """What the forwarder (and mcx.track.send) uses of a run's recorder, mcx.track.recorder.RunRecorder."""

    run_id: str
    run_dir: Path
    journal: Journal
    target: Target

    def record_uuid(self, record: str) -> str | None: ...

    def store(self) -> MlflowStore: ...

    def sending(self) -> AbstractContextManager[bool]: ...

    outages: Outages

    def flush(self, *, probe: bool = False, until: float | None = None) -> FlushResult: ...

    def stages(self) -> list[str]: ...


class MetricsForwarder:
    """Tails one stage's metrics.jsonl and system*.jsonl into its MLflow child run; use as a context manager.

    ``start()`` runs :meth:`drain` every ``poll_s`` seconds in a daemon thread (backing off up to
    30 s while the store is unreachable; a poll that finds neither new lines nor new journal
    operations costs a few ``stat`` calls); ``stop()`` drains once more and returns the last result.
    :meth:`drain` may also be called directly (``mcx sync`` does).
    """

    def __init__(self, recorder: Recorder, stage: str, *, poll_s: float = POLL_S) -> None:
        self.recorder = recorder
        self.stage = stage
        self.poll_s = poll_s
        self.stage_dir = recorder.run_dir / stage
        self.metrics_file = self.stage_dir / paths.METRICS_FILE
        self.last: ForwardResult | None = None
        self.busy_s = 0.0  # wall time the thread spent draining (for the overhead benchmark)
        self.cycles = 0
        self._idle: tuple | None = None  # (files, journal) stat when everything was sent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def streams(self) -> list[Stream]:
        """metrics.jsonl, then every node's system metrics file present now."""
        out = [Stream(self.metrics_file, self.stage_dir / paths.CURSOR_FILE, TRAINING)]
        try:
            names = sorted(e.name for e in os.scandir(self.stage_dir) if SYSTEM_FILES.fullmatch(e.name))
        except FileNotFoundError:
            names = []
        for name in names:  # system.jsonl -> tracked.system.json, system.1.jsonl -> tracked.system.1.json
            cursor = self.stage_dir / f"tracked.{name.removesuffix('.jsonl')}.json"
            out.append(Stream(self.stage_dir / name, cursor, SYSTEM))
        return out

    # the thread --------------------------------------------------------------------------------
    def start(self) -> MetricsForwarder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"mcx-metrics-{self.stage}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> ForwardResult | None:
        """Stop polling after one last drain; returns what that drain did."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        return self.last

    def __enter__(self) -> MetricsForwarder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        delay = self.poll_s
        while True:
            stopping = self._stop.wait(delay)
            result = self._cycle(probe=not stopping)  # the last drain does not wait again on a store found down
            if stopping:
                return
            if result.error is not None and not result.busy and not result.metrics:  # sent some: it answers
                delay = min(max(delay * 2, self.poll_s), MAX_BACKOFF_S)
            else:
                delay = self.poll_s

    def _files_stat(self) -> tuple[tuple[str, int, int] | None, ...]:
        out: list[tuple[str, int, int] | None] = []
        for path in [*(s.file for s in self.streams()), self.recorder.journal.path]:
            try:
                st = path.stat()
                out.append((path.name, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def _cycle(self, *, probe: bool = True) -> ForwardResult:
        seen = self._files_stat()
        if self.last is not None and seen == self._idle:
            return self.last  # nothing new since everything was sent
        t0 = time.perf_counter()
        try:
            result = self.drain(probe=probe, until=time.monotonic() + SEND_SLICE_S)
        except Exception as exc:  # noqa: BLE001 - the thread must outlive anything the store does
            log.warning("metrics forwarding for %s paused: %s", self.stage, describe_error(exc))
            left = sum(self._pending(s, None) for s in self.streams())
            result = ForwardResult(0, 0, left, self._reason(exc, time.perf_counter() - t0), is_transient(exc))
        self.busy_s += time.perf_counter() - t0
        self.cycles += 1
        self.last = result
        done = result.error is None and not result.busy and result.pending_bytes == 0
        self._idle = seen if done else None
        return result

    # one pass ----------------------------------------------------------------------------------
    def _reason(self, exc: Exception, waited_s: float) -> str:
        """The failure in a line; a store that cannot be reached is marked down for the command."""
        if not is_transient(exc):
            return describe_error(exc)
        reason = outage_reason(exc)
        self.recorder.outages.mark(self.recorder.target, reason, waited_s)
        return reason

    @staticmethod
    def _pending(stream: Stream, cursor: Cursor | None) -> int:
        """Bytes of whole lines not sent yet: a torn last line (a worker killed mid-write) is not pending,
        as it can never be sent; it becomes pending once the line is complete."""
        offset = cursor.offset if cursor else 0
        try:
            with open(stream.file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size <= offset:
                    return 0
                tail = min(size - offset, TAIL_SCAN)
                f.seek(size - tail)
                end = f.read(tail).rfind(b"\n")
        except FileNotFoundError:
            return 0
        if end < 0:
            return 0 if tail == size - offset else size - offset
        return size - tail + end + 1 - offset

    def pending_bytes(self) -> int:
        """Bytes of the stage's files the store does not hold yet, as far as the cursors know."""
        uuid = self.recorder.record_uuid(f"stage:{self.stage}")
        total = 0
        for stream in self.streams():
            cursor = None if uuid is None else Cursor(stream.cursor, self.recorder.target.name, uuid)
            total += self._pending(stream, cursor)
        return total

    def drain(self, *, probe: bool = False, until: float | None = None) -> ForwardResult:
        """Send every complete line not yet sent (journal first, so the stage run exists), stopping between
        requests once ``time.monotonic()`` passes ``until``. A store this command found down is not tried
        again unless ``probe`` (mcx.track.recorder.RunRecorder.flush)."""
        record = self.recorder
        flushed = record.flush(probe=probe, until=until)
        uuid = record.record_uuid(f"stage:{self.stage}")
        if uuid is None or (flushed.error is not None and flushed.transient):  # not created, or the store is down
            left = self.pending_bytes()
            return ForwardResult(0, 0, left, flushed.error or "the stage run is not recorded yet",
                                 flushed.transient or flushed.error is None, flushed.busy)
        with record.sending() as mine:
            if not mine:
                return ForwardResult(0, 0, self.pending_bytes(), None, busy=True)
            sent_metrics = sent_lines = pending = 0
            error, transient = None, False
            for stream in self.streams():
                cursor = Cursor(stream.cursor, record.target.name, uuid)
                if error is not None or not stream.file.exists():
                    pending += self._pending(stream, cursor)
                    continue
                cursor.check(stream.file)
                part = self._send_from(stream, cursor, uuid, until)
                sent_metrics, sent_lines, pending = sent_metrics + part.metrics, sent_lines + part.lines, \
                    pending + part.pending_bytes
                error, transient = part.error, part.transient
            return ForwardResult(sent_metrics, sent_lines, pending, error, transient)

    def _send_from(self, stream: Stream, cursor: Cursor, uuid: str, until: float | None) -> ForwardResult:
        store = self.recorder.store()
        sent_metrics = sent_lines = 0
        with open(stream.file, "rb") as f:
            while True:
                f.seek(cursor.offset)
                data = f.read(READ_CHUNK)
                end = data.rfind(b"\n")
                if end < 0:
                    break  # nothing complete yet (a line longer than READ_CHUNK is not a metrics line)
                for batch in _batches(data[: end + 1], cursor, stream.rule):
                    if batch.metrics and until is not None and time.monotonic() > until:
                        return ForwardResult(sent_metrics, sent_lines, self._pending(stream, cursor),
                                             f"the store answered too slowly: {sent_metrics} metrics sent before "
                                             "the time for this send was up", transient=True)
                    if batch.metrics:
                        t0 = time.monotonic()
                        try:
                            store.log_metrics(uuid, batch.metrics)
                        except Exception as exc:  # noqa: BLE001 - left in the file, sent next time
                            return ForwardResult(sent_metrics, sent_lines, self._pending(stream, cursor),
                                                 self._reason(exc, time.monotonic() - t0), is_transient(exc))
                        self.recorder.outages.clear(self.recorder.target.name)
                    batch.commit(cursor)
                    cursor.save()
                    sent_metrics += len(batch.metrics)
                    sent_lines += batch.lines
        return ForwardResult(sent_metrics, sent_lines, self._pending(stream, cursor))


class _Batch:
    """Whole lines whose metrics fit one log_batch call, and the cursor state after them."""

    def __init__(self, sent_through: dict[str, int], last_time_ms: int, last_step: int) -> None:
        self.metrics: list[tuple[str, float, int, int]] = []
        self.lines = 0
        self.nbytes = 0
        self.sent_through = dict(sent_through)
        self.last_time_ms = last_time_ms
        self.last_step = last_step
        self.tail = b""

    def commit(self, cursor: Cursor) -> None:
        cursor.offset += self.nbytes
        cursor.lines += self.lines
        cursor.sent_through = self.sent_through
        cursor.last_time_ms = self.last_time_ms
        cursor.last_step = self.last_step
        cursor.tail_sha, cursor.tail_len = digest_bytes(self.tail), len(self.tail)
        cursor.metrics += len(self.metrics)


def _batches(data: bytes, cursor: Cursor, rule: LineRule) -> Iterator[_Batch]:
    """Split complete lines into batches; each batch's state builds on the previous one's."""
    batch = _Batch(cursor.sent_through, cursor.last_time_ms, cursor.last_step)
    for raw in data.splitlines(keepends=True):
        record = _parse(raw)
        if record is not None:
            t, step = record.get("time"), record.get("step")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
                batch_time = int(t * 1000)  # eval lines carry no time: the train line's before them
            else:
                batch_time = batch.last_time_ms
            batch_step = step if type(step) is int else batch.last_step  # system lines before the loop
            ident = rule.identity(record, batch_step, batch_time)
        else:
            ident = None
        last = batch.sent_through.get(ident[0]) if ident else None
        fresh = ident is not None and (last is None or ident[1] > last)
        values = rule.metrics(record) if fresh and record is not None else []  # stale: this identity was already sent
        if len(batch.metrics) + len(values) > METRICS_PER_BATCH and batch.lines:
            yield batch
            batch = _Batch(batch.sent_through, batch.last_time_ms, batch.last_step)
        batch.lines += 1
        batch.nbytes += len(raw)
        batch.tail = raw
        if record is not None:
            batch.last_time_ms, batch.last_step = batch_time, batch_step
        if fresh and ident is not None:
            batch.sent_through[ident[0]] = ident[1]
            batch.metrics.extend((key, value, batch.last_time_ms, batch_step) for key, value in values)
    if batch.lines:
        yield batch


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:
        log.warning("skipping a metrics line that is not JSON: %r", raw[:80])
        return None
    return record if isinstance(record, dict) else None


__all__ = ["Cursor", "ForwardResult", "MetricsForwarder", "Stream", "line_metrics", "system_metrics"]
