"""`mcx sweep`: many runs as one experiment, each trial an ordinary, content-addressed run.

Optuna (D43) proposes the trials and keeps their states in SQLite under ``.mcx/sweeps/<name>/``; mcx plans
every trial it can know up front and gates the whole sweep's GPU-hours before anything runs, runs each trial
with `mcx run`'s own machinery (so a point trained before, by this sweep or another, comes from the run
cache), prunes trials through the run's watch, and resumes an interrupted sweep where it stopped: a trial
left running trains on from its own checkpoint.

Proposals are a function of the sweep alone: a grid's points are enqueued in the order written; a random
or Bayesian trial is drawn by a sampler seeded with (``sweep.seed``, trial number), so the same sweep proposes
the same trials, uninterrupted or resumed (a Bayesian trial after the random start-up also depends on the
results before it, and with ``parallel`` > 1 on which of them had finished).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from attrs import asdict, evolve, frozen

from mcx.errors import InputError, McxError, SpecError
from mcx.hashing import digest
from mcx.jsonfile import read_json, write_json_atomic
from mcx.ops.progress import Note, Progress
from mcx.spec import ExperimentSpec, dump_spec, load_spec

DEFINITION = "sweep.json"
STUDY = "study.db"
TPE_STARTUP = 10  # Optuna's TPESampler default: random trials before the model proposes
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}


@frozen(kw_only=True)
class SweepOptions:
    yes: bool = False  # confirm a sweep over budget.max_gpu_hours
    dry_run: bool = False
    output: str = "quiet"  # each trial's worker display (bar | quiet | json)
    confirm: Callable[[str], bool] | None = None  # asked when over budget without --yes; None: refuse
    verify_data: bool = False


@frozen(kw_only=True)
class Trial:
    number: int
    params: dict[str, Any]
    state: str  # planned | complete | pruned | failed | running
    value: float | None = None
    run_id: str | None = None
    cached: bool = False  # trained before (this sweep's earlier attempt, or another sweep or run)
    gpu_hours: float | None = None  # planned
    detail: str | None = None  # why it failed, where it was pruned


@frozen(kw_only=True)
class SweepResult:
    name: str
    status: str  # planned | finished | interrupted
    method: str
    objective: str
    direction: str
    parameters: tuple[str, ...]
    trials: tuple[Trial, ...]  # best first, then the rest by number
    max_trials: int
    gpu_hours: float | None = None  # the plan's estimate for the whole sweep
    exit_code: int = 0
    notes: tuple[Note, ...] = ()

    @property
    def best(self) -> Trial | None:
        return next((t for t in self.trials if t.state == "complete" and t.value is not None), None)

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {"name": self.name, "status": self.status, "method": self.method, "objective": self.objective,
                "direction": self.direction, "parameters": list(self.parameters), "max_trials": self.max_trials,
                "gpu_hours": self.gpu_hours, "exit_code": self.exit_code,
                "best": asdict(best) if best else None, "trials": [asdict(t) for t in self.trials]}


def sweep_dir(project: Path, name: str) -> Path:
    from mcx.track import paths

    return paths.sweeps_dir(project) / name


# -- planning ----------------------------------------------------------------------------------------

def load_sweep(spec_path: str, overrides: list[str]) -> ExperimentSpec:
    """The spec, its [sweep] checked against it (SpecError naming every problem)."""
    from mcx.plan.sweep import check_sweep

    spec = load_spec(spec_path, overrides)
    if spec.sweep is None:
        raise InputError(f"{spec_path} has no [sweep] table;", "add one (docs/sweeps.md), or train the spec with "
                         "`mcx run`.")
    problems = check_sweep(spec)
    if problems:
        raise SpecError(problems, spec_path)
    return spec


def total_trials(spec: ExperimentSpec) -> int:
    from mcx.plan.sweep import grid_points

    sw = spec.sweep
    assert sw is not None
    if sw.method == "grid":
        points = len(grid_points(sw))
        return points if sw.max_trials is None else min(points, sw.max_trials)
    assert sw.max_trials is not None
    return sw.max_trials


def proposals(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """The trials known before any result: a grid's points, a random search's every trial, a Bayesian
    search's random start-up; drawn exactly as the sweep itself draws them."""
    from mcx.plan.sweep import grid_points

    sw = spec.sweep
    assert sw is not None
    n = total_trials(spec)
    if sw.method == "grid":
        return grid_points(sw)[:n]
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize")
    out = []
    for number in range(n if sw.method == "random" else min(n, TPE_STARTUP)):
        study.sampler = sampler_for(spec, number)
        out.append(dict(study.ask(distributions(spec)).params))
    return out


