"""The metrics a comparison reports: a literal table, and how each is read from a run.

Keys are what users write in ``[baseline.tolerances]`` and what ``to_json`` emits.

How curves become one number:

- ``tail``: the mean of the last ``window`` logged values (a per-step train loss is one batch's;
  one step is noise). ``window`` is 1% of the points, at least 10, at most all of them.
- ``best``: the lowest mean over any ``window`` consecutive values (same window), so one lucky
  batch is not the "best loss". Windows holding NaN/Inf are not candidates.
- ``last`` / ``min``: the last logged value / the lowest finite one (evaluations already average
  ``eval_iters`` batches).
- ``steady``: the mean after warm-up (the first 5% of the points, at least one when there are four
  or more), so compilation in step 1 does not count; later stalls (evaluation, checkpoints) do, as
  they cost real time. NaN/Inf are left out.
- ``max``: the highest finite value (peak memory).
- ``run``: a property of the run, not a curve (wall time, GPU-hours).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate, islice
from operator import sub
from typing import Literal

from attrs import frozen

from mcx.report.metricsfile import Curve
from mcx.report.rundata import RunData

Better = Literal["lower", "higher"]
Reduce = Literal["tail", "best", "last", "min", "max", "steady", "run"]
Unit = Literal["loss", "ppl", "ratio", "rate", "tflops", "seconds", "bytes", "duration", "gpu_hours"]


@frozen
class MetricDef:
    key: str
    label: str
    curve: str | None  # the curve it summarises; None: a run property (``reduce == "run"``)
    reduce: Reduce
    better: Better
    unit: Unit


METRICS: tuple[MetricDef, ...] = (
    MetricDef("train_loss", "train loss (final)", "train/loss", "tail", "lower", "loss"),
    MetricDef("train_loss_best", "train loss (best)", "train/loss", "best", "lower", "loss"),
    MetricDef("valid_loss", "validation loss (final)", "valid/loss", "last", "lower", "loss"),
    MetricDef("valid_loss_best", "validation loss (best)", "valid/loss", "min", "lower", "loss"),
    MetricDef("test_loss", "test loss", "test/loss", "last", "lower", "loss"),
    MetricDef("valid_ppl", "validation perplexity", "valid/ppl", "last", "lower", "ppl"),
    MetricDef("test_ppl", "test perplexity", "test/ppl", "last", "lower", "ppl"),
    MetricDef("mfu", "MFU", "train/mfu", "steady", "higher", "ratio"),
    MetricDef("tokens_per_s_per_gpu", "tokens/s/GPU", "train/tokens_per_s_per_gpu", "steady", "higher", "rate"),
    MetricDef("tflops_per_gpu", "TFLOP/s/GPU", "train/tflops_per_gpu", "steady", "higher", "tflops"),
    MetricDef("step_time_s", "step time", "train/step_time_s", "steady", "lower", "seconds"),
    MetricDef("mem_peak_bytes", "peak memory/GPU", "train/mem_peak_bytes", "max", "lower", "bytes"),
    MetricDef("wall_time_s", "wall time", None, "run", "lower", "duration"),
    MetricDef("gpu_hours", "GPU-hours", None, "run", "lower", "gpu_hours"),
)
METRIC_KEYS: tuple[str, ...] = tuple(m.key for m in METRICS)
BY_KEY: dict[str, MetricDef] = {m.key: m for m in METRICS}


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


def _steady(values: Sequence[float]) -> float | None:
    n = len(values)
    skip = max(1, n // 20) if n >= 4 else 0
    vals = _finite(values[skip:])
    return math.fsum(vals) / len(vals) if vals else None


def reduce_curve(how: Reduce, c: Curve) -> float | None:
    values = c.values
    if not values:
        return None
    if how == "tail":
        return _tail(values)
    if how == "best":
        return _best(values)
    if how == "last":
        return values[-1]
    if how == "steady":
        return _steady(values)
    finite = _finite(values)
    if not finite:
        return None
    return min(finite) if how == "min" else max(finite)


def summarize(run: RunData) -> dict[str, float | None]:
    """Every metric of ``METRICS`` for one run; None where the run has no data for it."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        value: float | None = None
        if m.reduce == "run":
            value = getattr(run, m.key)
        elif m.curve in run.curves and run.curves[m.curve].values:
            value = reduce_curve(m.reduce, run.curves[m.curve])
        else:
            given = run.final.get(m.key)
            value = float(given) if isinstance(given, (int, float)) and not isinstance(given, bool) else None
        out[m.key] = value
    return out
