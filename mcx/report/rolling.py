"""Rolling views of a curve for the charts: the smoothed train loss and the step-to-step band.

Both reuse the summary metrics' own rules (``mcx.metrics.summary``), so a chart shows what the
table reports: the smoothed loss is the trailing mean over the window of ``train loss (final)``
(its last point is that number), and the band is the central 80% (p10..p90) of the steady per-step
values, as ``spread`` measures it, taken over a window that slides along the run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from itertools import accumulate

from mcx.metrics.summary import steady, window_size
from mcx.report.downsample import finite_points

BAND_SAMPLES = 150  # points along the run where the band is evaluated
BAND_WINDOW_SHARE = 25  # the band's window: 1/25 of the steady steps (4%) ...
BAND_WINDOW_MIN, BAND_WINDOW_MAX = 10, 1000  # ... within these

# What the charts show, for the reports' definitions.
SMOOTHED = ("at each step, the mean of the last 1% of the run's logged train losses (at least 10, fewer at the "
            "start): the window of train loss (final), so a smoothed curve ends at that value")
BAND = ("the step-to-step spread: p10..p90 of the steady per-step values (after the first 5% of steps) in a "
        f"window of {100 // BAND_WINDOW_SHARE}% of them (at least {BAND_WINDOW_MIN}, at most {BAND_WINDOW_MAX}) "
        "sliding along the run")


def smoothing_window(values: Sequence[float]) -> int:
    """Steps averaged by the smoothed curve: the window of ``train loss (final)``."""
    return window_size(len(values))


def trailing_mean(steps: Sequence[int], values: Sequence[float]) -> tuple[list[int], list[float]]:
    """At each finite point, the mean of it and the finite points before it, ``smoothing_window`` in
    all (fewer at the start)."""
    w = smoothing_window(values)
    steps, values = finite_points(steps, values)
    sums = [0.0, *accumulate(values)]
    means = [(sums[i + 1] - sums[max(0, i + 1 - w)]) / min(i + 1, w) for i in range(len(values))]
    return list(steps), means


def band_window(n_steady: int) -> int:
    return min(BAND_WINDOW_MAX, max(BAND_WINDOW_MIN, n_steady // BAND_WINDOW_SHARE))


def spread_band(steps: Sequence[int], values: Sequence[float]) -> tuple[list[float], list[float], list[float]]:
    """(steps, p10, p90) of the steady points in a centred window of ``band_window`` points, at up
    to ``BAND_SAMPLES`` places; empty when the curve has too few steady points for a window."""
    kept = [int(i) for i in steady(range(len(values)))]  # the steady points' indices, by the rule ``spread`` uses
    idx = [i for i in kept if math.isfinite(values[i])]
    w = band_window(len(idx))
    if len(idx) < w:
        return [], [], []
    half = w // 2
    places = sorted({round(k * (len(idx) - 1) / (BAND_SAMPLES - 1)) for k in range(BAND_SAMPLES)})
    xs, lo, hi = [], [], []
    for p in places:
        start = min(max(0, p - half), len(idx) - w)
        deciles = statistics.quantiles([values[i] for i in idx[start:start + w]], n=10, method="inclusive")
        xs.append(float(steps[idx[p]]))
        lo.append(deciles[0])
        hi.append(deciles[8])
    return xs, lo, hi
