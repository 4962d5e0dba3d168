"""MCore's checkpoint writer: started early, its results queue warmed, its requests timed (D30, D31) and
checksummed (D36).

Starting (trainer side). ``start`` runs as soon as the worker has imported Megatron-Core, because the two
helpers saves use take seconds to start and a save that needs one before then waits for it (D31):
* MCore's persistent writer process (asynchronous saves), a spawned interpreter that imports
  Megatron-Core and opens a CUDA context before it takes a request.
* The multiprocessing Manager queue through which every save hands its write results to the trainer: a
  bare spawned interpreter that imports torch when the first results are unpickled in it. A thread puts
  one write result through the queue at start-up and takes it back, so that import happens off the
  training path; ``results_queue_ready`` (before each save) waits for that round trip, so no save's
  results can ever be taken for it.

Timing (writer side). MCore's persistent writer (``PersistentAsyncCaller``, one spawned process per rank) takes one
``AsyncRequest`` at a time: it receives the request (the trainer's CUDA tensors arrive as IPC
handles, which it opens), copies the tensors to pinned host memory (``preload_fn``; training waits
for this part), then writes them (``async_fn``; training goes on). ``timed`` wraps a request so the
writer says in the stage's worker.log where one save's time went:

    checkpoint save 2 in the writer: waited 0.00 s for it, received it in 0.01 s, copied 1342 MiB to
    host in 0.05 s (new pinned buffers: 0, 0 MiB in 0.00 s), wrote it in 2.10 s

and a checksummed save (below) adds ", checksums of N files (M MiB) in C s".

"waited" is the time between the trainer handing the request over and the writer starting on it: the
writer still starting up (D31), an earlier request still running, or the trainer's pickling.
``rehearsal`` is the request that runs a save's copy after the first step, so that the first real save
finds the writer's pinned buffers made (D30). The timing classes run in the writer process and log
through the stage's own logging set-up.

Checksums. ``checksummed`` wraps a request's write so that, right after writing, it records the size and
CRC-32 of the files it wrote (``checksums.record``): in the writer process for an asynchronous save, where
training does not wait for it, and before the save's finalization, which commits the checkpoint. A
synchronous save runs the same request in place (gpu.py), so both kinds record their checksums alike.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest
from megatron.core.dist_checkpointing.strategies.filesystem_async import get_write_results_queue

from mcx.weights import checksums
from mcx.train.worklog import start_logging

MIB = 1024 ** 2
log = logging.getLogger("mcx.train.writer")
_logging_to: Path | None = None  # the stage directory this writer process logs to
_results_warm_up: threading.Thread | None = None  # trainer side: the results queue's first round trip


def start(rank: int, persistent: bool) -> None:
    """Start what checkpoint saves use, once per process: the persistent writer (``persistent``, for
    asynchronous saves) and the results queue, with its warm-up round trip in a thread."""
    global _results_warm_up
    if persistent:
        AsyncCallsQueue.warmup_persistent_caller(rank)  # a no-op when it runs already
    if _results_warm_up is None:
        _results_warm_up = threading.Thread(target=_warm_up, args=(get_write_results_queue(),),
                                            name="mcx-checkpoint-results", daemon=True)
        _results_warm_up.start()


def _warm_up(results_queue: Any) -> None:
    """One write result through MCore's results queue and back: the Manager process imports torch's
    checkpoint types now rather than during the first save."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.storage import WriteResult

    t0 = time.monotonic()
    try:
        results_queue.put({0: [WriteResult(index=MetadataIndex("mcx.warm_up"), size_in_bytes=0, storage_data=None)]})
        results_queue.get()
    except Exception as exc:  # the first save then pays the import, as without the warm-up
        log.warning("the checkpoint results queue did not warm up (%s: %s)", type(exc).__name__, exc)
    else:
        log.info("checkpoint results queue ready %.2f s after the start", time.monotonic() - t0)


def results_queue_ready() -> None:
    """Wait for the results queue's warm-up round trip to end (at once, unless a save comes within
    seconds of the start): until then, a save's results could be taken for the warm-up's."""
    if _results_warm_up is not None:
        _results_warm_up.join()


class _Stamp:
    """Unpickles as the time it was unpickled: the writer starting on a request (it is the first
    thing in the request's pickle, before the tensors' IPC handles)."""

    def __reduce__(self):
        return time.monotonic, ()


def _pinned() -> tuple[int, float, int]:
    """The writer's pinned host memory so far: buffers created, seconds spent creating them, bytes."""
    stats = torch.cuda.host_memory_stats()
    return (int(stats.get("num_host_alloc", 0)), stats.get("host_alloc_time.total", 0) / 1e6,
            int(stats.get("allocated_bytes.allocated", 0)))


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in MCore's write buckets (nested lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    return sum(_nbytes(o) for o in obj) if isinstance(obj, (list, tuple)) else 0