def sampler_for(spec: ExperimentSpec, number: int):
    """The sampler that draws trial ``number``: seeded with the sweep's seed and the number."""
    import optuna

    sw = spec.sweep
    assert sw is not None
    seed = int(digest({"seed": sw.seed, "trial": number})[:8], 16)
    if sw.method == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=TPE_STARTUP)
    return optuna.samplers.RandomSampler(seed=seed)


def distributions(spec: ExperimentSpec) -> dict[str, Any]:
    """Each parameter as an Optuna distribution: listed values are categorical; a range is an integer one
    for a key that takes integers, else a float one."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from mcx.plan.sweep import integer_key
    from mcx.spec.keys import spec_keys

    sw = spec.sweep
    assert sw is not None
    keys = spec_keys()
    out: dict[str, Any] = {}
    for key, values in sw.parameters.items():
        if isinstance(values, tuple):
            out[key] = CategoricalDistribution(values)
        elif integer_key(keys[key]):
            out[key] = IntDistribution(int(values.low), int(values.high), log=values.log, step=int(values.step or 1))
        else:
            out[key] = FloatDistribution(values.low, values.high, log=values.log, step=values.step)
    return out


@frozen
class PlannedTrial:
    params: dict[str, Any]
    spec: ExperimentSpec
    run_id: str | None
    gpu_hours: float | None
    cached: bool
    local_gpus: int = 0  # the GPUs of this machine its full stage uses (0: CPU, or a Slurm job)


def plan_trials(spec: ExperimentSpec, project: Path, options: SweepOptions) -> list[PlannedTrial]:
    """Each known trial's spec, run ID (None where its data is not here) and GPU-hours."""
    from mcx.ops.plan import plan_loaded
    from mcx.ops.stage import stage_device
    from mcx.plan.sweep import trial_spec
    from mcx.track.runcache import lookup

    out = []
    for params in proposals(spec):
        tspec = trial_spec(spec, params)
        # at launch, what this machine lacks for a trial (its data...) is a problem before anything is written
        planned = plan_loaded(tspec, project, require_data=False, at_launch=not options.dry_run,
                              verify_data=options.verify_data)
        cached = planned.run_id is not None and lookup(project, planned.run_id).state == "finished"
        here = stage_device(tspec, planned) == "cuda" and tspec.launch.kind != "slurm"
        out.append(PlannedTrial(params, tspec, planned.run_id, planned.plan.cost.gpu_hours, cached,
                                planned.plan.layout.world_size if here else 0))
    return out


def gpu_slots(spec: ExperimentSpec, planned: list[PlannedTrial], visible: list[str]) -> list[tuple[str, ...]] | None:
    """The GPUs each trial running at once gets (CUDA_VISIBLE_DEVICES), ``parallel`` disjoint sets of this
    machine's ``visible`` GPUs; None where the trials take none of them (CPU trials, Slurm jobs).
    InputError when ``parallel`` trials do not fit."""
    sw = spec.sweep
    assert sw is not None
    need = max((t.local_gpus for t in planned), default=0)
    if need == 0:
        return None
    if sw.parallel == 1:
        return [tuple(visible)]  # as `mcx run` would: whatever the environment shows
    if sw.parallel * need > len(visible):
        fits = len(visible) // need
        raise InputError(f"sweep.parallel = {sw.parallel} runs {sw.parallel} trials of {need} GPU(s) at once, and "
                         f"this machine shows {len(visible)} GPU(s);", f"set sweep.parallel to at most {max(fits, 1)}, "
                         "or run the trials as Slurm jobs (launch.kind = \"slurm\").")
    return [tuple(visible[i * need:(i + 1) * need]) for i in range(sw.parallel)]


