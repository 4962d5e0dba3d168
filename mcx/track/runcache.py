"""The run cache: is a run ID already trained, training elsewhere, interrupted, or new?

A run ID names its inputs (mcx.fingerprint), so a finished run is never trained twice: ``mcx run``
looks the ID up first. The answer comes from the run directory (``run.json`` and the lock), or,
when the directory is gone and the tracking store is shared, from the run's MLflow record.

The lock is ``fcntl.flock`` on ``.mcx/runs/<id>/lock``, holding ``{"pid", "host", "started"}`` of
the holder. The kernel drops a flock when its process dies, however it dies, so a stale lock (its
recorded pid is dead) is simply taken over, and the new holder reports whose it was. The file
descriptor is not inherited by the worker (Python opens files non-inheritable), so a worker that
outlives its control plane does not keep the ID locked. On shared filesystems, flock is as good as
the filesystem's lock support (NFSv4, Lustre mounted with ``flock``); without it, locking raises
EnvironmentProblem rather than letting two trainings race.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Literal

from attrs import frozen

from mcx.contract.status import Status
from mcx.errors import EnvironmentProblem
from mcx.track import paths
from mcx.track.errors import RunLocked, TrackingUnavailable
from mcx.track.holder import LockHolder
from mcx.track.mlflow_store import MlflowStore
from mcx.track.target import describe_error, is_transient, resolve_target

LOCK_FILE = "lock"
RUN_FILE = "run.json"
WAIT_POLL_S = 0.5
HOLDER_WRITE_S = 1.0  # how long a just-taken lock may show an empty holder record (taken, not yet written)
State = Literal["finished", "running", "interrupted", "absent"]
FINISHED_STATUSES = frozenset({Status.FINISHED})


@frozen
class RunState:
    """What is known about a run ID before training it.

    ``state``: "finished" (a complete run exists: reuse it), "running" (another process holds the
    lock: ``holder`` says who), "interrupted" (a run directory without a finished run.json and
    without a live holder: resume it), "absent" (never run here nor recorded in the store).
    ``source``: where that was learnt, "local" or "tracking"; ``mlflow_run`` is the parent run's
    MLflow ID when the store was asked.
    """

    run_id: str
    state: State
    run_dir: Path
    status: str | None = None  # run.json's (or the record's mcx.status tag) verbatim
    holder: LockHolder | None = None
    source: Literal["local", "tracking"] = "local"
    mlflow_run: str | None = None


def _read_holder(path: Path) -> LockHolder | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8") or "null")
        return LockHolder(int(data["pid"]), str(data["host"]), float(data["started"]))
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None


def _flock(fd: int, flags: int, path: Path) -> bool:
    """True if locked; False if someone else holds it (non-blocking); raises when flock is unsupported."""
    try:
        fcntl.flock(fd, flags)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise EnvironmentProblem(
                f"the filesystem of {path} does not support file locks ({exc.strerror})",
                "keep the project's .mcx/ on a filesystem with flock support (local disk, NFSv4, "
                "Lustre mounted with -o flock).",
            ) from None
        raise


class RunLock:
    """The exclusive right to train one run ID; release it with ``release()`` or ``with``."""

    def __init__(self, run_dir: Path, fd: int, holder: LockHolder, took_over: LockHolder | None) -> None:
        self.run_dir = run_dir
        self.holder = holder
        self.took_over = took_over  # the stale holder this lock replaced, if any
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _settled_holder(path: Path, within_s: float = HOLDER_WRITE_S) -> LockHolder | None:
    """The holder of a lock just found taken. A new holder writes its record right after taking the
    lock: an empty record is read again for a moment rather than reported as "another process"."""
    end = time.monotonic() + within_s
    while (holder := _read_holder(path)) is None and time.monotonic() < end:
        time.sleep(0.01)
    return holder


def acquire(run_dir: Path, *, wait: bool = False, timeout: float | None = None) -> RunLock:
    """Take the run's lock, or raise RunLocked naming the holder.

    ``wait=True`` blocks until the holder is done (or ``timeout`` seconds pass, then RunLocked);
    the caller should then look the run up again: it is usually finished by then.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path):
            if not wait or (deadline is not None and time.monotonic() >= deadline):
                raise RunLocked(run_dir.name, _settled_holder(path))
            time.sleep(WAIT_POLL_S)
    except BaseException:
        os.close(fd)
        raise
    previous = _read_holder(path)
    holder = LockHolder(os.getpid(), socket.gethostname(), time.time())
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": holder.pid, "host": holder.host, "started": holder.started}).encode(), 0)
    os.fsync(fd)
    return RunLock(run_dir, fd, holder, previous)


def holder_of(run_dir: Path) -> LockHolder | None:
    """Who holds the run's lock now (None: nobody). Never blocks, never takes the lock for long."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if _flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _read_holder(path) or LockHolder(-1, "unknown", 0.0)
    finally:
        os.close(fd)


def lookup(project_root: Path, run_id: str, *, tracking_uri: str | None = None, ask_tracking: bool = False) -> RunState:
    """The state of ``run_id`` in this project; with ``ask_tracking``, also its MLflow record.

    The store is asked only when the run directory does not say "finished" or "running" (a project
    whose .mcx/ was cleaned, or a colleague's run on a shared server).
    """
    run_path = paths.run_dir(project_root, run_id)
    holder = holder_of(run_path)
    status = None
    run_json = paths.read_json(run_path / RUN_FILE)
    if isinstance(run_json, dict):
        status = run_json.get("status")
    if holder is not None:
        return RunState(run_id, "running", run_path, status, holder)
    if status in FINISHED_STATUSES:
        return RunState(run_id, "finished", run_path, status)
    if ask_tracking:
        found = _lookup_tracking(project_root, run_id, tracking_uri)
        if found is not None:
            uuid, tag_status = found
            if tag_status in FINISHED_STATUSES:
                return RunState(run_id, "finished", run_path, tag_status, source="tracking", mlflow_run=uuid)
            if not run_path.exists():
                return RunState(run_id, "interrupted", run_path, tag_status, source="tracking", mlflow_run=uuid)
    if run_path.exists():
        return RunState(run_id, "interrupted", run_path, status)
    return RunState(run_id, "absent", run_path)


def _lookup_tracking(project_root: Path, run_id: str, tracking_uri: str | None) -> tuple[str, str | None] | None:
    target = resolve_target(project_root, tracking_uri)
    try:
        run = MlflowStore(target).find_parent_run(run_id)
    except Exception as exc:
        if is_transient(exc):
            raise TrackingUnavailable(f"cannot reach the tracking store {target.name}: {describe_error(exc)}",
                                      "start it (or unset MLFLOW_TRACKING_URI), or look up locally only.") from None
        raise
    if run is None:
        return None
    return run.info.run_id, run.data.tags.get("mcx.status")
