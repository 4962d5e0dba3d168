"""`mcx run`: plan -> fingerprint -> run cache -> smoke stage -> full stage -> records.

One direction of data: this module writes the run directory and each stage's job.json, starts the
worker through the spec's launcher, and turns what the worker wrote into MLflow and DVC records.
It never imports torch or megatron.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attrs import evolve, frozen

from mcx import testhooks
from mcx.errors import InputError, McxError, SpecError, TrainingFailed
from mcx.ops.plan import PlanResult, plan_loaded
from mcx.spec import ExperimentSpec, dump_spec, load_spec

if TYPE_CHECKING:
    from mcx.launch.result import StageResult
    from mcx.plan.degrees import Layout
    from mcx.train.job import Job

STAGES = ("smoke", "full")


@frozen(kw_only=True)
class RunOptions:
    stage: str = "all"  # smoke | full | all
    force: bool = False
    yes: bool = False
    dry_run: bool = False
    skip_smoke: bool = False
    output: str = "bar"  # bar | quiet | json (the worker's progress display)
    wait: bool = False
    verify_data: bool = False  # read every data file, trusting no kept hash (mcx.fingerprint.filehashes)
    # Asked when the full stage is over budget.max_gpu_hours and --yes was not given (the CLI asks
    # on a terminal); gets the gate's message, returns whether to go on. None: refuse.
    confirm: Callable[[str], bool] | None = None


@frozen(kw_only=True)
class RunNote:
    """A message that belongs to a run's result (it is cached; its error; records left to sync): the
    CLI prints it on stderr after the run (mcx.report.notes), progress having streamed meanwhile."""

    level: Literal["info", "warning", "error"]
    text: str
    lead: str = ""  # the words shown first, in bold ("run 3f9c0a12b4de")


@frozen(kw_only=True)
class RunResult:
    """What `mcx run` returns: ``summary`` is the result (run.json's summary; the object `--json` prints)."""

    summary: dict[str, Any]
    notes: tuple[RunNote, ...] = ()


def run(spec_path: str, overrides: list[str], *, project: Path, options: RunOptions, console: Any) -> RunResult:
    spec = load_spec(spec_path, overrides)
    return run_spec(spec, project=project, options=options, console=console)


def stages_for(options: RunOptions, spec: ExperimentSpec) -> list[str]:
    if options.stage == "smoke":
        return ["smoke"]
    if options.stage == "full" or options.skip_smoke or not spec.smoke.enabled:
        return ["full"]
    return ["smoke", "full"]


def run_spec(spec: ExperimentSpec, *, project: Path, options: RunOptions, console: Any,
             run_dir: Path | None = None, reproduces: str | None = None, reproduction: str | None = None,
             code_path: Path | None = None, data_root: Path | None = None) -> RunResult:
    """Train ``spec`` (or find it already trained). ``console`` gets the progress as it happens.

    ``run_dir``, ``reproduces``, ``reproduction``, ``code_path`` and ``data_root`` are for
    reproductions: the fingerprint is taken over ``code_path`` (the recorded code state) and the
    worker runs from there; ``data_root`` (the worktree, where the recorded data was restored) is
    where ``data.path`` is read, instead of the project.
    """
    from mcx.track import paths

    try:
        pr = plan_loaded(spec, code_path or project, require_data=False, at_launch=not options.dry_run,
                         verify_data=options.verify_data)
    except SpecError as exc:  # with what the launcher itself cannot do, in the same report
        extra = [p for p in _launcher_problems(spec) if p not in exc.problems]
        raise SpecError([*exc.problems, *extra], exc.source) from None
    stages = stages_for(options, spec)
    if options.dry_run:
        return _dry_run(pr, run_dir or paths.run_dir(project, pr.run_id or "0" * 12), stages, console)
    assert pr.run_id is not None  # at launch, data missing here is a problem plan_loaded raised
    rdir = run_dir or paths.run_dir(project, pr.run_id)
    if "full" in stages:
        _budget_gate(pr, options, console, smoke_first="smoke" in stages)
    if reproduces is None:
        cached = _cached(project, pr, options, console)
        if cached is not None:
            return cached
    _preflight(pr, project, stages)
    if stages == ["full"] and options.stage == "full" and not options.skip_smoke and pr.spec.smoke.enabled:
        from mcx.launch.result import read_stage_result

        prior = read_stage_result(rdir / "smoke")
        if not (prior and prior.passed):  # refused before anything is written
            raise TrainingFailed("the smoke stage of this run has not passed;",
                                 "run `mcx run SPEC` (smoke then full), or pass --skip-smoke to go without it.")
    from mcx.ops.data import ensure_dataset, keep_dataset
    from mcx.track.runcache import acquire

    data_dir = ensure_dataset(data_root or project, spec.data, remote=spec.tracking.dvc_remote)
    if "smoke" in stages:
        _smoke_limit(pr, data_dir)  # data too small for the smoke stage is bad input: said before anything is written
    if reproduces is None:  # kept by hash for `mcx reproduce` (a reproduction's data came from there)
        keep_dataset(project, spec.data, pr.record.data.get("id") or {}, remote=spec.tracking.dvc_remote,
                     console=console)
    with acquire(rdir, wait=options.wait):  # RunLocked (exit 1) when another process trains it
        if reproduces is None:
            cached = _cached(project, pr, options, console, locked=True)  # it may have finished while we waited
            if cached is not None:
                return cached
            if options.force:
                _archive(project, rdir)
        return _train(pr, project=project, rdir=rdir, data_dir=data_dir, stages=stages, options=options,
                      console=console, reproduces=reproduces, reproduction=reproduction, code_path=code_path)


def _budget_gate(pr: PlanResult, options: RunOptions, console: Any, *, smoke_first: bool) -> None:
    """Over budget.max_gpu_hours: show the plan (layout, GPU-hours, cost), then go on only with --yes
    or the user's confirmation; else BudgetError (exit 2), before anything is written or submitted."""
    from mcx.errors import BudgetError
    from mcx.plan.cost import check_budget
    from mcx.report.plan_view import render_plan

    if not pr.plan.cost.over_budget:
        return
    console.print(render_plan(pr.plan_dict, pr.run_id))
    try:
        check_budget(pr.plan, confirmed=options.yes)
    except BudgetError as exc:
        if options.confirm is None or not options.confirm(exc.message.rstrip(" ;") + "."):
            raise
    c = pr.plan.cost
    console.print(f"[bold]confirmed[/]: the full stage may use about {c.gpu_hours:,.0f} GPU-hours "
                  f"(budget.max_gpu_hours = {c.max_gpu_hours:,.0f})"
                  + ("; the smoke stage runs first, the full stage is submitted only if it passes" if smoke_first else ""))


def _preflight(pr: PlanResult, project: Path, stages: list[str]) -> None:
    """Reject bad input before anything is written: the tracking URI, each stage's spec and layout,
    and whether its launcher can place that layout (exit 2, no run directory, no MLflow run)."""
    from mcx.launch import placement
    from mcx.plan.stages import stage_spec
    from mcx.track.target import resolve_target

    resolve_target(project, pr.spec.tracking.uri)
    te = pr.te_available
    for stage in sorted(stages, key=lambda s: s != "full"):  # the full stage first: smoke inherits its hardware
        sspec, slayout = stage_spec(pr.spec, pr.plan.layout, stage, te_available=te, vocab_size=pr.plan.vocab_size)
        where = placement(slayout, _device(sspec, pr))
        kind = sspec.launch.kind
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


def _cached(project: Path, pr: PlanResult, options: RunOptions, console: Any, *, locked: bool = False
            ) -> RunResult | None:
    from mcx.track.errors import RunLocked
    from mcx.track.runcache import lookup

    state = lookup(project, pr.run_id, tracking_uri=pr.spec.tracking.uri)
    if locked and state.state == "running":  # the holder is this process
        status = (_read_json(state.run_dir / "run.json") or {}).get("status")
        state = type(state)(pr.run_id, "finished" if status == "finished" else "interrupted", state.run_dir, status)
    if state.state == "running" and not options.wait:
        raise RunLocked(pr.run_id, state.holder)
    if state.state != "finished" or options.force:
        return None
    run_json = _read_json(state.run_dir / "run.json") or {}
    summary = {**run_json.get("summary", {}), "run_id": pr.run_id, "cached": True, "exit_code": 0, "error": None,
               "baseline": None, "run_dir": str(state.run_dir)}
    summary.setdefault("status", state.status or "finished")
    notes = [RunNote(level="info", lead=f"run {pr.run_id}", text=f" already finished ({summary['status']}); not "
                     f"training again. Use --force to retrain, `mcx show {pr.run_id}` for its record.")]
    if pr.spec.baseline.run:  # [baseline] is not part of the run ID: judge the cached result against it now
        from mcx.launch.result import StageResult, read_stage_result

        full = read_stage_result(state.run_dir / "full") or StageResult(final=summary.get("final") or {})
        _judge(summary, project, pr, full)
        if summary["error"]:
            notes.append(RunNote(level="error", text=f"mcx: {summary['error']}"))
    return RunResult(summary=summary, notes=tuple(notes))


def _archive(project: Path, rdir: Path) -> None:
    """--force: keep the previous attempt under .mcx/archive/ instead of deleting it.

    The next attempt's number stays in the run directory: counted from the archive, it would start
    over once `mcx gc` empties it, and the new attempt would reuse an old attempt's MLflow run.
    """
    from mcx.jsonfile import write_json_atomic

    if not rdir.exists():
        return
    attempt = (_read_json(rdir / "run.json") or {}).get("attempt")
    dest = project / ".mcx" / "archive" / f"{rdir.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    dest.mkdir(parents=True)
    for child in rdir.iterdir():
        if child.name != "lock":
            shutil.move(str(child), dest / child.name)
    if isinstance(attempt, int):
        write_json_atomic(rdir / "run.json", {"attempt": attempt + 1})


def _dry_run(pr: PlanResult, rdir: Path, stages: list[str], console: Any) -> RunResult:
    """The plan and what each stage would launch (its sbatch script on Slurm); the CLI prints them."""
    from mcx.launch import placement, render_sbatch, worker_env
    from mcx.plan.stages import stage_spec

    scripts: dict[str, str] = {}
    launch: dict[str, dict[str, Any]] = {}
    te = pr.te_available
    for stage in stages:
        sspec, slayout = stage_spec(pr.spec, pr.plan.layout, stage, te_available=te, vocab_size=pr.plan.vocab_size)
        launch[stage] = {"kind": sspec.launch.kind, "layout": slayout.job_dict()}
        if sspec.launch.kind == "slurm":
            scripts[stage] = render_sbatch(rdir / stage, placement(slayout, _device(sspec, pr)), sspec.launch,
                                           worker_env(sspec))
    return RunResult(summary={"run_id": pr.run_id, "status": "dry-run", "cached": False, "stages": {s: {} for s in stages},
                              "scripts": scripts, "launch": launch, "plan": pr.plan_dict, "exit_code": 0})


def _write_run_files(pr: PlanResult, rdir: Path, stages: list[str], options: RunOptions) -> None:
    from mcx.fingerprint.record import record_to_dict
    from mcx.jsonfile import write_json_atomic

    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "spec.toml").write_text(dump_spec(pr.spec), encoding="utf-8")
    write_json_atomic(rdir / "fingerprint.json", record_to_dict(pr.record))
    write_json_atomic(rdir / "plan.json", pr.plan_dict)
    run_json = _read_json(rdir / "run.json") or {}
    archive = rdir.parent.parent / "archive"
    attempts = len(list(archive.glob(f"{pr.run_id}-*"))) if rdir.parent.name == "runs" and archive.is_dir() else 0
    run_json.setdefault("attempt", attempts + 1)
    run_json.update({"run_id": pr.run_id, "name": pr.spec.name, "status": "running",
                     "started": run_json.get("started", time.time()), "stages_planned": stages,
                     "skip_smoke": "smoke" not in stages, "launcher": pr.spec.launch.kind})
    write_json_atomic(rdir / "run.json", run_json)


