"""Every summary metric, defined once: what it summarises, how, over which window, in which unit.

A stage's curves (its metrics.jsonl: ``train/loss`` each step, ``valid/loss`` each evaluation, ...)
become one number per metric here and nowhere else. The worker writes them into the stage's
result.json ``final`` (``summarize_file``); MLflow's summary metrics, ``mcx ls``, ``mcx show`` and
the baseline gate read that, and ``mcx compare`` computes them from the same file with the same
function. Keys are what users write in ``[baseline.tolerances]``; reports print ``definition``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from itertools import accumulate, islice
from operator import sub
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from mcx.metrics.curves import Curve, read_metrics

Better = Literal["lower", "higher"]
Reduce = Literal["tail", "best", "last", "min", "max", "mean", "rate", "run"]
Unit = Literal["loss", "ppl", "ratio", "factor", "rate", "tflops", "seconds", "bytes", "duration", "gpu_hours"]

# How each reduction reads, for the definitions a report prints.
REDUCTIONS: dict[str, str] = {
    "tail": "mean of the last 1% of logged values (at least 10, at most all): one step's loss is one batch's",
    "best": "lowest mean over any run of consecutive values of the tail's window (one lucky batch is not the best)",
    "last": "the last logged value (an evaluation already averages eval_iters batches)",
    "min": "the lowest finite logged value",
    "max": "the highest finite logged value",
    "mean": "mean over the steady steps: all but the first 5% (at least one step when there are four or more), "
            "so compilation and warm-up do not count; later stalls (evaluation, checkpoints) do",
    "rate": "over the steady steps (as for step time), total work over total time: the harmonic mean of the "
            "per-step rates, so it agrees with the mean step time",
    "run": "a property of the whole run, every stage included",
}


@frozen
class Metric:
    key: str
    label: str
    curve: str | None  # the curve it summarises; None: a run property (``reduce == "run"``)
    reduce: Reduce
    better: Better
    unit: Unit
    what: str  # what the curve is, in a few words

    @property
    def definition(self) -> str:
        return f"{self.what}: {REDUCTIONS[self.reduce]}"


METRICS: tuple[Metric, ...] = (
    Metric("train_loss", "train loss (final)", "train/loss", "tail", "lower", "loss", "training loss per step"),
    Metric("train_loss_best", "train loss (best)", "train/loss", "best", "lower", "loss", "training loss per step"),
    Metric("valid_loss", "validation loss (final)", "valid/loss", "last", "lower", "loss",
           "validation loss per evaluation"),
    Metric("valid_loss_best", "validation loss (best)", "valid/loss", "min", "lower", "loss",
           "validation loss per evaluation"),
    Metric("test_loss", "test loss", "test/loss", "last", "lower", "loss", "test loss after the last step"),
    Metric("valid_ppl", "validation perplexity", "valid/ppl", "last", "lower", "ppl",
           "exp(validation loss) per evaluation"),
    Metric("test_ppl", "test perplexity", "test/ppl", "last", "lower", "ppl", "exp(test loss)"),
    Metric("mfu", "MFU", "train/mfu", "rate", "higher", "ratio",
           "model FLOPs per step over the time the GPU's dense peak would need"),
    Metric("tokens_per_s_per_gpu", "tokens/s/GPU", "train/tokens_per_s_per_gpu", "rate", "higher", "rate",
           "tokens trained per second per GPU"),
    Metric("tflops_per_gpu", "TFLOP/s/GPU", "train/tflops_per_gpu", "rate", "higher", "tflops",
           "model TFLOP per second per GPU"),
    Metric("step_time_s", "step time", "train/step_time_s", "mean", "lower", "seconds",
           "seconds per optimizer step"),
    Metric("mem_peak_bytes", "peak memory/GPU", "train/mem_peak_bytes", "max", "lower", "bytes",
           "peak allocated memory per GPU"),
    Metric("moe_expert_load", "expert load (final)", "train/moe_expert_load", "tail", "lower", "factor",
           "a mixture of experts' busiest expert's routed tokens over the mean expert's per step (1.0 is balanced)"),
    Metric("wall_time_s", "wall time", None, "run", "lower", "duration", "seconds the stages trained, added up"),
    Metric("gpu_hours", "GPU-hours", None, "run", "lower", "gpu_hours",
           "each stage's wall time times its GPUs, added up"),
)
METRIC_KEYS: tuple[str, ...] = tuple(m.key for m in METRICS)
BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}
STEADY: frozenset[str] = frozenset({"mean", "rate"})  # reductions over steady steps, which have a spread


def definitions_table() -> str:
    """The definitions as a Markdown table (docs/metrics.md holds it; a test keeps the two equal)."""
    rows = ["| key | label | better | definition |", "|---|---|---|---|"]
    rows += [f"| `{m.key}` | {m.label} | {m.better} | {m.definition} |" for m in METRICS]
    return "\n".join(rows) + "\n"


def window_size(n: int) -> int:
    return min(n, max(10, n // 100))


def _tail(values: Sequence[float]) -> float:
    w = window_size(len(values))
    return math.fsum(values[-w:]) / w


def _best(values: Sequence[float], w: int | None = None) -> float | None:
    w = w or window_size(len(values))
    if not math.isfinite(sum(values)):  # NaN/Inf poison every window holding them: use finite stretches
        best = None
        stretch: list[float] = []
        for v in (*values, math.nan):
            if math.isfinite(v):
                stretch.append(v)
                continue
            if len(stretch) >= w:
                cand = _best(stretch, w)
                best = cand if best is None or (cand is not None and cand < best) else best
            stretch = []
        return best
    sums = [0.0, *accumulate(values)]
    return min(map(sub, islice(sums, w, None), sums)) / w


def _finite(values: Sequence[float]) -> Sequence[float]:
    return values if math.isfinite(sum(values)) else [v for v in values if math.isfinite(v)]


def steady(values: Sequence[float]) -> Sequence[float]:
    """The values after warm-up (the first 5%, at least one when there are four or more), finite only."""
    n = len(values)
    skip = max(1, n // 20) if n >= 4 else 0
    return _finite(values[skip:])


def reduce_values(how: Reduce, values: Sequence[float]) -> float | None:
    """One number from a curve's values (in step order) by reduction ``how``; None when there is none."""
    if not values:
        return None
    if how == "tail":
        return _tail(values)
    if how == "best":
        return _best(values)
    if how == "last":
        return values[-1]
    if how in STEADY:
        vals = steady(values)
        if not vals:
            return None
        if how == "mean":
            return math.fsum(vals) / len(vals)
        if any(v <= 0 for v in vals):  # a zero rate (an idle step): the plain mean is the only meaningful one
            return math.fsum(vals) / len(vals)
        return len(vals) / math.fsum(1.0 / v for v in vals)
    finite = _finite(values)
    if not finite:
        return None
    return min(finite) if how == "min" else max(finite)