def estimate_gpu_hours(spec: ExperimentSpec, planned: list[PlannedTrial]) -> float | None:
    """The sweep's GPU-hours: the planned trials not yet trained, and each trial not known up front (a
    Bayesian search's) at the most any planned trial costs. None where a trial's cost is unknown."""
    hours = [t.gpu_hours for t in planned]
    if not hours or any(h is None for h in hours):
        return None
    unknown = total_trials(spec) - len(planned)
    return sum(h for t, h in zip(planned, hours) if not t.cached) + unknown * max(hours)


def budget_gate(spec: ExperimentSpec, gpu_hours: float | None, options: SweepOptions) -> None:
    """Over budget.max_gpu_hours: go on only with --yes or the user's confirmation; else BudgetError (exit 2),
    before anything is written."""
    from mcx.errors import BudgetError

    limit = spec.budget.max_gpu_hours
    if limit is None or gpu_hours is None or gpu_hours <= limit or options.yes:
        return
    message = (f"the sweep may use about {gpu_hours:,.1f} GPU-hours over {total_trials(spec)} trials, above "
               f"budget.max_gpu_hours = {limit:,.1f}")
    if options.confirm is not None and options.confirm(message + "."):
        return
    raise BudgetError(message + ";", "lower sweep.max_trials or the trials' size, raise budget.max_gpu_hours, or "
                      "confirm with --yes.")


# -- the sweep ---------------------------------------------------------------------------------------

def sweep(spec_path: str, overrides: list[str], *, project: Path, options: SweepOptions,
          progress: Progress) -> SweepResult:
    from mcx.plan.sweep import direction

    spec = load_sweep(spec_path, overrides)
    sw = spec.sweep
    assert sw is not None
    name = sw.name or spec.name
    planned = plan_trials(spec, project, options)
    slots = gpu_slots(spec, planned, _visible_gpus())
    gpu_hours = estimate_gpu_hours(spec, planned)
    if not options.dry_run:  # as `mcx run --dry-run`: the plan says the cost, nothing asks
        budget_gate(spec, gpu_hours, options)
    if options.dry_run:
        trials = tuple(Trial(number=i, params=t.params, state="planned", run_id=t.run_id, cached=t.cached,
                             gpu_hours=t.gpu_hours) for i, t in enumerate(planned))
        return SweepResult(name=name, status="planned", method=sw.method, objective=sw.objective,
                           direction=direction(sw), parameters=tuple(sw.parameters), trials=trials,
                           max_trials=total_trials(spec), gpu_hours=gpu_hours)
    directory = sweep_dir(project, name)
    from mcx.track.errors import RunLocked
    from mcx.track.runcache import acquire

    try:
        lock = acquire(directory)
    except RunLocked as exc:
        raise McxError(f"sweep {name} is running in {exc.holder.describe() if exc.holder else 'another process'};",
                       "wait for it, or give this one another sweep.name.") from None
    with lock:
        _record_definition(directory, spec, name)
        recorder = _recorder(spec, name, directory, project)
        runner = _Runner(spec, name, directory, project, options, progress, planned, recorder, slots)
        status = runner.run()
        result = show(name, project)
        best = result.best
        recorder.finish("finished" if status == "finished" else "interrupted",
                        tags={"mcx.sweep.best_run": best.run_id if best else "", "mcx.sweep.trials": len(result.trials)})
        entry = recorder.close()
    notes = list(runner.notes)
    if entry.state == "pending":
        notes.append(Note(level="warning", text=f"sweep {name}: tracking store unreachable ({entry.error}); records "
                             "are spooled: run `mcx sync`"))
    return evolve(result, status=status, gpu_hours=gpu_hours, exit_code=130 if status == "interrupted" else 0,
                  notes=tuple(notes))