def _device(spec: ExperimentSpec, pr: PlanResult) -> str:
    if spec.hardware.gpu == "cpu":
        return "cpu"
    if spec.launch.kind == "slurm":
        return "cuda"
    # The hardware fingerprint says "cuda" when a GPU is visible here and the spec wants one.
    return "cuda" if (pr.record.hardware.get("id") or {}).get("device") == "cuda" else "cpu"


def _train(pr: PlanResult, *, project: Path, rdir: Path, data_dir: Path, stages: list[str], options: RunOptions,
           console: Any, reproduces: str | None, reproduction: str | None, code_path: Path | None = None
           ) -> RunResult:
    from mcx.jsonfile import write_json_atomic
    from mcx.track.recorder import RunRecorder

    _write_run_files(pr, rdir, stages, options)
    rec = RunRecorder.for_run(project, rdir, reproduces=reproduces, reproduction=reproduction)
    tags = {"mcx.skip_smoke": "true"} if "smoke" not in stages else {}
    rec.start(launcher=pr.spec.launch.kind, tags=tags)
    results: dict[str, StageResult] = {}
    status, error, exit_code = "finished", None, 0
    started = time.time()
    try:
        for stage in stages:
            result = _run_stage(stage, pr, project=project, rdir=rdir, data_dir=data_dir, rec=rec,
                                options=options, console=console, code_path=code_path)
            results[stage] = result
            if not result.ok:
                status = result.status if result.status in ("diverged", "preempted") else "failed"
                error = _explain_failure(stage, result, pr)
                # 2: the worker found bad input where it runs (a node without Transformer Engine, say)
                exit_code = 0 if status == "preempted" else (2 if result.exit_code == 2 else 1)
                break
    except KeyboardInterrupt:
        status, error, exit_code = "interrupted", "interrupted by the user; run again to resume", 130
    except McxError as exc:  # a stage could not be started or followed: the run failed, it is not still running
        status, error, exit_code = "failed", str(exc), exc.exit_code
        if stage == "full" and "smoke" in results and results["smoke"].passed:
            error += (" The smoke stage passed and is kept: `mcx run` of this spec again (where the job can run) "
                      "submits the full stage without repeating it.")
    summary = _summary(pr, results, status, error, exit_code, time.time() - started)
    summary["run_dir"] = str(rdir)
    if status == "finished" and "full" in results:
        _judge(summary, project, pr, results["full"])
    run_json = _read_json(rdir / "run.json") or {}
    done = status == "finished" and "full" in results and results["full"].status == "finished"
    run_json.update({"status": status if (done or status != "finished") else "smoke-passed",
                     "ended": time.time(), "summary": summary})
    write_json_atomic(rdir / "run.json", run_json)
    rec.finish(status if status in ("finished", "failed", "diverged", "preempted", "interrupted") else "failed",
               tags={"mcx.baseline.verdict": str((summary.get("baseline") or {}).get("verdict", "none"))})
    entry = rec.close()
    summary["tracking"] = {"target": entry.target, "state": entry.state, "error": entry.error,
                           "mlflow_run": rec.record_uuid("run")}
    notes = []
    if entry.state == "pending":
        notes.append(RunNote(level="warning", text=f"tracking store unreachable ({entry.error}); records are spooled: "
                             "run `mcx sync`"))
    if summary["exit_code"] and summary.get("error"):
        notes.append(RunNote(level="error", text=f"mcx: {summary['error']}"))
    return RunResult(summary=summary, notes=tuple(notes))


