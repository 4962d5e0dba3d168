"""One stage of `mcx run`: its job file, its launch, what the worker left (result, checkpoint), and what
the control plane adds (the checkpoint in DVC, the memory prediction, the explanation of a failure)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from mcx.contract.checkpoints import latest_checkpoint
from mcx.contract.files import CHECKPOINTS_DIR, HANGS_DIR, JOB_FILE, RESULT_FILE
from mcx.contract.job import INIT_KINDS, Checks, InitFrom, Job, Output, job_to_dict
from mcx.contract.profile import ProfileSteps
from mcx.contract.result import StageResult, clear_result, read_result, read_stage_result
from mcx.contract.status import Status
from mcx.data import mixture
from mcx.data.dataset import smoke_samples_limit
from mcx.errors import InputError, McxError
from mcx.jsonfile import read_json, write_json_atomic
from mcx.launch import launcher_for, placement, worker_env
from mcx.launch.slurm import SLURM_STATES, SlurmHandle, query_job
from mcx.ops.data import data_versions
from mcx.ops.plan import PlanResult
from mcx.ops.cancel import cancel_requested
from mcx.ops.launch_record import read_launch, record_launch
from mcx.ops.progress import Launched, Note, Progress
from mcx.plan.memory import memory_fixes, oom_advice
from mcx.plan.planner import Plan, StagePlan
from mcx.spec import ExperimentSpec
from mcx.track import paths
from mcx.track.dvc_store import track_checkpoint
from mcx.track.share import configured_remotes, share_hint

if TYPE_CHECKING:
    from mcx.launch.base import Handle, LaunchOutcome
    from mcx.track.recorder import RunRecorder

WATCH_S = 2.0  # how often a watched stage is asked about


@frozen
class Stop:
    """What a watch returns to end a stage early: the workers save a checkpoint and stop, and the stage and
    its run end with ``status`` (PRUNED: a sweep's pruner; INTERRUPTED: the sweep was interrupted)."""

    status: Status
    detail: str


Watch = Callable[[str, Path], "Stop | None"]  # (stage, stage directory) -> Stop to end it, None to go on


def stage_job(sp: StagePlan, planned: PlanResult, stage_path: Path, data_dir: Path, output: Output,
              profile: ProfileSteps | None = None) -> Job:
    """The planned stage's job contract; ``job_to_dict`` gives job.json. ``profile``: the full stage's steps to
    profile (`mcx run --profile`); the smoke stage is never profiled."""
    stage, run_id = sp.stage, _run_id(planned)
    limit = smoke_limit(planned, data_dir) if stage == "smoke" else None
    ckpt = Path(planned.spec.checkpoint.dir) / run_id / stage if planned.spec.checkpoint.dir else stage_path / CHECKPOINTS_DIR
    sm = planned.spec.smoke
    return Job(run_id=run_id, stage=stage, spec=sp.spec, layout=sp.layout, data_dir=str(data_dir.resolve()),
               checkpoint_dir=str(ckpt.resolve()), train_samples_limit=limit,
               checks=Checks(resume_check_iters=sm.resume_check_iters, loss_window=sm.loss_window,
                             min_loss_drop=sm.min_loss_drop),
               device=sp.device, output=output,
               init=_init(stage, planned), profile=profile if stage == "full" else None)


def _run_id(planned: PlanResult) -> str:
    assert planned.run_id is not None, "a stage runs only where its data is, so its run ID is known"
    return planned.run_id


def _init(stage: str, planned: PlanResult) -> InitFrom | None:
    """The full stage's source of weights ([init] from, as the fingerprint resolved it); None: random."""
    source = planned.record.init
    if stage != "full" or source is None:
        return None
    init = planned.spec.init
    kind = next((k for k in INIT_KINDS if k == source.kind), None)
    if kind is None:  # the fingerprint resolved [init] from; a record naming another kind is damaged
        raise InputError(f"the fingerprint's init component names {source.kind!r}, not one of {', '.join(INIT_KINDS)};",
                         "plan the spec again.")
    return InitFrom(kind=kind, path=source.path, format=source.format,
                    load_optimizer=init.load_optimizer, reset_step=init.reset_step)


def smoke_limit(planned: PlanResult, data_dir: Path) -> int:
    """The smoke stage's ``train_samples_limit``; DataError when the train split holds no sample."""
    job_spec = planned.plan.stage("smoke").spec
    if job_spec.data.path is None:  # a mixture: data_dir is where its components' paths start (D60)
        return mixture.smoke_limit(job_spec.data, data_dir, job_spec.model.seq_length, planned.spec.smoke.data_fraction)
    return smoke_samples_limit(data_dir, job_spec.data.split, job_spec.model.seq_length, planned.spec.smoke.data_fraction,
                               job_spec.data.prefix)


def run_stage(stage: str, planned: PlanResult, *, project: Path, run_path: Path, data_dir: Path, recorder: RunRecorder,
               output: Output, progress: Progress, code_path: Path | None = None, watch: Watch | None = None,
               devices: tuple[str, ...] | None = None, reproduction: bool = False,
               profile: ProfileSteps | None = None) -> StageResult:
    stage_path = run_path / stage
    prior = read_stage_result(stage_path)
    if prior and prior.ok:
        progress(Note(lead=f"{stage} stage", text=f" already finished in {stage_path}; reusing it"))
        return prior
    sp = planned.plan.stage(stage)
    job_spec, job_layout = sp.spec, sp.layout
    stage_path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stage_path / JOB_FILE, job_to_dict(stage_job(sp, planned, stage_path, data_dir, output, profile)))
    resume = latest_checkpoint(stage_path)
    clear_result(stage_path)
    progress(Note(lead=f"{stage} stage", text=f": {job_spec.model.num_layers} layers, hidden {job_spec.model.hidden_size}, "
                  f"seq {job_spec.model.seq_length}, {job_spec.train.train_iters} steps, layout "
                  f"TP{job_layout.tp} PP{job_layout.pp} CP{job_layout.cp} EP{job_layout.ep} DP{job_layout.dp} "
                  f"({job_spec.launch.kind})" + (f"; resuming from {resume}" if resume else "")))
    recorder.start_stage(stage)
    hangs_before = _hangs(stage_path)
    launcher = launcher_for(job_spec.launch)
    try:
        with recorder.forwarder(stage):
            env = worker_env(job_spec)
            if devices is not None and job_spec.launch.kind != "slurm":
                env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(devices)}
            if code_path is not None:  # a reproduction: the worker imports the recorded mcx first
                path = [str(code_path), *filter(None, [os.environ.get("PYTHONPATH")])]
                env = {**env, "PYTHONPATH": os.pathsep.join(path)}
            predicted = planned.plan.cost.step_time_s if stage == "full" else None  # the watchdog's reference
            handle = _still_queued(stage_path, job_spec, progress) or launcher.start(
                stage_path, placement(job_layout, sp.device, predicted), job_spec.launch, env)
            log = getattr(handle, "log", None)
            record_launch(stage_path, job_spec.launch.kind, handle.job_id, log)
            progress(Launched(stage=stage, kind=job_spec.launch.kind, job_id=handle.job_id,
                              log=None if log is None else str(log)))
            forwarding = getattr(handle, "forwarding_signals", None)
            if forwarding is not None:
                with forwarding():
                    outcome, stopped = _wait(handle, watch, stage, stage_path)
            else:
                outcome, stopped = _wait(handle, watch, stage, stage_path)
    except BaseException:  # not started (sbatch refused it...) or interrupted: the stage's record ends too
        recorder.finish_stage(stage)
        raise
    hangs = sorted(_hangs(stage_path) - hangs_before)
    for name in hangs:  # the watchdog ended a hung attempt (mcx.launch.watchdog); a restart resumed it, or none was left
        progress(Note(level="warning", text=f"{stage} stage: no progress within the watchdog's bound: the attempt was "
                      f"ended, every rank's stacks are in {stage_path / HANGS_DIR / name}"))
    said = f"the worker wrote no result ({outcome.state}: {outcome.detail})"
    if hangs:
        said = (f"the stage hung {len(hangs)} time(s), more than launch.watchdog.max_restarts = "
                f"{job_spec.launch.watchdog.max_restarts} allows; the ranks' stacks are in {stage_path / HANGS_DIR}; "
                f"{said}")
    if not outcome.ok and cancel_requested(run_path):  # the user's stop (scancel, or SIGTERM forwarded), not a preemption
        outcome = evolve(outcome, interrupted_by="mcx cancel")
    result = read_stage_result(stage_path) or StageResult(status=Status.FAILED, passed=False, error=said)
    if stopped is not None and result.status != Status.FINISHED:  # it ended because it was asked to
        result = evolve(result, status=stopped.status, error=stopped.detail)
    if outcome.state not in ("finished", "failed") and result.status == Status.FINISHED and not outcome.interrupted_by:
        result = evolve(result, status=Status.FAILED, error=f"launch ended {outcome.state}: {outcome.detail}")
    if outcome.state == "preempted" and result.status != Status.PREEMPTED:
        result = evolve(result, status=Status.PREEMPTED, error=outcome.detail)
    for warning in result.warnings:  # e.g. a damaged checkpoint set aside (D36)
        progress(Note(level="warning", text=f"{stage} stage: {warning}"))
    checkpoint = None
    if result.status == Status.FINISHED and planned.spec.tracking.log_checkpoints:
        checkpoint = _track_checkpoint(project, stage_path, planned, progress)
    if stage == "smoke" and result.status == Status.FINISHED:
        result = evolve(result, control_checks={**result.control_checks,
                                                "memory_prediction": memory_prediction(planned.plan, result).to_dict()})
    if outcome.interrupted_by:  # the user stopped `mcx run` (Ctrl-C, SIGTERM): not a preemption, the run ends (D47)
        stopped_by_user = result.status != Status.FINISHED
        result = evolve(result, status=Status.INTERRUPTED,
                        error=_interruption(stage, stage_path, result, outcome.interrupted_by, rerun=reproduction))
        if stopped_by_user:
            _mark_interrupted(stage_path, result.error)
    recorder.finish_stage(stage, checkpoint=checkpoint)
    return result


