"""A sweep's trials before anything runs: its parameters checked against the spec, its grid, each trial's
spec, and its objective checked to be something the trials record.

Pure: Optuna proposes random and Bayesian trials (mcx.ops.sweep), mcx.ops.plan plans each one. A trial is
the spec with its parameters' values set and no [sweep] table: an ordinary run with an ordinary run ID, so a
point two sweeps share is one run.
"""

from __future__ import annotations

import itertools

import attrs
from collections.abc import Mapping
from typing import Any, Literal

from mcx.errors import SpecError
from mcx.eval.scores import eval_better, is_eval_metric
from mcx.fingerprint.config import NOT_HASHED
from mcx.metrics.summary import BY_KEY, Metric
from mcx.plan.gpus import peak_flops
from mcx.spec import ExperimentSpec
from mcx.spec.convert import structure, unstructure
from mcx.spec.keys import Key, spec_keys
from mcx.spec.rules import Problems, check_spec
from mcx.spec.schema import SweepRange, SweepSpec

# Keys left out of the run ID whose values still change the run: their content is in the ID instead.
CONTENT_KEYS = ("data.path", "data.tokenizer.path", "data.tokenizer.merges", "init.from")  # and components' paths
# Objectives that have a value at each evaluation, the pruner's intermediate values: (record kind, field).
INTERMEDIATE = {"valid_loss": ("valid", "loss"), "valid_loss_best": ("valid", "loss"), "valid_ppl": ("valid", "ppl")}


def integer_key(key: Key) -> bool:
    """Whether a key takes integers (``int`` or ``int | None``)."""
    return key.base is int


def sweepable(key: str) -> str | None:
    """Why ``key`` cannot be swept (None: it can)."""
    if key == "sweep" or key.startswith("sweep.") or key in ("name", "description"):
        return "names or describes the experiment; every trial would be the same run"
    for not_hashed, why in NOT_HASHED.items():
        if (key == not_hashed or key.startswith(not_hashed + ".")) and key not in CONTENT_KEYS:
            return f"is not part of a run's identity ({why}); every trial would be the same run"
    return None


def component_keys(spec: ExperimentSpec) -> dict[str, Key]:
    """The keys of the spec's mixture components (``data.mix.web.weight``), sweepable like any key: a trial's
    weights are the spec's with that one set, renormalised by Megatron's blend as every mixture's are (D60)."""
    fields = {"path": (str, attrs.NOTHING), "prefix": (str, "corpus"), "weight": (float, attrs.NOTHING)}
    data = spec.data
    return {f"data.{table}.{name}.{field}": Key(f"data.{table}.{name}.{field}", t, default)
            for table, mixture in (("mix", data.mix), ("valid", data.valid), ("test", data.test))
            for name in mixture for field, (t, default) in fields.items()}


def objective_metric(sweep: SweepSpec) -> Metric | None:
    return BY_KEY.get(sweep.objective)


def direction(sweep: SweepSpec) -> Literal["minimize", "maximize"]:
    if sweep.direction is not None:
        return sweep.direction
    if is_eval_metric(sweep.objective):  # a downstream score ([eval], D68)
        return "maximize" if eval_better(sweep.objective) == "higher" else "minimize"
    metric = objective_metric(sweep)
    return "maximize" if metric is not None and metric.better == "higher" else "minimize"