def _job(stage: str, sspec: ExperimentSpec, slayout: Layout, pr: PlanResult, sdir: Path, data_dir: Path,
         options: RunOptions) -> Job:
    """The stage's job contract; ``job_to_dict`` gives job.json."""
    from mcx.train.job import Checks, Job

    limit = _smoke_limit(pr, data_dir, sspec) if stage == "smoke" else None
    ckpt = Path(pr.spec.checkpoint.dir) / pr.run_id / stage if pr.spec.checkpoint.dir else sdir / "checkpoints"
    sm = pr.spec.smoke
    return Job(run_id=pr.run_id, stage=stage, spec=sspec, layout=slayout, data_dir=str(data_dir.resolve()),
               checkpoint_dir=str(ckpt.resolve()), train_samples_limit=limit,
               checks=Checks(resume_check_iters=sm.resume_check_iters, loss_window=sm.loss_window,
                             min_loss_drop=sm.min_loss_drop),
               device=_device(sspec, pr), output=options.output,
               test_hooks=testhooks.active() or {})  # non-empty: a test job (mcx.testhooks)


def _smoke_limit(pr: PlanResult, data_dir: Path, sspec: ExperimentSpec | None = None) -> int:
    """The smoke stage's ``train_samples_limit``; DataError when the train split holds no sample."""
    from mcx.data.dataset import smoke_samples_limit

    if sspec is None:
        assert pr.plan.smoke is not None, "a smoke stage is planned whenever smoke.enabled"
        sspec = pr.plan.smoke.spec
    return smoke_samples_limit(data_dir, sspec.data.split, sspec.model.seq_length, pr.spec.smoke.data_fraction,
                               sspec.data.prefix)