def _hangs(stage_path: Path) -> set[str]:
    """The attempts the watchdog found hung (STAGE_DIR/hangs/<job>-<attempt>/)."""
    where = stage_path / HANGS_DIR
    return {p.name for p in where.iterdir()} if where.is_dir() else set()


def _still_queued(stage_path: Path, job_spec: ExperimentSpec, progress: Progress) -> Handle | None:
    """The stage's Slurm job when an earlier `mcx run` submitted it and it is still queued or running (that
    run's supervisor died, D64): followed, not submitted a second time. None: launch it."""
    record = read_launch(stage_path)
    if record is None or record.kind != "slurm" or job_spec.launch.kind != "slurm" or record.job_id is None:
        return None
    info = query_job(record.job_id)
    if info is None or SLURM_STATES.get(info.state, "running") not in ("pending", "running"):
        return None
    progress(Note(lead=f"{stage_path.name} stage", text=f": Slurm job {record.job_id} submitted earlier is "
                  f"{info.state}; following it"))
    return SlurmHandle(record.job_id, stage_path.resolve(), time_limit=job_spec.launch.slurm.time,
                       partition=job_spec.launch.slurm.partition)


def _mark_interrupted(stage_path: Path, error: str | None) -> None:
    """result.json says "interrupted" where the worker wrote "preempted" on the SIGTERM mcx forwarded for the user,
    so the stage's record (`mcx ls`, `mcx show`, MLflow) tells it from a scheduler's preemption; the worker's own
    view stays in ``details.stop_signal``."""
    written = read_result(stage_path)
    if written is not None:
        write_json_atomic(stage_path / RESULT_FILE, {**written, "status": Status.INTERRUPTED, "error": error}, allow_nan=True)