def _recorder(spec: ExperimentSpec, name: str, directory: Path, project: Path):
    """The sweep's MLflow parent run (mcx.track.sweep_record), its definition as params."""
    from mcx.track.sweep_record import SweepRecorder

    sw = spec.sweep
    assert sw is not None
    recorder = SweepRecorder.for_sweep(project, directory, name, spec.tracking.experiment or spec.name,
                                       spec.tracking.uri, definition_identity(spec))
    definition = {"method": sw.method, "objective": sw.objective, "direction": sw.direction or "",
                  "max_trials": total_trials(spec), "parallel": sw.parallel, "seed": sw.seed, "prune": sw.prune,
                  **{f"parameters.{k}": list(v) if isinstance(v, tuple) else asdict(v)
                     for k, v in sw.parameters.items()}}
    recorder.start(definition=definition, tags={"mcx.sweep.method": sw.method, "mcx.sweep.objective": sw.objective})
    return recorder


def _visible_gpus() -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names them (nvidia-smi's indices, the environment's
    selection kept)."""
    from mcx.fingerprint.hardware import probe

    return [str(i) for i in probe()["visible"]]


def _record_definition(directory: Path, spec: ExperimentSpec, name: str) -> None:
    """sweep.json: the spec that defines the sweep, the latest one. A sweep of this name defined otherwise is
    refused (its trials would not belong to this definition); how many trials and how many at once may
    change (a longer random search, more GPUs), and so may what no run's ID holds (descriptions, tracking)."""
    identity = definition_identity(spec)
    found = read_json(directory / DEFINITION)
    if isinstance(found, dict) and found.get("identity") != identity:
        raise InputError(f"sweep {name} was started from another definition ({directory / DEFINITION});",
                         "give this one another sweep.name, or remove that directory to start it over.")
    created = found.get("created") if isinstance(found, dict) else None
    write_json_atomic(directory / DEFINITION, {"name": name, "identity": identity, "spec": dump_spec(spec),
                                               "created": created or time.time()})


def definition_identity(spec: ExperimentSpec) -> str:
    """What makes two sweeps the same: the trials' config (as a run ID hashes it) and how trials are chosen."""
    from mcx.fingerprint.config import canonical_config
    from mcx.spec.convert import unstructure

    sw = spec.sweep
    assert sw is not None
    chosen = {k: v for k, v in unstructure(sw).items() if k not in ("max_trials", "parallel", "name")}
    return digest({"config": canonical_config(evolve(spec, sweep=None)), "sweep": chosen})


def open_study(directory: Path, name: str, spec: ExperimentSpec, *, create: bool):
    import optuna

    from mcx.plan.sweep import direction

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{directory / STUDY}"
    if not create:
        return optuna.load_study(study_name=name, storage=storage)
    sw = spec.sweep
    assert sw is not None
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=sw.prune_startup_trials,
                                          n_warmup_steps=sw.prune_warmup_evals)
              if sw.prune else optuna.pruners.NopPruner())
    return optuna.create_study(storage=storage, study_name=name, direction=direction(sw), pruner=pruner,
                               load_if_exists=True)