def _run_stage(stage: str, pr: PlanResult, *, project: Path, rdir: Path, data_dir: Path, rec: Any,
               options: RunOptions, console: Any, code_path: Path | None = None) -> StageResult:
    from mcx.launch import launcher_for, placement, worker_env
    from mcx.launch.base import clear_result, latest_checkpoint
    from mcx.launch.result import StageResult, read_stage_result
    from mcx.plan.stages import stage_spec
    from mcx.jsonfile import write_json_atomic
    from mcx.train.job import job_to_dict

    sdir = rdir / stage
    prior = read_stage_result(sdir)
    if prior and prior.ok:
        console.print(f"[bold]{stage} stage[/] already finished in {_esc(sdir)}; reusing it")
        return prior
    sspec, slayout = stage_spec(pr.spec, pr.plan.layout, stage, te_available=pr.te_available,
                                vocab_size=pr.plan.vocab_size)
    sdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sdir / "job.json", job_to_dict(_job(stage, sspec, slayout, pr, sdir, data_dir, options)))
    resume = latest_checkpoint(sdir)
    clear_result(sdir)
    console.print(f"[bold]{stage} stage[/]: {sspec.model.num_layers} layers, hidden {sspec.model.hidden_size}, "
                  f"seq {sspec.model.seq_length}, {sspec.train.train_iters} steps, layout "
                  f"TP{slayout.tp} PP{slayout.pp} CP{slayout.cp} EP{slayout.ep} DP{slayout.dp} "
                  f"({sspec.launch.kind})" + (f"; resuming from {_esc(resume)}" if resume else ""))
    rec.start_stage(stage)
    launcher = launcher_for(sspec.launch)
    try:
        with rec.forwarder(stage):
            env = worker_env(sspec)
            if code_path is not None:  # a reproduction: the worker imports the recorded mcx first
                path = [str(code_path), *filter(None, [os.environ.get("PYTHONPATH")])]
                env = {**env, "PYTHONPATH": os.pathsep.join(path)}
            handle = launcher.start(sdir, placement(slayout, _device(sspec, pr)), sspec.launch, env)
            forwarding = getattr(handle, "forwarding_signals", None)
            if forwarding is not None:
                with forwarding():
                    outcome = handle.wait()
            else:
                outcome = handle.wait()
    except BaseException:  # not started (sbatch refused it...) or interrupted: the stage's record ends too
        rec.finish_stage(stage)
        raise
    result = read_stage_result(sdir) or StageResult(
        status="failed", passed=False, error=f"the worker wrote no result ({outcome.state}: {outcome.detail})")
    if outcome.state not in ("finished", "failed") and result.status == "finished":
        result = evolve(result, status="failed", error=f"launch ended {outcome.state}: {outcome.detail}")
    if outcome.state == "preempted" and result.status != "preempted":
        result = evolve(result, status="preempted", error=outcome.detail)
    for warning in result.warnings:  # e.g. a damaged checkpoint set aside (D36)
        console.print(f"[yellow]{stage} stage: {_esc(warning)}[/]")
    checkpoint = None
    if result.status == "finished" and pr.spec.tracking.log_checkpoints:
        checkpoint = _track_checkpoint(project, sdir, pr, console)
    if stage == "smoke" and result.status == "finished":
        result = evolve(result, control_checks={**result.control_checks,
                                                "memory_prediction": _memory_prediction(pr, result)})
    rec.finish_stage(stage, checkpoint=checkpoint)
    return result