class TimedCopy:
    """A request's ``preload_fn`` (the copy to host memory), timed, with the pinned buffers it created.
    The request's ``TimedWrite`` holds the same object (one pickle keeps them one) and reads ``figures``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.figures: dict[str, float] | None = None

    def __call__(self) -> Any:
        start, before = time.monotonic(), _pinned()
        out = self.fn()
        after = _pinned()
        self.figures = dict(start=start, seconds=time.monotonic() - start, mib=_nbytes(out) / MIB,
                            new=after[0] - before[0], new_seconds=after[1] - before[1],
                            new_mib=(after[2] - before[2]) / MIB)
        return out


class TimedWrite:
    """A request's ``async_fn`` (the write), timed; it then logs the whole save's line."""

    def __init__(self, fn: Callable[..., Any], save: int, stage_dir: Path, rank: int, copy: TimedCopy | None) -> None:
        self.received = _Stamp()  # first attribute: unpickled first
        self.sent = time.monotonic()
        self.fn, self.save, self.stage_dir, self.rank, self.copy = fn, save, stage_dir, rank, copy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = self.fn(*args, **kwargs)
        self._log(time.monotonic() - start)
        return out

    def _log(self, write_seconds: float) -> None:
        global _logging_to
        if _logging_to != self.stage_dir:
            start_logging(self.stage_dir, self.rank)  # the worker's own log format and levels
            _logging_to = self.stage_dir
        began = self.received if isinstance(self.received, float) else self.sent  # a _Stamp if never pickled
        c = self.copy.figures if self.copy is not None else None
        copy = (f"copied {c['mib']:.0f} MiB to host in {c['seconds']:.2f} s (new pinned buffers: "
                f"{c['new']:.0f}, {c['new_mib']:.0f} MiB in {c['new_seconds']:.2f} s), ") if c else ""
        s = getattr(self.fn, "figures", None)  # a SummedWrite's checksums, taken within write_seconds
        summed = (f", checksums of {s['files']:.0f} file{'s' if s['files'] != 1 else ''} ({s['bytes'] / MIB:.0f} MiB) "
                  f"in {s['seconds']:.2f} s") if s else ""
        what, wrote = (f"checkpoint save {self.save}", f"wrote it in {write_seconds - (s['seconds'] if s else 0):.2f} s"
                       f"{summed}") if self.save else ("the rehearsed copy (D30)", "kept nothing")
        log.info("%s in the writer: waited %.2f s for it, received it in %.2f s, %s%s", what,
                 max(0.0, began - self.sent), max(0.0, (c["start"] if c else began) - began), copy, wrote)


class SummedWrite:
    """A request's ``async_fn`` (the write), then the checksums of the files it wrote. MCore's write
    function takes (rank, write buckets, results queue), each bucket starting with its file's path."""

    def __init__(self, fn: Callable[..., Any], directory: Path, rank: int) -> None:
        self.fn, self.directory, self.rank = fn, directory, rank
        self.figures: dict[str, float] | None = None  # checksums.record's, once written

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        self.figures = checksums.record(self.directory, self.rank, [bucket[0] for bucket in args[1]])
        return out


def checksummed(request: AsyncRequest, directory: Path, rank: int) -> AsyncRequest:
    """``request`` (an MCore ``AsyncRequest``) recording the checksums of what it writes (D36)."""
    if request.async_fn is None:  # this rank writes nothing
        return request
    return request._replace(async_fn=SummedWrite(request.async_fn, directory, rank))


def timed(request: AsyncRequest, save: int, stage_dir: Path, rank: int) -> AsyncRequest:
    """``request`` (an MCore ``AsyncRequest``) with its copy and write timed in the writer."""
    copy = TimedCopy(request.preload_fn) if request.preload_fn is not None else None
    return request._replace(async_fn=TimedWrite(request.async_fn, save, stage_dir, rank, copy), preload_fn=copy)


def rehearsal(preload_fn: Callable[[], Any], stage_dir: Path, rank: int) -> AsyncRequest:
    """A request that runs a save's copy to host memory (``preload_fn``) as its write, so training does
    not wait for it, and keeps nothing (D30): the writer's pinned buffers are made for the saves to come."""
    copy = TimedCopy(preload_fn)
    return AsyncRequest(TimedWrite(_rehearse, 0, stage_dir, rank, copy), (copy,), [])


def _rehearse(copy: TimedCopy) -> None:
    copy()