class _Runner:
    """Runs a sweep's trials, ``parallel`` at a time, until it has its number of them."""

    def __init__(self, spec: ExperimentSpec, name: str, directory: Path, project: Path, options: SweepOptions,
                 progress: Progress, planned: list[PlannedTrial], recorder: Any,
                 slots: list[tuple[str, ...]] | None) -> None:
        self.spec, self.name, self.directory, self.project = spec, name, directory, project
        self.recorder = recorder
        self.slots = list(slots) if slots is not None else None  # free GPU sets; None: trials take no GPUs here
        self.options, self.progress = options, progress
        self.sweep = spec.sweep
        self.study = open_study(directory, name, spec, create=True)
        self.total = total_trials(spec)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.notes: list[Note] = []
        self.smoke_passed: set[str] = set()
        self.planned_ids = {_params_key(t.params): t.run_id for t in planned}
        if self.sweep.method == "grid":  # its points in the order written; those of a longer grid too
            seen = {_params_key(t.params or t.system_attrs.get("fixed_params", {}))  # waiting: enqueued before
                    for t in self.study.get_trials(deepcopy=False)}
            for t in planned:
                if _params_key(t.params) not in seen:
                    self.study.enqueue_trial(t.params)

    def run(self) -> str:
        import optuna

        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        resumed = [optuna.trial.Trial(self.study, t._trial_id) for t in running]  # left by an interrupted sweep
        self.smoke_passed = {t.user_attrs["smoke"] for t in self.study.trials if t.user_attrs.get("smoke_passed")}
        parallel = self.sweep.parallel
        futures: set[Future] = set()
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="trial") as pool, _term_interrupts():
            try:
                while True:
                    while len(futures) < parallel and not self.stop.is_set():
                        trial = resumed.pop(0) if resumed else self._ask()
                        if trial is None:
                            break
                        futures.add(pool.submit(self._run_trial, trial))
                    if not futures:
                        break
                    done, futures = wait(futures, timeout=1.0, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()
            except KeyboardInterrupt:
                self.stop.set()
                self.progress(Note(level="warning", lead=f"sweep {self.name}", text=": interrupted; the running trials "
                                   "save a checkpoint and stop. `mcx sweep` of this spec again resumes them"))
                wait(futures)
                return "interrupted"
        return "interrupted" if self.stop.is_set() else "finished"

    def _ask(self):
        """The next new trial, or None once the sweep has its number of trials."""
        import optuna

        with self.lock:
            counted = [t for t in self.study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING]
            if len(counted) >= self.total:
                return None
            if self.sweep.method != "grid":
                self.study.sampler = sampler_for(self.spec, len(counted))
            return self.study.ask(distributions(self.spec))

    def _run_trial(self, trial) -> None:
        with self.lock:  # a free set of GPUs for the trial's workers, given back when it ends
            devices = self.slots.pop() if self.slots else None
        try:
            self._trial(trial, devices)
        finally:
            if devices is not None:
                with self.lock:
                    self.slots.append(devices)

    def _trial(self, trial, devices: tuple[str, ...] | None) -> None:
        from mcx.ops.run import RunOptions, run_spec
        from mcx.plan.sweep import trial_spec

        number, params = trial.number, dict(trial.params)
        label = f"trial {number}"
        smoke = self._smoke_key(params)
        skip = smoke is not None and smoke in self.smoke_passed

        def progress(event: Any) -> None:
            if isinstance(event, Note):
                event = (evolve(event, lead=f"{label} {event.lead}") if event.lead
                         else evolve(event, lead=label, text=": " + event.text.lstrip(": ")))
            self.progress(event)

        progress(Note(text=", ".join(f"{k} = {v!r}" for k, v in params.items())
                      + ("; smoke stage passed by an earlier trial of this sweep" if skip else "")))
        planned_id = self.planned_ids.get(_params_key(params))
        if planned_id is None:  # a trial not known up front (a Bayesian search's): planned now
            from mcx.ops.plan import plan_loaded

            planned_id = plan_loaded(trial_spec(self.spec, params), self.project, require_data=False).run_id
        trial.set_user_attr("run_id", planned_id)  # `mcx sweep show` names the run while it trains
        watch = _PrunerWatch(trial, self.sweep, self.stop) if self.sweep.prune else _StopWatch(self.stop)
        options = RunOptions(yes=True, output=self.options.output if self.sweep.parallel == 1 else "quiet",
                             skip_smoke=skip, verify_data=self.options.verify_data, watch=watch,
                             devices=devices if self.sweep.parallel > 1 else None)
        try:
            result = run_spec(trial_spec(self.spec, params), project=self.project, options=options, progress=progress)
        except McxError as exc:
            self._tell(trial, "failed", detail=str(exc))
            progress(Note(level="error", text=f"failed before it trained: {exc}"))
            return
        summary = result.summary
        run_id, status = summary.get("run_id"), summary.get("status")
        if planned_id is not None and run_id != planned_id:
            progress(Note(level="warning", text=f"ran as run {run_id}, not {planned_id} as planned when the sweep "
                                                "started: the project's code or data changed since (the run's ID "
                                                "holds what it ran with)"))
        trial.set_user_attr("run_id", run_id)
        trial.set_user_attr("cached", bool(summary.get("cached")))
        smoke_passed = bool(((summary.get("stages") or {}).get("smoke") or {}).get("passed")) or skip
        if smoke is not None:
            trial.set_user_attr("smoke", smoke)
            trial.set_user_attr("smoke_passed", smoke_passed)
            if smoke_passed:
                with self.lock:
                    self.smoke_passed.add(smoke)
        if status == "interrupted":
            return  # stays running: the next `mcx sweep` trains it on from its checkpoint
        if status == "pruned":
            self._tell(trial, "pruned", detail=summary.get("error"))
        elif status == "finished":
            value = (summary.get("final") or {}).get(self.sweep.objective)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._tell(trial, "complete", value=float(value))
            else:
                self._tell(trial, "failed", detail=f"run {run_id} finished without a {self.sweep.objective}")
        else:
            self._tell(trial, "failed", detail=summary.get("error") or f"run {run_id} ended {status}")
        progress(Note(text=f"{status}, run {run_id}" + (" (already trained)" if summary.get("cached") else "")))

    def _tell(self, trial, state: str, *, value: float | None = None, detail: str | None = None) -> None:
        import optuna

        if detail:
            trial.set_user_attr("detail", detail[:500])
        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "failed": optuna.trial.TrialState.FAIL}
        with self.lock:
            self.study.tell(trial, value if state == "complete" else None, state=states[state])
            run_id = trial.user_attrs.get("run_id")
            if run_id:
                self.recorder.trial(trial.number, run_id, state, value)
                self.recorder.flush()

    def _smoke_key(self, params: dict[str, Any]) -> str | None:
        """What the trial's smoke stage trains (its job spec and layout): trials that share it run it once."""
        from mcx.plan.planner import make_plan
        from mcx.plan.stages import stage_spec
        from mcx.plan.sweep import trial_spec
        from mcx.spec.convert import unstructure

        tspec = trial_spec(self.spec, params)
        if not tspec.smoke.enabled:
            return None
        try:
            plan = make_plan(tspec, te_available=False)
            job_spec, layout = stage_spec(tspec, plan.layout, "smoke", te_available=False, vocab_size=plan.vocab_size)
        except McxError:
            return None
        return digest({"spec": unstructure(job_spec), "layout": layout.job_dict()})