def _track_checkpoint(project: Path, sdir: Path, pr: PlanResult, console: Any) -> dict[str, Any] | None:
    from mcx.launch.base import latest_checkpoint
    from mcx.ops.data import data_versions
    from mcx.track import paths
    from mcx.track.dvc_store import track_checkpoint
    from mcx.track.share import configured_remotes, share_hint

    latest = latest_checkpoint(sdir)
    if latest is None:
        return None
    ckpt_dir = Path(_read_json(sdir / "job.json")["checkpoint_dir"]) / latest
    # The run's own stages get a pointer git can carry (.mcx/checkpoints/<id>/<stage>.dvc, D38);
    # a reproduction's checkpoints keep theirs beside them.
    own = sdir.parent == paths.run_dir(project, pr.run_id)
    pointer = paths.pointer_file(project, pr.run_id, sdir.name) if own else None
    meta = {"run_id": pr.run_id, "stage": sdir.name,
            "data": data_versions(project, pr.spec.data, pr.record.data.get("id") or {})} if own else None
    try:
        rec = track_checkpoint(project, ckpt_dir, remote=pr.spec.tracking.dvc_remote, dvc_file=pointer, meta=meta)
        if own:
            hint = share_hint(project, rec, pr.run_id, sdir.name, configured_remotes(project))
            console.print(_esc(hint), soft_wrap=True)  # commands to copy: never wrapped
        return rec.to_dict()
    except McxError as exc:
        console.print(f"[yellow]checkpoint not added to DVC: {_esc(exc)}[/]")
        return None