def _interruption(stage: str, stage_path: Path, result: StageResult, signal_name: str, *, rerun: bool = False) -> str:
    """One line: where the user's signal stopped the stage and how it goes on (``rerun``: a reproduction's,
    which `mcx reproduce` runs afresh)."""
    head = f"interrupted by {signal_name}: the {stage} stage"
    at = f" at step {result.steps}" if result.steps else ""
    if rerun:
        return f"{head} of the reproduction stopped{at}; `mcx reproduce` again reruns it from the start"
    if result.status == Status.FINISHED:
        return f"{head} finished as it was interrupted; the same `mcx run` command goes on from it"
    latest = latest_checkpoint(stage_path)
    if latest is None:
        return f"{head} stopped{at} before its first checkpoint; the same `mcx run` command starts it again"
    return f"{head} stopped{at} and is resumable from its checkpoint {latest}: the same `mcx run` command resumes it"


def _wait(handle: Handle, watch: Watch | None, stage: str, stage_path: Path) -> tuple[LaunchOutcome, Stop | None]:
    """The launch's outcome; with a watch, asked every WATCH_S seconds, and a Stop cancels the launch (the
    workers checkpoint and stop)."""
    if watch is None:
        return handle.wait(), None
    stopped = None
    while True:
        outcome = handle.wait(timeout=WATCH_S)
        if outcome.done:
            return outcome, stopped
        if stopped is None and (stopped := watch(stage, stage_path)) is not None:
            handle.cancel()