def _params_key(params: dict[str, Any]) -> str:
    return digest({k: params[k] for k in sorted(params)})


@contextmanager
def _term_interrupts() -> Iterator[None]:
    """While inside, SIGTERM interrupts the sweep as Ctrl-C does (a scheduler's or a user's kill): the trials
    save a checkpoint and stop instead of being left to run on without their sweep. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _StopWatch:
    """Ends a trial's stage when the sweep is interrupted (Ctrl-C reaches the main thread only)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, stage: str, stage_path: Path):
        from mcx.ops.stage import Stop

        if self.stop.is_set():
            return Stop("interrupted", "the sweep was interrupted; `mcx sweep` again trains this trial on")
        return None


class _PrunerWatch(_StopWatch):
    """Reports the full stage's validation objective at each evaluation to Optuna and stops the trial when
    the median pruner says so (Optuna's MedianPruner: worse than the median of the earlier trials at the
    same evaluation, after ``sweep.prune_warmup_evals`` evaluations and ``sweep.prune_startup_trials``
    trials)."""

    def __init__(self, trial, sweep, stop: threading.Event) -> None:
        from mcx.plan.sweep import INTERMEDIATE

        super().__init__(stop)
        self.trial, self.kind, self.field = trial, *INTERMEDIATE[sweep.objective]
        self.offset, self.evals = 0, 0

    def __call__(self, stage: str, stage_path: Path):
        from mcx.ops.stage import Stop

        stopped = super().__call__(stage, stage_path)
        if stopped is not None or stage != "full":
            return stopped
        for record in self._new_records(stage_path / "metrics.jsonl"):
            if record.get("kind") != self.kind or not isinstance(record.get(self.field), (int, float)):
                continue
            self.evals += 1
            value = float(record[self.field])
            self.trial.report(value, self.evals)
            if self.trial.should_prune():
                return Stop("pruned", f"pruned at step {record.get('step')} (evaluation {self.evals}): {self.field} "
                                      f"{value:.4f} trails the median of the earlier trials there")
        return None

    def _new_records(self, path: Path) -> list[dict[str, Any]]:
        from mcx.metrics.curves import parse_records

        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next look
        self.offset += len(complete)
        try:
            return parse_records(complete, str(path))[0]
        except InputError:  # a damaged line: the run's own reading reports it; the pruner goes without
            return []


