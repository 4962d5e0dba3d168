"""`mcx cancel RUN_ID`: stop a running or queued run, keeping a checkpoint, resumable by `mcx run` of its spec.

A Slurm job is cancelled with scancel: Slurm sends SIGTERM to every process and SIGKILL after the cluster's
KillWait, and the workers save a checkpoint in between (docs/runs.md). A local or torchrun stage is stopped
through its supervisor, which passes SIGTERM on to its workers as `mcx run` does for Ctrl-C. ``cancel.json``
in the run directory tells the run's supervisor that the stop is the user's: the stage and the run end
"interrupted" (D47), not "preempted". The command returns once the supervisor has recorded the end.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import EnvironmentProblem, InputError
from mcx.jsonfile import read_json, write_json_atomic
from mcx.launch.slurm import SlurmHandle
from mcx.ops.status import RunNow, run_status, status_of
from mcx.track.runcache import holder_of

CANCEL_FILE = "cancel.json"
SETTLE_S = 300.0  # how long cancel waits for the supervisor to record the end (Slurm's KillWait is 30 s by default)
POLL_S = 0.5


@frozen(kw_only=True)
class Cancelled:
    """What `mcx cancel` did: the jobs it stopped and what the run kept."""

    run_id: str
    stopped: tuple[dict[str, Any], ...]  # {"stage", "kind", "job_id"}
    state: str  # the run's state afterwards (interrupted, or still "stalled" without a supervisor to record it)
    last_checkpoint: str | None
    settled: bool  # the supervisor recorded the end within SETTLE_S

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "stopped": list(self.stopped), "state": self.state,
                "last_checkpoint": self.last_checkpoint, "settled": self.settled}


def cancel_requested(run_path: Path) -> bool:
    """Whether `mcx cancel` asked this run to stop (read by the supervisor when its stage ends)."""
    return isinstance(read_json(run_path / CANCEL_FILE), dict)


def clear_cancel(run_path: Path) -> None:
    (run_path / CANCEL_FILE).unlink(missing_ok=True)


def cancel_run(project: Path, run_id: str, *, settle_s: float = SETTLE_S) -> Cancelled:
    (now,) = run_status(project, run_id)
    if not now.active:
        raise InputError(f"run {run_id} is not running or queued (it is {now.state}); nothing to cancel;",
                         "`mcx status` lists the active runs.")
    rdir = Path(now.run_dir)
    stage = now.stage
    write_json_atomic(rdir / CANCEL_FILE, {"by": "mcx cancel", "time": time.time(), "pid": os.getpid()})
    stopped: list[dict[str, Any]] = []
    if stage is not None and stage.kind == "slurm" and stage.job_id is not None and stage.status is None:

        SlurmHandle(stage.job_id, rdir / stage.stage).cancel()
        stopped.append({"stage": stage.stage, "kind": "slurm", "job_id": stage.job_id})
    elif now.supervisor is not None:  # local, torchrun, or between stages: the supervisor stops its workers
        _signal_supervisor(now)
        if stage is not None:
            stopped.append({"stage": stage.stage, "kind": stage.kind, "job_id": stage.job_id})
    settled = _settle(rdir, settle_s) if now.supervisor is not None else False
    after = status_of(rdir)
    current = after.stage or stage
    return Cancelled(run_id=run_id, stopped=tuple(stopped), state=after.state, settled=settled,
                     last_checkpoint=None if current is None else current.last_checkpoint)


def _signal_supervisor(now: RunNow) -> None:
    assert now.supervisor is not None
    pid, host = int(now.supervisor["pid"]), str(now.supervisor["host"])
    if host != socket.gethostname():
        raise EnvironmentProblem(f"run {now.run_id} is supervised on {host}, not here;",
                                 f"run `mcx cancel {now.run_id}` on {host}.")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _settle(rdir: Path, within_s: float) -> bool:
    """Wait for the run's supervisor to let go of the run (it recorded the end)."""
    deadline = time.monotonic() + within_s
    while holder_of(rdir) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
