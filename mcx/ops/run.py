"""`mcx run`: plan -> fingerprint -> run cache -> smoke stage -> full stage -> records.

One direction of data: this module writes the run directory and each stage's job.json, starts the
worker through the spec's launcher, and turns what the worker wrote into MLflow and DVC records.
It never imports torch or megatron.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from mcx.contract.files import METRICS_FILE
from mcx.contract.job import Output
from mcx.contract.profile import ProfileSteps, check_profile_steps
from mcx.contract.status import RUN_ENDINGS, Status
from mcx.errors import BudgetError, InputError, McxError, SpecError, TrainingFailed
from mcx.eval.scores import run_eval_metrics
from mcx.fingerprint.record import record_to_dict
from mcx.jsonfile import write_json_atomic
from mcx.launch import placement, render_sbatch, worker_env
from mcx.metrics.curves import read_metrics
from mcx.metrics.summary import steady
from mcx.ops.cancel import clear_cancel
from mcx.ops.data import ensure_dataset, keep_dataset, with_fetched_data
from mcx.ops.plan import PlanResult, plan_loaded
from mcx.ops.progress import Note, PlanShown, Progress
from mcx.ops.stage import Watch, explain_failure, run_stage, smoke_limit
from mcx.plan.cost import check_budget
from mcx.plan.gpus import gpu_from_name
from mcx.plan.shown import DryRun, StageLaunch
from mcx.plan.steptime import check_prediction
from mcx.spec import ExperimentSpec, dump_spec, load_spec
from mcx.track import paths
from mcx.track.baseline import baseline_metrics, compare_to_baseline, resolve
from mcx.track.errors import RunLocked
from mcx.track.recorder import RunRecorder
from mcx.track.run_summary import RunSummary, StageSummary, Tracking
from mcx.track.runcache import acquire, lookup
from mcx.track.target import resolve_target

if TYPE_CHECKING:
    from mcx.contract.result import StageResult
    from mcx.ops.detach import Detached

STAGES = ("smoke", "full")
# A stage that ended early without failing ends its run so: the run's exit code for each.
_ENDED_EARLY = {Status.DIVERGED: 1, Status.PREEMPTED: 0, Status.PRUNED: 0, Status.INTERRUPTED: 130}


@frozen(kw_only=True)
class RunOptions:
    stage: str = "all"  # smoke | full | all
    force: bool = False
    yes: bool = False
    dry_run: bool = False
    skip_smoke: bool = False
    output: Output = "bar"  # the worker's progress display
    wait: bool = False
    verify_data: bool = False  # read every data file, trusting no kept hash (mcx.fingerprint.filehashes)
    # Asked when the full stage is over budget.max_gpu_hours and --yes was not given (the CLI asks
    # on a terminal); gets the gate's message, returns whether to go on. None: refuse.
    confirm: Callable[[str], bool] | None = None
    # Asked every few seconds while a stage trains (a sweep's pruner): a Stop ends the stage, the workers
    # saving a checkpoint first, and the run with the Stop's status. None: nothing watches.
    watch: Watch | None = None
    # The GPUs of this machine the stages' workers see (CUDA_VISIBLE_DEVICES; a sweep's concurrent trials
    # each get their own). None: what the environment shows. Slurm jobs get theirs from the scheduler.
    devices: tuple[str, ...] | None = None
    # --detach: return once the first stage's workers are started; a supervisor process runs the chain (D64)
    detach: bool = False
    # The run ID the caller planned (a detached run's supervisor): another ID here means the spec, its data or
    # the code changed in between, and the run is refused rather than training something else under its name.
    expect_run_id: str | None = None
    # --profile: these steps of the full stage run under torch.profiler (D73); observation only, not in the run ID
    profile: ProfileSteps | None = None


@frozen(kw_only=True)
class RunResult:
    """What `mcx run` returns: ``summary`` is the result (run.json's summary; its ``to_dict()`` is the object
    `--json` prints)."""

    summary: RunSummary | DryRun | Detached
    notes: tuple[Note, ...] = ()


def run(spec_path: str, overrides: list[str], *, project: Path, options: RunOptions, progress: Progress) -> RunResult:
    spec = load_spec(spec_path, overrides)
    if spec.sweep is not None:  # the base point: the run a trial with the spec's own values would be
        progress(Note(lead="note", text=f": {spec_path} has a [sweep] table; `mcx run` trains its base point, "
                      "`mcx sweep` runs the sweep"))
        spec = evolve(spec, sweep=None)
    return run_spec(spec, project=project, options=options, progress=progress, source=(spec_path, tuple(overrides)))


def stages_for(options: RunOptions, spec: ExperimentSpec) -> list[str]:
    if options.stage == "smoke":
        return ["smoke"]
    if options.stage == "full" or options.skip_smoke or not spec.smoke.enabled:
        return ["full"]
    return ["smoke", "full"]


def run_spec(spec: ExperimentSpec, *, project: Path, options: RunOptions, progress: Progress,
             run_dir: Path | None = None, reproduces: str | None = None, reproduction: str | None = None,
             code_path: Path | None = None, data_root: Path | None = None,
             source: tuple[str, tuple[str, ...]] | None = None) -> RunResult:
    """Train ``spec`` (or find it already trained). ``progress`` gets events as they happen (mcx.ops.progress).

    ``run_dir``, ``reproduces``, ``reproduction``, ``code_path`` and ``data_root`` are for
    reproductions: the fingerprint is taken over ``code_path`` (the recorded code state) and the
    worker runs from there; ``data_root`` (the worktree, where the recorded data was restored) is
    where ``data.path`` is read, instead of the project. ``source`` (the spec's path and ``--set`` overrides)
    is what a detached run's supervisor loads again (``options.detach``).
    """
    try:
        planned = plan_loaded(spec, code_path or project, require_data=False, at_launch=not options.dry_run,
                         verify_data=options.verify_data, state_root=project, code_path=code_path)
    except SpecError as exc:  # with what the launcher itself cannot do, in the same report
        extra = [p for p in _launcher_problems(spec) if p not in exc.problems]
        raise SpecError([*exc.problems, *extra], exc.source) from None
    stages = stages_for(options, spec)
    if options.profile is not None:
        check_profile_steps(options.profile, planned.plan.stage("full").spec.train.train_iters,
                            full_stage="full" in stages)
    if options.dry_run:
        return _dry_run(planned, run_dir or paths.run_dir(project, planned.run_id or "0" * 12), stages, progress)
    assert planned.run_id is not None  # at launch, data missing here is a problem plan_loaded raised
    if options.expect_run_id is not None and planned.run_id != options.expect_run_id:
        raise InputError(f"the run ID is {planned.run_id} here, not {options.expect_run_id} as when `mcx run --detach` "
                         "planned it: the spec, its data or the code changed in between;",
                         "run `mcx run --detach` again.")
    run_path = run_dir or paths.run_dir(project, planned.run_id)
    if "full" in stages:
        _budget_gate(planned, options, progress, smoke_first="smoke" in stages)
    if reproduces is None:
        cached = _cached(project, planned, options, progress)
        if cached is not None:
            return cached
    _preflight(planned, project, stages)
    if stages == ["full"] and options.stage == "full" and not options.skip_smoke and planned.spec.smoke.enabled:
        from mcx.contract.result import read_stage_result

        prior = read_stage_result(run_path / "smoke")
        if not (prior and prior.passed):  # refused before anything is written
            raise TrainingFailed("the smoke stage of this run has not passed;",
                                 "run `mcx run SPEC` (smoke then full), or pass --skip-smoke to go without it.")
    data_dir = ensure_dataset(data_root or project, spec.data, remote=spec.tracking.dvc_remote, progress=progress)
    planned = with_fetched_data(planned, data_root or project)
    if "smoke" in stages:
        smoke_limit(planned, data_dir)  # data too small for the smoke stage is bad input: said before anything is written
    if reproduces is None:  # kept by hash for `mcx reproduce` (a reproduction's data came from there)
        keep_dataset(project, spec.data, planned.record.data.id, remote=spec.tracking.dvc_remote,
                     progress=progress)
    if options.detach:
        return _detach(planned, project=project, run_path=run_path, options=options, source=source)
    with acquire(run_path, wait=options.wait):  # RunLocked (exit 1) when another process trains it
        if reproduces is None:
            cached = _cached(project, planned, options, progress, locked=True)  # it may have finished while we waited
            if cached is not None:
                return cached
            if options.force:
                _archive(project, run_path)
        return _train(planned, project=project, run_path=run_path, data_dir=data_dir, stages=stages, options=options,
                      progress=progress, reproduces=reproduces, reproduction=reproduction, code_path=code_path)


def _detach(planned: PlanResult, *, project: Path, run_path: Path, options: RunOptions,
            source: tuple[str, tuple[str, ...]] | None) -> RunResult:
    """The chain handed to a supervisor process (mcx.ops.detach); returns once its first stage is started."""
    from mcx.ops.detach import Detached, DetachedJob, Request, SupervisorEnded, SUPERVISOR_LOG, start_supervisor

    assert planned.run_id is not None
    if source is None:
        raise InputError("--detach needs the spec's path: only `mcx run SPEC --detach` runs detached;",
                         "run it from the command line.")
    request = Request(spec=source[0], overrides=source[1], project=str(project), run_id=planned.run_id,
                      stage=options.stage, force=options.force, skip_smoke=options.skip_smoke,
                      verify_data=options.verify_data, profile=options.profile.text() if options.profile else None)
    message = start_supervisor(request, run_path)
    log = run_path / SUPERVISOR_LOG
    if message is None:
        raise SupervisorEnded(f"the supervisor of run {planned.run_id} ended before it started a stage;",
                              f"its output is in {log}.")
    if "launched" in message:
        job = message["launched"]
        first = DetachedJob(stage=str(job["stage"]), kind=str(job["kind"]), job_id=job.get("job_id"), log=job.get("log"))
        return RunResult(summary=Detached(run_id=planned.run_id, run_dir=str(run_path), jobs=(first,),
                                          supervisor_pid=int(message["pid"]), log=str(log)))
    if "ended" in message:
        ended = message["ended"]
        summary = RunSummary.from_dict(ended["summary"])
        notes = tuple(Note(**n) for n in ended.get("notes", ()))
        return RunResult(summary=summary, notes=notes)
    err = message.get("error") or {}
    raise SupervisorEnded(str(err.get("message") or "the supervisor failed"), err.get("hint"),
                          exit_code=int(err.get("exit_code") or 1))


def _budget_gate(planned: PlanResult, options: RunOptions, progress: Progress, *, smoke_first: bool) -> None:
    """Over budget.max_gpu_hours: show the plan (layout, GPU-hours, cost), then go on only with --yes
    or the user's confirmation; else BudgetError (exit 2), before anything is written or submitted."""
    if not planned.plan.cost.over_budget:
        return
    progress(PlanShown(planned=planned))
    try:
        check_budget(planned.plan, confirmed=options.yes)
    except BudgetError as exc:
        if options.confirm is None or not options.confirm(exc.message.rstrip(" ;") + "."):
            raise
    c = planned.plan.cost
    progress(Note(lead="confirmed", text=f": the full stage may use about {c.gpu_hours:,.0f} GPU-hours "
                  f"(budget.max_gpu_hours = {c.max_gpu_hours:,.0f})"
                  + ("; the smoke stage runs first, the full stage is submitted only if it passes" if smoke_first else "")))


def _preflight(planned: PlanResult, project: Path, stages: list[str]) -> None:
    """Reject bad input before anything is written: the tracking URI, a parent run's checkpoint
    (``init.from = "run:..."``), each stage's spec and layout, and whether its launcher can place that layout
    (exit 2, no run directory, no MLflow run)."""
    resolve_target(project, planned.spec.tracking.uri)
    source = planned.record.init
    if "full" in stages and source is not None and source.kind == "run":
        from mcx.fingerprint.init_from import check_checkpoint

        # the plan checked the parent's files by size; its weights are about to be read: every file's CRC-32
        check_checkpoint(project, str(source.run_id), Path(source.path))
    for stage in sorted(stages, key=lambda s: s != "full"):  # the full stage first: smoke inherits its hardware
        sp = planned.plan.stage(stage)
        where = placement(sp.layout, sp.device)
        kind = sp.spec.launch.kind
        keys = "smoke.nodes x smoke.gpus_per_node" if stage == "smoke" else "hardware.nodes x hardware.gpus_per_node"
        if kind == "local" and where.world_size != 1:
            raise InputError(f"launch.kind = 'local' runs one process, but the {stage} stage needs {where.world_size} "
                             f"({keys});", "set launch.kind = 'torchrun' (one node) or 'slurm' (several nodes).")
        if kind == "torchrun" and where.nodes != 1:
            raise InputError(f"launch.kind = 'torchrun' runs on one node, but the {stage} stage spans {where.nodes} "
                             f"({keys});", "set launch.kind = 'slurm' for several nodes.")


def _launcher_problems(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """The full stage's placement against launch.kind, from the spec alone (for a spec that did not plan)."""
    hw, kind = spec.hardware, spec.launch.kind
    if kind == "local" and hw.nodes * hw.gpus_per_node != 1:
        return [("launch.kind", f"'local' runs one process, but hardware.nodes x hardware.gpus_per_node = "
                 f"{hw.nodes * hw.gpus_per_node}; set launch.kind = 'torchrun' (one node) or 'slurm' (several nodes)")]
    if kind == "torchrun" and hw.nodes != 1:
        return [("launch.kind", f"'torchrun' runs on one node, but hardware.nodes = {hw.nodes}; set launch.kind = "
                 "'slurm' for several nodes")]
    return []


def _cached(project: Path, planned: PlanResult, options: RunOptions, progress: Progress, *, locked: bool = False
            ) -> RunResult | None:
    run_id = planned.run_id
    assert run_id is not None, "run_spec asks only at launch, where the data (part of the ID) is here"
    state = lookup(project, run_id, tracking_uri=planned.spec.tracking.uri)
    if locked and state.state == "running":  # the holder is this process
        status = (_read_json(state.run_dir / "run.json") or {}).get("status")
        state = type(state)(run_id, "finished" if status == Status.FINISHED else "interrupted", state.run_dir, status)
    if state.state == "running" and not options.wait:
        raise RunLocked(run_id, state.holder)
    if state.state != "finished" or options.force:
        return None
    if options.profile is not None:  # a finished run trains no step to profile: said, rather than ignored
        raise InputError(f"run {run_id} already finished, so --profile {options.profile.text()} has no step to "
                         "profile;", "add --force to train it again under the profiler (the finished attempt is "
                                     "kept in .mcx/archive/; the run ID and the losses stay the same).")
    run_json = _read_json(state.run_dir / "run.json") or {}
    stored = run_json.get("summary", {})
    summary = evolve(RunSummary.from_dict(stored), run_id=planned.run_id, cached=True, exit_code=0, error=None,
                     judged=True, baseline=None, run_dir=str(state.run_dir),
                     status=stored.get("status") or state.status or Status.FINISHED)
    notes = [Note(level="info", lead=f"run {planned.run_id}", text=f" already finished ({summary.status}); not "
                     f"training again. Use --force to retrain, `mcx show {planned.run_id}` for its record.")]
    if planned.spec.baseline.run:  # [baseline] is not part of the run ID: judge the cached result against it now
        from mcx.contract.result import StageResult, read_stage_result

        full = read_stage_result(state.run_dir / "full") or StageResult(final=summary.final)
        summary = summary.judge(_baseline(project, planned, full, run_eval_metrics(state.run_dir)))
        if summary.error:
            notes.append(Note(level="error", text=f"mcx: {summary.error}"))
    return RunResult(summary=summary, notes=tuple(notes))


def _archive(project: Path, run_path: Path) -> None:
    """--force: keep the previous attempt under .mcx/archive/ instead of deleting it.

    The next attempt's number stays in the run directory: counted from the archive, it would start
    over once `mcx gc` empties it, and the new attempt would reuse an old attempt's MLflow run.
    """
    if not run_path.exists():
        return
    attempt = (_read_json(run_path / "run.json") or {}).get("attempt")
    dest = project / ".mcx" / "archive" / f"{run_path.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    dest.mkdir(parents=True)
    for child in run_path.iterdir():
        if child.name != "lock":
            shutil.move(str(child), dest / child.name)
    if isinstance(attempt, int):
        write_json_atomic(run_path / "run.json", {"attempt": attempt + 1})


def _dry_run(planned: PlanResult, run_path: Path, stages: list[str], progress: Progress) -> RunResult:
    """The plan and what each stage would launch (its sbatch script on Slurm); the CLI prints them."""
    scripts: dict[str, str] = {}
    launch: dict[str, StageLaunch] = {}
    for stage in stages:
        sp = planned.plan.stage(stage)
        launch[stage] = StageLaunch(kind=sp.spec.launch.kind, layout=sp.layout)
        if sp.spec.launch.kind == "slurm":
            scripts[stage] = render_sbatch(run_path / stage, placement(sp.layout, sp.device), sp.spec.launch,
                                           worker_env(sp.spec))
    return RunResult(summary=DryRun(run_id=planned.run_id, stages=tuple(stages), scripts=scripts, launch=launch,
                                    plan=planned.shown))


def _write_run_files(planned: PlanResult, run_path: Path, stages: list[str], options: RunOptions) -> None:
    run_path.mkdir(parents=True, exist_ok=True)
    (run_path / "spec.toml").write_text(dump_spec(planned.spec), encoding="utf-8")
    write_json_atomic(run_path / "fingerprint.json", record_to_dict(planned.record))
    write_json_atomic(run_path / "plan.json", planned.plan_json())
    run_json = _read_json(run_path / "run.json") or {}
    archive = run_path.parent.parent / "archive"
    attempts = len(list(archive.glob(f"{planned.run_id}-*"))) if run_path.parent.name == "runs" and archive.is_dir() else 0
    run_json.setdefault("attempt", attempts + 1)
    run_json.update({"run_id": planned.run_id, "name": planned.spec.name, "status": "running",
                     "started": run_json.get("started", time.time()), "stages_planned": stages,
                     "skip_smoke": "smoke" not in stages, "launcher": planned.spec.launch.kind})
    write_json_atomic(run_path / "run.json", run_json)


def _train(planned: PlanResult, *, project: Path, run_path: Path, data_dir: Path, stages: list[str], options: RunOptions,
           progress: Progress, reproduces: str | None, reproduction: str | None, code_path: Path | None = None
           ) -> RunResult:
    _write_run_files(planned, run_path, stages, options)
    clear_cancel(run_path)  # a `mcx cancel` of an earlier attempt; this one runs until it ends or is cancelled
    recorder = RunRecorder.for_run(project, run_path, reproduces=reproduces, reproduction=reproduction)
    tags = {"mcx.skip_smoke": "true"} if "smoke" not in stages else {}
    recorder.start(launcher=planned.spec.launch.kind, tags=tags)
    results: dict[str, StageResult] = {}
    status, error, exit_code = Status.FINISHED, None, 0
    started = time.time()
    try:
        for stage in stages:
            result = run_stage(stage, planned, project=project, run_path=run_path, data_dir=data_dir, recorder=recorder,
                                output=options.output, progress=progress, code_path=code_path, watch=options.watch,
                                devices=options.devices, reproduction=reproduces is not None, profile=options.profile)
            results[stage] = result
            if not result.ok:
                status = result.status if result.status in _ENDED_EARLY else Status.FAILED
                error = result.error if status in (Status.PRUNED, Status.INTERRUPTED) else explain_failure(stage, result, planned)
                # 2: the worker found bad input where it runs (a node without Transformer Engine, say)
                exit_code = _ENDED_EARLY.get(status, 2 if result.exit_code == 2 else 1)
                break
    except KeyboardInterrupt:  # a Ctrl-C no launch passed on (between stages; a Slurm job followed): what finished is kept
        again = ("`mcx reproduce` again reruns it from the start" if reproduces is not None else
                 "the same `mcx run` command resumes the run where it stopped")
        status, error, exit_code = Status.INTERRUPTED, f"interrupted; {again}", 130
    except McxError as exc:  # a stage could not be started or followed: the run failed, it is not still running
        status, error, exit_code = Status.FAILED, str(exc), exc.exit_code
        if stage == "full" and "smoke" in results and results["smoke"].passed:
            error += (" The smoke stage passed and is kept: `mcx run` of this spec again (where the job can run) "
                      "submits the full stage without repeating it.")
    last = results.get("full") or results.get("smoke")
    scores: dict[str, float] = {}
    notes = []
    if status == Status.FINISHED and "full" in results and planned.spec.eval.tasks:
        scores, note = _evaluate(project, planned, progress, recorder)
        notes += [note] if note else []
    summary = RunSummary(run_id=planned.run_id, name=planned.spec.name, status=status,
                         stages={k: _stage_summary(v) for k, v in results.items()},
                         final={**(last.final if last else {}), **scores}, error=error, exit_code=exit_code,
                         wall_time_s=time.time() - started, run_dir=str(run_path))
    if status == Status.FINISHED and "full" in results:
        summary = summary.judge(_baseline(project, planned, results["full"], scores))
        check = _prediction(planned, run_path, results["full"])
        if check is not None:
            summary = evolve(summary, step_time=check.to_dict())
            recorder.record_prediction(check.to_dict(), step=results["full"].steps or 0)
    run_json = _read_json(run_path / "run.json") or {}
    done = status == Status.FINISHED and "full" in results and results["full"].status == Status.FINISHED
    run_json.update({"status": status if (done or status != Status.FINISHED) else Status.SMOKE_PASSED,
                     "ended": time.time(), "summary": summary.to_dict()})
    write_json_atomic(run_path / "run.json", run_json)
    recorder.finish(status if status in RUN_ENDINGS else Status.FAILED,
               tags={"mcx.baseline.verdict": str((summary.baseline or {}).get("verdict", "none"))})
    entry = recorder.close()
    # after run.json, which the recorder uploads: where the records went is the command's answer, not the run's
    summary = evolve(summary, tracking=Tracking(target=entry.target, state=entry.state, error=entry.error,
                                                mlflow_run=recorder.record_uuid("run")))
    if entry.state == "pending":
        notes.append(Note(level="warning", text=f"tracking store unreachable ({entry.error}); records are spooled: "
                             "run `mcx sync`"))
    if summary.exit_code and summary.error:
        notes.append(Note(level="error", text=f"mcx: {summary.error}"))
    return RunResult(summary=summary, notes=tuple(notes))


def _prediction(planned: PlanResult, run_path: Path, full: StageResult) -> Any:
    """The step-time model beside the full stage's median step, where it trained on a GPU (a PredictionCheck)."""
    import statistics

    if full.details.get("device") != "cuda":
        return None
    curve = read_metrics(run_path / "full" / METRICS_FILE)[0].get("train/step_time_s")
    if curve is None or len(curve.values) < 2:
        return None
    plan = planned.plan
    gpu = gpu_from_name(str(full.details.get("gpu_name") or ""))
    floor = plan.host_floor if plan.host_floor is not None and plan.host_floor.gpu == gpu else None
    return check_prediction(plan.spec, plan.layout, padded_vocab=plan.params.padded_vocab,
                            impl=full.layer_spec or plan.transformer_impl, gpu=gpu,
                            measured_s=statistics.median(steady(list(curve.values))),
                            host_layer_s=None if floor is None else floor.host_layer_s)


def _evaluate(project: Path, planned: PlanResult, progress: Progress, recorder: RunRecorder
              ) -> tuple[dict[str, float], Note | None]:
    """[eval] on the finished full stage's weights (mcx.ops.evaluate): its scores as metrics. An evaluation that
    fails leaves the trained run finished and says how to evaluate it again."""
    from mcx.ops.evaluate import evaluate_run

    try:
        outcome = evaluate_run(planned.run_id or "", project.resolve(), progress=progress, recorder=recorder,
                               spec_eval=planned.spec.eval)
    except McxError as exc:
        return {}, Note(level="error", text=f"mcx: the evaluation failed: {exc}; `mcx eval {planned.run_id}` "
                                            "tries again")
    failed = outcome.steps_error  # [eval] every: a checkpoint's evaluation failed; the final scores stand (D71)
    return outcome.evaluation.metrics(), None if failed is None else \
        Note(level="error", text=f"mcx: {failed}; `mcx eval {planned.run_id}` tries again")


def _baseline(project: Path, planned: PlanResult, full: StageResult, scores: dict[str, float]
              ) -> dict[str, Any] | None:
    ref = planned.spec.baseline.run
    if not ref:
        return None
    try:
        base_id = resolve(project, ref, tracking_uri=planned.spec.tracking.uri)
        base = baseline_metrics(project, base_id, tracking_uri=planned.spec.tracking.uri)
    except McxError as exc:
        return {"verdict": "unknown", "detail": str(exc), "baseline": ref}
    finals = {**{k: v for k, v in full.final.items() if isinstance(v, (int, float))}, **scores}
    out = compare_to_baseline(finals, base, planned.spec.baseline.tolerances)
    detail = ", ".join(str(r) for r in out.get("regressed", [])) or "within tolerance"
    return {"baseline": ref, "baseline_run_id": base_id, "detail": detail, **out}


def _stage_summary(result: StageResult) -> StageSummary:
    """A stage's entry in run.json's summary."""
    return StageSummary(status=result.status, passed=bool(result.passed), checks=dict(result.checks),
                        control_checks=dict(result.control_checks), metrics=dict(result.final), steps=result.steps,
                        layer_spec=result.layer_spec, error=result.error, warnings=tuple(result.warnings))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
