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
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import asdict, evolve, frozen

from mcx.errors import InputError, McxError
from mcx.hashing import digest
from mcx.jsonfile import read_json, write_json_atomic
from mcx.ops.interrupts import term_interrupts
from mcx.ops.progress import Note, Progress
from mcx.track.run_summary import RunSummary
from mcx.ops.sweep_plan import (PlannedTrial, SweepOptions, budget_gate, definition_identity, distributions,
                                estimate_gpu_hours, gpu_slots, load_sweep, params_key, plan_trials, sampler_for,
                                total_trials)
from mcx.fingerprint.hardware import probe
from mcx.ops.run import run_spec, RunOptions
from mcx.ops.sweep_watch import PrunerWatch, StopWatch
from mcx.plan.planner import make_plan
from mcx.plan.sweep_trials import direction, trial_spec
from mcx.spec import dump_spec, ExperimentSpec, loads_spec
from mcx.spec.convert import unstructure
from mcx.spec.schema import SweepSpec
from mcx.track import paths
from mcx.track.errors import RunLocked
from mcx.track.mlflow_records import scalar_text
from mcx.track.runcache import acquire
from mcx.track.sweep_record import SweepRecorder

if TYPE_CHECKING:
    import optuna

    from mcx.track.sweep_record import SweepRecorder

DEFINITION = "sweep.json"
STUDY = "study.db"
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}



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
    return paths.sweeps_dir(project) / name


# -- the sweep ---------------------------------------------------------------------------------------

def sweep(spec_path: str, overrides: list[str], *, project: Path, options: SweepOptions,
          progress: Progress) -> SweepResult:
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
                        tags={"mcx.sweep.best_run": scalar_text(best.run_id) if best else "",
                              "mcx.sweep.trials": str(len(result.trials))})
        entry = recorder.close()
    notes = list(runner.notes)
    if entry.state == "pending":
        notes.append(Note(level="warning", text=f"sweep {name}: tracking store unreachable ({entry.error}); records "
                             "are spooled: run `mcx sync`"))
    return evolve(result, status=status, gpu_hours=gpu_hours, exit_code=130 if status == "interrupted" else 0,
                  notes=tuple(notes))


def _recorder(spec: ExperimentSpec, name: str, directory: Path, project: Path) -> SweepRecorder:
    """The sweep's MLflow parent run (mcx.track.sweep_record), its definition as params."""
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


def open_study(directory: Path, name: str, spec: ExperimentSpec, *, create: bool) -> optuna.Study:
    import optuna

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
        assert spec.sweep is not None  # a sweep's spec has its [sweep] table
        self.sweep: SweepSpec = spec.sweep
        self.study = open_study(directory, name, spec, create=True)
        self.total = total_trials(spec)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.notes: list[Note] = []
        self.smoke_passed: set[str] = set()
        self.planned_ids = {params_key(t.params): t.run_id for t in planned}
        if self.sweep.method == "grid":  # its points in the order written; those of a longer grid too
            seen = {params_key(t.params or t.system_attrs.get("fixed_params", {}))  # waiting: enqueued before
                    for t in self.study.get_trials(deepcopy=False)}
            for t in planned:
                if params_key(t.params) not in seen:
                    self.study.enqueue_trial(t.params)

    def run(self) -> str:
        import optuna

        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        # trials an interrupted sweep left running, taken up again (Optuna keeps a trial's storage ID private;
        # its own code rebuilds a Trial from it the same way)
        resumed = [optuna.trial.Trial(self.study, t._trial_id) for t in running]
        self.smoke_passed = {t.user_attrs["smoke"] for t in self.study.trials if t.user_attrs.get("smoke_passed")}
        parallel = self.sweep.parallel
        futures: set[Future[None]] = set()
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="trial") as pool, term_interrupts():
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
            except BaseException:  # a trial's thread broke: the others stop too (checkpointed), then it is raised
                self.stop.set()
                raise
        return "interrupted" if self.stop.is_set() else "finished"

    def _ask(self) -> optuna.trial.Trial | None:
        """The next new trial, or None once the sweep has its number of trials."""
        import optuna

        with self.lock:
            counted = [t for t in self.study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING]
            if len(counted) >= self.total:
                return None
            if self.sweep.method != "grid":
                self.study.sampler = sampler_for(self.spec, len(counted))
            return self.study.ask(distributions(self.spec))

    def _run_trial(self, trial: optuna.trial.Trial) -> None:
        with self.lock:  # a free set of GPUs for the trial's workers, given back when it ends
            devices = self.slots.pop() if self.slots else None
        try:
            self._trial(trial, devices)
        finally:
            if devices is not None and self.slots is not None:
                with self.lock:
                    self.slots.append(devices)

    def _trial(self, trial: optuna.trial.Trial, devices: tuple[str, ...] | None) -> None:
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
        planned_id = self.planned_ids.get(params_key(params))
        if planned_id is None:  # a trial not known up front (a Bayesian search's): planned now
            from mcx.ops.plan import plan_loaded

            planned_id = plan_loaded(trial_spec(self.spec, params), self.project, require_data=False).run_id
        trial.set_user_attr("run_id", planned_id)  # `mcx sweep show` names the run while it trains
        watch = PrunerWatch(trial, self.sweep, self.stop) if self.sweep.prune else StopWatch(self.stop)
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
        assert isinstance(summary, RunSummary)  # a trial trains: never a dry run
        run_id, status = summary.run_id, summary.status
        if planned_id is not None and run_id != planned_id:
            progress(Note(level="warning", text=f"ran as run {run_id}, not {planned_id} as planned when the sweep "
                                                "started: the project's code or data changed since (the run's ID "
                                                "holds what it ran with)"))
        trial.set_user_attr("run_id", run_id)
        trial.set_user_attr("cached", summary.cached)
        smoke_passed = ("smoke" in summary.stages and summary.stages["smoke"].passed) or skip
        if smoke is not None:
            trial.set_user_attr("smoke", smoke)
            trial.set_user_attr("smoke_passed", smoke_passed)
            if smoke_passed:
                with self.lock:
                    self.smoke_passed.add(smoke)
        if status == "interrupted":
            return  # stays running: the next `mcx sweep` trains it on from its checkpoint
        if status == "pruned":
            self._tell(trial, "pruned", detail=summary.error)
        elif status == "finished":
            value = summary.final.get(self.sweep.objective)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._tell(trial, "complete", value=float(value))
            else:
                self._tell(trial, "failed", detail=f"run {run_id} finished without a {self.sweep.objective}")
        else:
            self._tell(trial, "failed", detail=summary.error or f"run {run_id} ended {status}")
        progress(Note(text=f"{status}, run {run_id}" + (" (already trained)" if summary.cached else "")))

    def _tell(self, trial: optuna.trial.Trial, state: str, *, value: float | None = None, detail: str | None = None) -> None:
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
        tspec = trial_spec(self.spec, params)
        if not tspec.smoke.enabled:
            return None
        try:
            smoke = make_plan(tspec, te_available=False).stage("smoke")
        except McxError:
            return None
        return digest({"spec": unstructure(smoke.spec), "layout": smoke.layout.job_dict()})


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


def _trial(t: optuna.trial.FrozenTrial) -> Trial:
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
