"""A sweep before anything runs (`mcx sweep`, `--dry-run`): its trials known up front, drawn exactly as the
sweep draws them (Optuna's samplers seeded by trial), each planned with its run ID and GPU-hours, the GPUs
each concurrent trial gets, the budget gate, and what makes two sweeps the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from mcx.contract.job import Output
from mcx.errors import BudgetError, InputError, SpecError
from mcx.fingerprint.config import canonical_config
from mcx.hashing import digest
from mcx.ops.plan import plan_loaded
from mcx.plan.sweep_trials import check_sweep, grid_points, integer_key, trial_spec
from mcx.spec import ExperimentSpec, load_spec
from mcx.spec.convert import unstructure
from mcx.spec.keys import spec_keys
from mcx.track.runcache import lookup

if TYPE_CHECKING:
    import optuna

TPE_STARTUP = 10  # Optuna's TPESampler default: random trials before the model proposes


@frozen(kw_only=True)
class SweepOptions:
    yes: bool = False  # confirm a sweep over budget.max_gpu_hours
    dry_run: bool = False
    output: Output = "quiet"  # each trial's worker display (bar | quiet | json)
    confirm: Callable[[str], bool] | None = None  # asked when over budget without --yes; None: refuse
    verify_data: bool = False


def load_sweep(spec_path: str, overrides: list[str]) -> ExperimentSpec:
    """The spec, its [sweep] checked against it (SpecError naming every problem)."""
    spec = load_spec(spec_path, overrides)
    if spec.sweep is None:
        raise InputError(f"{spec_path} has no [sweep] table;", "add one (docs/sweeps.md), or train the spec with "
                         "`mcx run`.")
    problems = check_sweep(spec)
    if problems:
        raise SpecError(problems, spec_path)
    return spec


def total_trials(spec: ExperimentSpec) -> int:
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


def sampler_for(spec: ExperimentSpec, number: int) -> optuna.samplers.BaseSampler:
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
    out = []
    for params in proposals(spec):
        tspec = trial_spec(spec, params)
        # at launch, what this machine lacks for a trial (its data...) is a problem before anything is written
        planned = plan_loaded(tspec, project, require_data=False, at_launch=not options.dry_run,
                              verify_data=options.verify_data)
        cached = planned.run_id is not None and lookup(project, planned.run_id).state == "finished"
        here = planned.plan.full.device == "cuda" and tspec.launch.kind != "slurm"
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
    hours = [t.gpu_hours for t in planned if t.gpu_hours is not None]
    if not planned or len(hours) < len(planned):
        return None
    unknown = total_trials(spec) - len(planned)
    return sum(h for t, h in zip(planned, hours) if not t.cached) + unknown * max(hours)


def budget_gate(spec: ExperimentSpec, gpu_hours: float | None, options: SweepOptions) -> None:
    """Over budget.max_gpu_hours: go on only with --yes or the user's confirmation; else BudgetError (exit 2),
    before anything is written."""
    limit = spec.budget.max_gpu_hours
    if limit is None or gpu_hours is None or gpu_hours <= limit or options.yes:
        return
    message = (f"the sweep may use about {gpu_hours:,.1f} GPU-hours over {total_trials(spec)} trials, above "
               f"budget.max_gpu_hours = {limit:,.1f}")
    if options.confirm is not None and options.confirm(message + "."):
        return
    raise BudgetError(message + ";", "lower sweep.max_trials or the trials' size, raise budget.max_gpu_hours, or "
                      "confirm with --yes.")



def definition_identity(spec: ExperimentSpec) -> str:
    """What makes two sweeps the same: the trials' config (as a run ID hashes it) and how trials are chosen."""
    sw = spec.sweep
    assert sw is not None
    chosen = {k: v for k, v in unstructure(sw).items() if k not in ("max_trials", "parallel", "name")}
    return digest({"config": canonical_config(evolve(spec, sweep=None)), "sweep": chosen})


def params_key(params: dict[str, Any]) -> str:
    return digest({k: params[k] for k in sorted(params)})
