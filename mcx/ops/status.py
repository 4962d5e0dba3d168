"""`mcx status [RUN_ID]`: where a run is now (queue state, stage, step, loss, tokens/s, ETA, last checkpoint),
read from its run directory (run.json, the lock, each stage's launch.json, metrics.jsonl, checkpoints) and,
for a Slurm job, from the controller. Without a run ID: every run of the project still running or queued.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.contract.checkpoints import checkpoint_root, latest_checkpoint
from mcx.contract.files import JOB_FILE, METRICS_FILE, RESULT_FILE
from mcx.contract.status import Status
from mcx.errors import EnvironmentProblem, RunIdError
from mcx.jsonfile import read_json
from mcx.launch.slurm import query_job
from mcx.metrics.curves import tail_records
from mcx.metrics.ranks import SlowestRank, slowest_rank
from mcx.ops.launch_record import LaunchRecord, read_launch
from mcx.track import paths
from mcx.track.holder import pid_alive
from mcx.track.paths import check_run_id
from mcx.track.runcache import holder_of

STAGE_ORDER = ("smoke", "full")
TAIL_BYTES = 64 * 1024  # of metrics.jsonl: the last steps, however long the run
ETA_STEPS = 20  # the recent steps whose median step time the ETA assumes


@frozen(kw_only=True)
class StageNow:
    """One stage as it stands: its job, how far it trained, and what it saved."""

    stage: str
    kind: str | None  # launch.kind
    job_id: str | None
    queue: str  # Slurm's JobState (PENDING, RUNNING, ...); for local and torchrun "RUNNING" or "EXITED"; "unknown"
    reason: str | None  # why a Slurm job pends
    status: str | None  # result.json's status once the worker wrote it
    step: int | None
    train_iters: int | None
    loss: float | None
    tokens_per_s: float | None  # every rank's: tokens_per_s_per_gpu x world size
    step_time_s: float | None  # median of the last ETA_STEPS steps
    eta_s: float | None
    last_checkpoint: str | None
    slowest_rank: SlowestRank | None = None  # the slowest rank, where an outlier of the ranks' step times (D66)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "kind": self.kind, "job_id": self.job_id, "queue": self.queue,
                "reason": self.reason, "status": self.status, "step": self.step, "train_iters": self.train_iters,
                "loss": self.loss, "tokens_per_s": self.tokens_per_s, "step_time_s": self.step_time_s,
                "eta_s": self.eta_s, "last_checkpoint": self.last_checkpoint,
                "slowest_rank": None if self.slowest_rank is None else self.slowest_rank.to_dict()}


@frozen(kw_only=True)
class RunNow:
    """A run as `mcx status` shows it. ``state``: "queued" (its job waits for the cluster), "running",
    "stalled" (run.json says running but no supervisor holds the run: `mcx run` of the spec picks it up), or
    run.json's status once it ended (finished, failed, interrupted, ...)."""

    run_id: str
    name: str | None
    state: str
    supervisor: dict[str, Any] | None  # {"pid", "host"} of the process that holds the run's lock
    stage: StageNow | None  # the stage being trained (the last one started)
    stages: tuple[StageNow, ...]
    run_dir: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "state": self.state, "supervisor": self.supervisor,
                "stage": None if self.stage is None else self.stage.stage,
                "stages": {s.stage: s.to_dict() for s in self.stages}, "run_dir": self.run_dir}

    @property
    def active(self) -> bool:
        return self.state in (Status.QUEUED, Status.RUNNING, "stalled")


def run_status(project: Path, run_id: str | None = None) -> tuple[RunNow, ...]:
    """``run_id``'s state (RunIdError when this project has no such run); None: every active run, newest first."""
    if run_id is not None:
        rdir = paths.run_dir(project, check_run_id(run_id))
        if not (rdir / "run.json").is_file():
            raise RunIdError(f"no run {run_id} in this project (no {rdir / 'run.json'});",
                             "`mcx status` lists the running and queued runs, `mcx ls` every run.")
        return (status_of(rdir),)
    root = project / ".mcx" / "runs"
    found = [status_of(d) for d in (root.iterdir() if root.is_dir() else ()) if (d / "run.json").is_file()]
    active = [r for r in found if r.active]
    return tuple(sorted(active, key=lambda r: _started(Path(r.run_dir)), reverse=True))