def check_sweep(spec: ExperimentSpec) -> Problems:
    """Every problem of ``spec``'s [sweep] that the spec's own rules cannot see: unknown or unsweepable keys,
    values a key does not take, an objective no trial records, pruning without a validation objective."""
    sw = spec.sweep
    assert sw is not None
    keys = {**spec_keys(), **component_keys(spec)}
    problems: Problems = []
    for key, values in sw.parameters.items():
        where = f'sweep.parameters."{key}"'
        if key not in keys:
            near = [k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
            problems.append((where, "is not a spec key" + (f"; did you mean \"{near[0]}\"?" if near else
                                                            "; write it as in docs/spec.md, e.g. \"train.lr\"")))
            continue
        if (why := sweepable(key)) is not None:
            problems.append((where, why))
            continue
        samples = list(values) if isinstance(values, tuple) else _range_samples(values, integer_key(keys[key]))
        if isinstance(values, SweepRange) and integer_key(keys[key]) and not all(
                float(x).is_integer() for x in (values.low, values.high, values.step or 1)):
            problems.append((where, f"{key} takes integers: low, high and step must be whole numbers"))
            continue
        for i, value in enumerate(samples):
            try:
                trial_spec(spec, {key: value})
            except SpecError as exc:
                at = f"{where}[{i}]" if isinstance(values, tuple) else f"{where}.{'low' if i == 0 else 'high'}"
                problems += [(at, f"{value!r}: {message}") for _, message in exc.problems]
    problems += _objective_problems(spec)
    return problems


def _range_samples(r: SweepRange, integer: bool) -> list[Any]:
    return [int(r.low), int(r.high)] if integer else [r.low, r.high]


def _objective_problems(spec: ExperimentSpec) -> Problems:
    sw = spec.sweep
    assert sw is not None
    if is_eval_metric(sw.objective):  # eval/<task>/<metric>: each trial's evaluation after its full stage (D68)
        problems: Problems = []
        if not spec.eval.tasks:
            problems.append(("sweep.objective", f"{sw.objective!r} is an evaluation score and this spec evaluates "
                                                "nothing; add [eval] tasks (e.g. tasks = [\"evals/quickstart_next_line\"])"))
        if sw.prune:
            problems.append(("sweep.prune", f"{sw.objective!r} is scored once, after a trial's full stage; the pruner "
                                            "needs a value at each evaluation: set sweep.prune = false"))
        return problems
    metric = objective_metric(sw)
    if metric is None:
        return [("sweep.objective", f"{sw.objective!r} is not a metric mcx records; use one of "
                                    f"{', '.join(BY_KEY)} (docs/metrics.md), or an [eval] score eval/<task>/<metric>")]
    never = never_recorded(spec, metric)
    problems = [("sweep.objective", f"{sw.objective!r} is never recorded by this spec's runs: {never}")] if never else []
    if sw.prune and sw.objective not in INTERMEDIATE:
        problems.append(("sweep.prune", f"the pruner compares trials at each evaluation, and {sw.objective!r} is not "
                                        f"evaluated along the way; use one of {', '.join(INTERMEDIATE)}, or set "
                                        "sweep.prune = false"))
    return problems


def never_recorded(spec: ExperimentSpec, metric: Metric) -> str | None:
    """Why runs of ``spec`` never record ``metric`` (None: they do)."""
    t = spec.train
    weights = [float(x) for x in spec.data.split.split(",")]
    if metric.curve and metric.curve.startswith("valid/"):
        if t.eval_interval > t.train_iters or t.eval_iters < 1:
            return (f"the first evaluation would be at step {t.eval_interval}, after the last (train.train_iters = "
                    f"{t.train_iters}); lower train.eval_interval")
        if weights[1] <= 0:
            return f"data.split {spec.data.split!r} has no validation part"
    if metric.curve and metric.curve.startswith("test/") and weights[2] <= 0:
        return f"data.split {spec.data.split!r} has no test part"
    if metric.key in ("mfu",) and peak_flops(spec.hardware.gpu, "bf16") is None:
        return f"hardware.gpu = {spec.hardware.gpu!r} has no known peak, so MFU is not computed"
    return None


def grid_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the listed values, the first key's changing slowest (the order written)."""
    keys = list(sweep.parameters)
    axes = [a for a in (sweep.parameters[k] for k in keys) if isinstance(a, tuple)]
    assert len(axes) == len(keys), "a grid lists its values"
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def trial_spec(base: ExperimentSpec, params: Mapping[str, Any]) -> ExperimentSpec:
    """``base`` with each dotted key of ``params`` set and no [sweep]: one trial's spec, checked like any spec."""
    data = _without_none(unstructure(base))
    data.pop("sweep", None)
    for key, value in params.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    spec: ExperimentSpec = structure(data, ExperimentSpec)
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems)
    return spec


def _without_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_none(v) for k, v in obj.items() if v is not None}
    return obj