def _memory_prediction(pr: PlanResult, smoke_result: StageResult) -> dict[str, Any]:
    """Full-model peak memory predicted from the smoke stage's measurement and the planner's model.

    The planner's error on the smoke model (measured - planned) is mostly what no model of
    parameters and activations holds (allocator rounding, library workspaces): it is carried over
    to the full model as a constant, rather than scaled with it.
    """
    measured = smoke_result.final.get("mem_peak_bytes")
    smoke_plan = (pr.plan_dict.get("smoke") or {}).get("memory_per_gpu_bytes")
    full_plan = pr.plan_dict.get("memory_per_gpu_bytes")
    on_cpu = smoke_result.details.get("device", smoke_result.extra.get("device")) == "cpu"
    if on_cpu or not measured or not smoke_plan or not full_plan:
        return {"passed": True, "detail": "not comparable on this device (CPU memory is not GPU memory)"}
    predicted = full_plan + (measured - smoke_plan)
    capacity = pr.plan_dict.get("memory", {}).get("capacity_bytes")
    fits = capacity is None or predicted <= capacity
    return {"passed": bool(fits), "measured_smoke_bytes": measured, "planned_smoke_bytes": smoke_plan,
            "planned_full_bytes": full_plan, "predicted_full_bytes": predicted, "capacity_bytes": capacity,
            "detail": f"full stage predicted at {predicted / 2**30:.1f} GiB per GPU (planner: {full_plan / 2**30:.1f} "
                      f"GiB; smoke measured {measured / 2**30:.2f} GiB against {smoke_plan / 2**30:.2f} GiB planned)"
                      + ("" if fits else f", over the {capacity / 2**30:.0f} GiB of the GPU")}