def _started(rdir: Path) -> float:
    started = (read_json(rdir / "run.json") or {}).get("started")
    return float(started) if isinstance(started, (int, float)) else 0.0


def status_of(rdir: Path) -> RunNow:
    run_json = read_json(rdir / "run.json") or {}
    holder = holder_of(rdir)
    stages = tuple(_stage(rdir / s) for s in _stage_names(rdir, run_json))
    current = next((s for s in reversed(stages) if s.kind is not None), None)
    status = str(run_json.get("status") or "unknown")
    if status == "running":
        if holder is None:
            state = "stalled"
        elif current is not None and current.queue in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD"):
            state = Status.QUEUED
        else:
            state = "running"
    else:
        state = status
    supervisor = None if holder is None else {"pid": holder.pid, "host": holder.host}
    return RunNow(run_id=rdir.name, name=run_json.get("name"), state=state, supervisor=supervisor, stage=current,
                  stages=stages, run_dir=str(rdir))


def _stage_names(rdir: Path, run_json: dict[str, Any]) -> list[str]:
    planned = run_json.get("stages_planned")
    names = [s for s in planned if isinstance(s, str)] if isinstance(planned, list) else []
    return [s for s in STAGE_ORDER if s in names or (rdir / s / JOB_FILE).is_file()]


def _stage(stage_path: Path) -> StageNow:
    launch = read_launch(stage_path)
    result = read_json(stage_path / RESULT_FILE)
    status = result.get("status") if isinstance(result, dict) else None
    queue, reason = _queue(launch, finished=status is not None)
    job = _obj(read_json(stage_path / JOB_FILE))
    train_iters = _obj(_obj(job.get("spec")).get("train")).get("train_iters")
    world = _obj(job.get("layout")).get("world_size")
    steps = [r for r in tail_records(stage_path / METRICS_FILE, TAIL_BYTES) if r.get("kind") == "train"]
    last = steps[-1] if steps else {}
    times = [float(r["step_time_s"]) for r in steps[-ETA_STEPS:] if isinstance(r.get("step_time_s"), (int, float))]
    step_time = statistics.median(times) if times else None
    step = last.get("step") if isinstance(last.get("step"), int) else None
    per_gpu = last.get("tokens_per_s_per_gpu")
    tokens = float(per_gpu) * int(world) if isinstance(per_gpu, (int, float)) and isinstance(world, int) else None
    eta = None
    if status is None and step is not None and step_time is not None and isinstance(train_iters, int):
        eta = max(0, train_iters - step) * step_time
    latest = latest_checkpoint(stage_path)
    loss = last.get("loss")
    slowest = slowest_rank(stage_path)
    return StageNow(stage=stage_path.name, kind=None if launch is None else launch.kind,
                    job_id=None if launch is None else launch.job_id, queue=queue, reason=reason, status=status,
                    step=step, train_iters=train_iters if isinstance(train_iters, int) else None,
                    loss=float(loss) if isinstance(loss, (int, float)) else None, tokens_per_s=tokens,
                    step_time_s=step_time, eta_s=eta,
                    last_checkpoint=None if latest is None else str(checkpoint_root(stage_path) / latest),
                    slowest_rank=slowest if slowest is not None and slowest.outlier else None)


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _queue(launch: LaunchRecord | None, *, finished: bool) -> tuple[str, str | None]:
    if launch is None or launch.job_id is None:
        return ("NOT_STARTED" if launch is None else "unknown"), None
    if launch.kind == "slurm":

        try:
            info = query_job(launch.job_id)
        except EnvironmentProblem:  # no Slurm commands here, or the controller does not answer
            return "unknown", None
        if info is None:  # past the cluster's MinJobAge: what the worker wrote says how it ended
            return ("ENDED" if finished else "UNKNOWN_TO_SLURM"), None
        return info.state, (None if info.reason in ("None", "") else info.reason)
    return ("RUNNING" if pid_alive(int(launch.job_id)) else "EXITED"), None
