"""`mcx run --detach`: the run's chain (smoke stage, checks, full stage, records) in a supervisor process of its
own, so that it goes on when the terminal that started it is gone (D64).

The command checks everything a run checks before it writes anything (spec, plan, budget, run cache, data,
launcher), then starts the supervisor (``python -m mcx.cli.supervisor``) in a new session, its stdin closed and
its output in the run directory's ``supervisor.log``, and waits on a pipe until the supervisor has started the
first stage's workers (submitted its Slurm job); it returns the run ID and the job. The supervisor takes the run's
lock and runs the same `mcx run` chain; `mcx status`, `logs` and `cancel` read what it and the workers write.
A supervisor that ends before it starts a stage (the run cache, a job sbatch refuses) sends its result or error
back through the pipe, and the command answers with it as `mcx run` would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import McxError

SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_MODULE = "mcx.cli.supervisor"


@frozen(kw_only=True)
class DetachedJob:
    stage: str
    kind: str  # launch.kind
    job_id: str | None  # Slurm's job ID; the launcher's process ID for local and torchrun
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "kind": self.kind, "job_id": self.job_id, "log": self.log}


@frozen(kw_only=True)
class Detached:
    """What `mcx run --detach` returns once the first stage is started; ``to_dict()`` is its `--json`."""

    run_id: str
    run_dir: str
    jobs: tuple[DetachedJob, ...]
    supervisor_pid: int
    log: str  # the supervisor's output
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "detached": True, "run_dir": self.run_dir,
                "jobs": [j.to_dict() for j in self.jobs],
                "supervisor": {"pid": self.supervisor_pid, "log": self.log}}


class SupervisorEnded(McxError):
    """The supervisor ended with an error before it started a stage; ``exit_code`` is the one it had."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


@frozen(kw_only=True)
class Request:
    """What the supervisor runs: ``mcx run SPEC OVERRIDES`` with these options, which must give ``run_id``."""

    spec: str
    overrides: tuple[str, ...]
    project: str
    run_id: str
    stage: str
    force: bool
    skip_smoke: bool
    verify_data: bool
    profile: str | None = None  # --profile's steps, as given

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "overrides": list(self.overrides), "project": self.project, "run_id": self.run_id,
                "stage": self.stage, "force": self.force, "skip_smoke": self.skip_smoke,
                "verify_data": self.verify_data, "profile": self.profile}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        return cls(spec=str(d["spec"]), overrides=tuple(map(str, d["overrides"])), project=str(d["project"]),
                   run_id=str(d["run_id"]), stage=str(d["stage"]), force=bool(d["force"]),
                   skip_smoke=bool(d["skip_smoke"]), verify_data=bool(d["verify_data"]),
                   profile=None if d.get("profile") is None else str(d["profile"]))


def start_supervisor(request: Request, run_path: Path) -> dict[str, Any] | None:
    """Start the supervisor and wait for its first word, which names its process (``pid``) and says
    ``launched`` (the first stage's job), ``ended`` (its result) or ``error`` (None: it died without one)."""
    run_path.mkdir(parents=True, exist_ok=True)
    log = run_path / SUPERVISOR_LOG
    read_end, write_end = os.pipe()
    try:
        with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(write_end), json.dumps(request.to_dict())],
                stdin=devnull, stdout=out, stderr=subprocess.STDOUT, pass_fds=(write_end,),
                start_new_session=True,  # no terminal's hangup or Ctrl-C reaches it
            )
    except OSError as exc:
        os.close(read_end)
        raise McxError(f"cannot start the supervisor ({sys.executable} -m {SUPERVISOR_MODULE}): {exc}") from None
    finally:
        os.close(write_end)
    proc.wait()  # the supervisor forks at once (mcx.cli.supervisor): its child, reparented to init, runs the chain
    with os.fdopen(read_end, "r", encoding="utf-8") as pipe:
        line = pipe.readline()
    try:
        message = json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        message = None
    return message if isinstance(message, dict) else None