def _explain_failure(stage: str, result: StageResult, pr: PlanResult) -> str:
    failed = [f"{name}: {c.get('detail', '')}" for name, c in result.checks.items()
              if isinstance(c, dict) and c.get("passed") is False]
    base = f"the {stage} stage {result.status or 'failed'}"
    if result.error:
        base += f": {result.error}"
    if failed:
        base += "; failing checks: " + "; ".join(failed)
    if result.out_of_memory:
        base += "\n" + "\n".join(f"  - {a}" for a in _oom_advice(stage, result.out_of_memory, pr))
    return base


def _oom_advice(stage: str, facts: dict[str, Any], pr: PlanResult) -> list[str]:
    """The planner's view of the stage that ran out of memory, and its fixes."""
    from mcx.plan.memory import memory_fixes, oom_advice

    plan = pr.plan
    spec, layout, est = ((plan.smoke.spec, plan.smoke.layout, plan.smoke.memory) if stage == "smoke" and plan.smoke
                         else (plan.spec, plan.layout, plan.memory))
    return oom_advice(est, facts, memory_fixes(spec, layout, est, plan.vocab_size, plan.transformer_impl))


def _judge(summary: dict[str, Any], project: Path, pr: PlanResult, full: StageResult) -> None:
    """The baseline verdict into ``summary``; a regression makes the exit code 1."""
    summary["baseline"] = _baseline(project, pr, full)
    if summary["baseline"] and summary["baseline"].get("verdict") == "regress":
        summary["exit_code"] = 1
        summary["error"] = "held-out metrics regressed against the baseline: " + summary["baseline"]["detail"]


def _baseline(project: Path, pr: PlanResult, full: StageResult) -> dict[str, Any] | None:
    ref = pr.spec.baseline.run
    if not ref:
        return None
    from mcx.track.baseline import baseline_metrics, compare_to_baseline, resolve

    try:
        base_id = resolve(project, ref, tracking_uri=pr.spec.tracking.uri)
        base = baseline_metrics(project, base_id, tracking_uri=pr.spec.tracking.uri)
    except McxError as exc:
        return {"verdict": "unknown", "detail": str(exc), "baseline": ref}
    finals = {k: v for k, v in full.final.items() if isinstance(v, (int, float))}
    out = compare_to_baseline(finals, base, pr.spec.baseline.tolerances)
    detail = ", ".join(str(r) for r in out.get("regressed", [])) or "within tolerance"
    return {"baseline": ref, "baseline_run_id": base_id, "detail": detail, **out}


def _stage_summary(result: StageResult) -> dict[str, Any]:
    """A stage's entry in run.json's summary."""
    return {"status": result.status, "passed": bool(result.passed), "checks": result.checks,
            "control_checks": result.control_checks, "metrics": result.final, "steps": result.steps,
            "layer_spec": result.layer_spec, "error": result.error, "warnings": list(result.warnings)}


def _summary(pr: PlanResult, results: dict[str, StageResult], status: str, error: str | None, exit_code: int,
             seconds: float) -> dict[str, Any]:
    last = results.get("full") or results.get("smoke")
    final = last.final if last else {}
    return {"run_id": pr.run_id, "name": pr.spec.name, "status": status, "cached": False,
            "stages": {k: _stage_summary(v) for k, v in results.items()}, "final": final,
            "error": error, "exit_code": exit_code, "wall_time_s": seconds}


def _esc(text: Any) -> str:
    """``text`` for a Rich markup string: messages from workers, paths and errors may hold "[...]"
    (torch's "[enforce fail at ...]", a "[/data]" path), which Rich would eat or reject."""
    from rich.markup import escape

    return escape(str(text))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