def spread(metric: Metric, values: Sequence[float]) -> float | None:
    """The step-to-step spread of a steady metric: half the width of the central 80% of its steady
    per-step values, relative to the metric's value. A difference smaller than it is within noise."""
    if metric.reduce not in STEADY:
        return None
    vals = steady(values)
    center = reduce_values(metric.reduce, values)
    if len(vals) < 2 or not center:
        return None
    deciles = statistics.quantiles(vals, n=10, method="inclusive")
    return (deciles[8] - deciles[0]) / 2 / abs(center)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def summarize(curves: Mapping[str, Curve], run: Mapping[str, float | None] | None = None,
              given: Mapping[str, Any] | None = None) -> dict[str, float | None]:
    """Every metric of ``METRICS``: curve metrics from ``curves``, run properties from ``run``, and
    for a curve that is absent (a run known only from its records) the value ``given`` holds."""
    run, given = run or {}, given or {}
    out: dict[str, float | None] = {}
    for m in METRICS:
        if m.reduce == "run":
            out[m.key] = _number(run.get(m.key))
        elif m.curve is not None and m.curve in curves and curves[m.curve].values:
            out[m.key] = reduce_values(m.reduce, curves[m.curve].values)
        else:
            out[m.key] = _number(given.get(m.key))
    return out


def spreads(curves: Mapping[str, Curve]) -> dict[str, float]:
    """The step-to-step spread of each steady metric the curves hold."""
    out = {}
    for m in METRICS:
        if m.reduce in STEADY and m.curve is not None and m.curve in curves:
            s = spread(m, curves[m.curve].values)
            if s is not None:
                out[m.key] = s
    return out


def summarize_file(metrics_file: Path) -> dict[str, float | None]:
    """A stage's summary metrics from its metrics.jsonl (what the worker writes as result.json ``final``).
    Run properties are the control plane's; they are not in a stage's file."""
    curves, _ = read_metrics(metrics_file)
    return {k: v for k, v in summarize(curves).items() if BY_KEY[k].reduce != "run"}
