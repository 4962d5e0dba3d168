"""Fitting a long curve into a chart's pixel columns.

A chart ``W`` pixels wide cannot show more than about ``W`` distinct x positions, so a 10,000-step
curve is cut into ``buckets`` equal step ranges, each drawn as the mean of its points (the line)
and, when asked, their min and max (a faint band, so spikes stay visible). Means come from one
prefix sum per curve and bucket edges from bisection, so the cost is O(points) in C plus
O(buckets) in Python; min/max per bucket are C-level slices. Curves with at most ``2 * buckets``
points are returned as they are.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from functools import partial
from itertools import accumulate, islice

from attrs import frozen


@frozen
class Reduced:
    xs: list[float]
    ys: list[float]  # the line: raw values, or the mean per bucket
    lo: list[float] | None = None  # per-bucket min and max (None for raw curves or without envelope)
    hi: list[float] | None = None
    raw: bool = True  # True when xs/ys are the curve's own points


def finite_points(steps: Sequence[int], values: Sequence[float]) -> tuple[Sequence[int], Sequence[float]]:
    """The points with a finite value (NaN/Inf cannot be placed on an axis)."""
    if math.isfinite(sum(values)):
        return steps, values
    keep = [i for i, v in enumerate(values) if math.isfinite(v)]
    return [steps[i] for i in keep], [values[i] for i in keep]


def reduce_points(steps: Sequence[int], values: Sequence[float], x0: float, x1: float, buckets: int,
                  *, envelope: bool = False) -> Reduced:
    """The curve's finite points as at most ``buckets`` (x, mean[, min, max]) over [x0, x1]."""
    steps, values = finite_points(steps, values)
    n = len(steps)
    if n <= 2 * buckets or x1 <= x0:
        return Reduced([float(s) for s in steps], list(values))
    sums = [0.0, *accumulate(values)]
    width = (x1 - x0) / buckets
    edges = [*map(partial(bisect_left, steps), [x0 + j * width for j in range(buckets)]), n]
    spans = [(a, b) for a, b in zip(edges, islice(edges, 1, None)) if b > a]
    xs = [(steps[a] + steps[b - 1]) / 2 for a, b in spans]
    ys = [(sums[b] - sums[a]) / (b - a) for a, b in spans]
    if not envelope:
        return Reduced(xs, ys, raw=False)
    chunks = [values[a:b] for a, b in spans]
    return Reduced(xs, ys, list(map(min, chunks)), list(map(max, chunks)), raw=False)