# -- reading a sweep ---------------------------------------------------------------------------------

def show(name: str, project: Path) -> SweepResult:
    """A recorded sweep: its trials, best first (SweepResult.status: finished, or running when trials
    remain or run)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise InputError(f"{name!r} is not a sweep name;", "`mcx sweep ls` lists the sweeps here.")
    directory = sweep_dir(project, name)
    definition = read_json(directory / DEFINITION)
    if not isinstance(definition, dict) or not (directory / STUDY).is_file():
        known = sorted(p.name for p in directory.parent.iterdir()) if directory.parent.is_dir() else []
        raise InputError(f"no sweep {name} in this project;", "sweeps here: " + (", ".join(known) or "none") + ".")
    from mcx.plan.sweep import direction
    from mcx.spec import loads_spec

    spec = loads_spec(definition["spec"], str(directory / DEFINITION))
    sw = spec.sweep
    assert sw is not None
    study = open_study(directory, name, spec, create=False)
    trials = [_trial(t) for t in study.get_trials(deepcopy=False)]
    sign = -1.0 if direction(sw) == "maximize" else 1.0
    ranked = sorted(trials, key=lambda t: (t.state != "complete" or t.value is None,
                                           sign * (t.value if t.value is not None else 0.0), t.number))
    finished = sum(t.state in ("complete", "pruned", "failed") for t in trials)
    total = total_trials(spec)
    return SweepResult(name=name, status="finished" if finished >= total else "running", method=sw.method,
                       objective=sw.objective, direction=direction(sw), parameters=tuple(sw.parameters),
                       trials=tuple(t for t in ranked if t.state != "waiting"), max_trials=total)


def _trial(t) -> Trial:
    attrs_ = t.user_attrs
    return Trial(number=t.number, params=dict(t.params), state=STATES.get(t.state.name, t.state.name.lower()),
                 value=t.value, run_id=attrs_.get("run_id"), cached=bool(attrs_.get("cached")),
                 detail=attrs_.get("detail"))


def best_run(name: str, project: Path) -> str:
    """The run ID of a sweep's best complete trial."""
    best = show(name, project).best
    if best is None or best.run_id is None:
        raise InputError(f"sweep {name} has no complete trial yet;", "run it (`mcx sweep SPEC`) first.")
    return best.run_id


def list_sweeps(project: Path) -> list[str]:
    root = sweep_dir(project, "x").parent
    return sorted(p.name for p in root.iterdir() if (p / DEFINITION).is_file()) if root.is_dir() else []