def _track_checkpoint(project: Path, stage_path: Path, planned: PlanResult, progress: Progress) -> dict[str, Any] | None:
    latest = latest_checkpoint(stage_path)
    if latest is None:
        return None
    ckpt_dir = Path(read_json(stage_path / JOB_FILE)["checkpoint_dir"]) / latest
    # The run's own stages get a pointer git can carry (.mcx/checkpoints/<id>/<stage>.dvc, D38);
    # a reproduction's checkpoints keep theirs beside them.
    run_id = _run_id(planned)
    own = stage_path.parent == paths.run_dir(project, run_id)
    pointer = paths.pointer_file(project, run_id, stage_path.name) if own else None
    meta = {"run_id": run_id, "stage": stage_path.name,
            "data": [v.to_dict() for v in data_versions(project, planned.spec.data, planned.record.data.id)]} if own else None
    try:
        tracked = track_checkpoint(project, ckpt_dir, remote=planned.spec.tracking.dvc_remote, dvc_file=pointer, meta=meta)
        if own:
            hint = share_hint(project, tracked, run_id, stage_path.name, configured_remotes(project))
            progress(Note(text=hint, copyable=True))
        return tracked.to_dict()
    except McxError as exc:
        progress(Note(level="warning", text=f"checkpoint not added to DVC: {exc}"))
        return None


@frozen(kw_only=True)
class MemoryPrediction:
    """The smoke stage's memory check: the full stage's peak per GPU predicted from the smoke stage's measurement.
    The figures are None where the device's memory is not comparable (CPU memory is not GPU memory)."""

    passed: bool
    detail: str
    measured_smoke_bytes: float | None = None  # as the worker's summary holds it
    planned_smoke_bytes: int | None = None
    planned_full_bytes: int | None = None
    predicted_full_bytes: float | None = None
    capacity_bytes: int | None = None  # the GPU's; None where the plan knows none

    def to_dict(self) -> dict[str, Any]:
        """As the smoke stage's control checks record it (only passed and detail where not comparable)."""
        if self.predicted_full_bytes is None:
            return {"passed": self.passed, "detail": self.detail}
        return {"passed": self.passed, "measured_smoke_bytes": self.measured_smoke_bytes,
                "planned_smoke_bytes": self.planned_smoke_bytes, "planned_full_bytes": self.planned_full_bytes,
                "predicted_full_bytes": self.predicted_full_bytes, "capacity_bytes": self.capacity_bytes,
                "detail": self.detail}


def memory_prediction(plan: Plan, smoke_result: StageResult) -> MemoryPrediction:
    """Full-model peak memory predicted from the smoke stage's measurement and the planner's model.

    The planner's error on the smoke model (measured - planned) is mostly what no model of
    parameters and activations holds (allocator rounding, library workspaces): it is carried over
    to the full model as a constant, rather than scaled with it.
    """
    measured = smoke_result.final.get("mem_peak_bytes")
    smoke_plan = None if plan.smoke is None else plan.smoke.memory.total
    full_plan = plan.memory.total
    on_cpu = smoke_result.details.get("device", smoke_result.extra.get("device")) == "cpu"
    if on_cpu or not measured or not smoke_plan or not full_plan:
        return MemoryPrediction(passed=True, detail="not comparable on this device (CPU memory is not GPU memory)")
    predicted = full_plan + (measured - smoke_plan)
    capacity = plan.memory.capacity
    fits = capacity is None or predicted <= capacity
    return MemoryPrediction(
        passed=bool(fits), measured_smoke_bytes=measured, planned_smoke_bytes=smoke_plan, planned_full_bytes=full_plan,
        predicted_full_bytes=predicted, capacity_bytes=capacity,
        detail=f"full stage predicted at {predicted / 2**30:.1f} GiB per GPU (planner: {full_plan / 2**30:.1f} "
               f"GiB; smoke measured {measured / 2**30:.2f} GiB against {smoke_plan / 2**30:.2f} GiB planned)"
               + ("" if fits or capacity is None else f", over the {capacity / 2**30:.0f} GiB of the GPU"))


def explain_failure(stage: str, result: StageResult, planned: PlanResult) -> str:
    failed = [f"{name}: {c.get('detail', '')}" for name, c in result.checks.items()
              if isinstance(c, dict) and c.get("passed") is False]
    base = f"the {stage} stage {result.status or Status.FAILED}"
    if result.error:
        base += f": {result.error}"
    if failed:
        base += "; failing checks: " + "; ".join(failed)
    if result.out_of_memory:
        base += "\n" + "\n".join(f"  - {a}" for a in _oom_advice(stage, result.out_of_memory, planned))
    return base


def _oom_advice(stage: str, facts: dict[str, Any], planned: PlanResult) -> list[str]:
    """The planner's view of the stage that ran out of memory, and its fixes."""
    plan = planned.plan
    spec, layout, est = ((plan.smoke.spec, plan.smoke.layout, plan.smoke.memory) if stage == "smoke" and plan.smoke
                         else (plan.spec, plan.layout, plan.memory))
    return oom_advice(est, facts, memory_fixes(spec, layout, est, plan.vocab_size, plan.transformer_impl))
