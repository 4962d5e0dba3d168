"""Did a rerun reproduce the original? Step by step, metric by metric.

Three outcomes:

- ``bitwise``: every compared metric has the same steps and bit-identical values (NaN where the
  original had NaN).
- ``equivalent``: same steps, every value within its metric's band (``Band``), and the report
  says where each band came from: ``"spec tolerances"``, ``"seed spread"`` or ``"default"``.
- ``diverged``: the first step (then metric, in ``DETERMINISTIC`` order) where a value left its
  band, or where one side has a step, or a whole metric, that the other lacks.

Only quantities the training computes take part (``DETERMINISTIC``); timing and memory depend on
the machine and its load, so they are left out and listed as such.

Before any number: the batch hashes (mcx.metrics.batches, D69). Batches that differ make the verdict
``diverged`` at the first differing step, micro-batch and data-parallel rank, whatever the numbers did
(the same samples in another order may leave the loss nearly equal); runs recorded without hashes are
judged on their numbers alone.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import field, frozen

from mcx.errors import InputError
from mcx.metrics.batches import BatchCheck
from mcx.metrics.curves import Curve

Kind = Literal["bitwise", "equivalent", "diverged"]
CurveLike = Curve | tuple[Sequence[int], Sequence[float]]

# Field names (the part after "<kind>/") that are deterministic functions of the training, in the
# order a divergence at the same step is reported; fields ending in "_loss" also count.
DETERMINISTIC = ("loss", "lm_loss", "grad_norm", "lr", "ppl", "loss_scale", "num_zeros", "moe_expert_load")
TIMING = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "mem_peak_bytes", "step_time_s", "time")

# Bands used where no tolerance is given: relative, per field. Losses of a correct rerun on
# non-deterministic kernels move in the 3rd-4th digit; ppl = exp(loss) magnifies that; gradient
# norms are spikier; the LR schedule is plain arithmetic and must match.
DEFAULT_REL = {"loss": 1e-2, "ppl": 3e-2, "grad_norm": 1e-1, "lr": 1e-6, "loss_scale": 0.0, "num_zeros": 1e-1}
DEFAULT_REL_OTHER = 1e-2
SEED_SPREAD_WINDOW = 0.05  # fraction of steps over which a seed-spread band takes its rolling max


@frozen
class Band:
    """|rerun - original| <= abs_at(step) + rel * |original| is inside the band.

    ``abs_curve`` (per step, from ``seed_spread_band``) replaces ``abs`` where it is given: a step
    between its points takes the value of the nearest point at or before it (the first before
    its start).
    """

    rel: float = 0.0
    abs: float = 0.0
    abs_curve: Curve | None = None

    def width(self, step: int, original: float) -> float:
        a = self.abs
        if self.abs_curve is not None and len(self.abs_curve.steps):
            i = bisect_right(self.abs_curve.steps, step) - 1
            a = self.abs_curve.values[max(i, 0)]
        return a + self.rel * abs(original)

    def describe(self) -> str:
        parts = []
        if self.rel:
            parts.append(f"±{self.rel:.3g} relative")
        if self.abs_curve is not None and len(self.abs_curve.values) and max(self.abs_curve.values) > 0:
            parts.append(f"±{min(self.abs_curve.values):.3g}..{max(self.abs_curve.values):.3g} absolute per step")
        elif self.abs:
            parts.append(f"±{self.abs:.3g} absolute")
        return " + ".join(parts) or "exact"


@frozen
class Divergence:
    """One step of one metric where the runs differ (``within``: still inside the band)."""

    metric: str
    step: int
    original: float | None  # None: the original has no value at this step
    rerun: float | None  # None: the rerun has no value at this step
    band: Band | None  # None when a value is missing
    within: bool = False

    def describe(self) -> str:
        if self.original is None or self.rerun is None:
            missing, other, value = ("rerun", "original", self.original) if self.rerun is None else (
                "original", "rerun", self.rerun)
            return f"{self.metric}: the {missing} has no step {self.step} (the {other} logged {value!r})"
        assert self.band is not None
        where = "within" if self.within else "outside"
        return (f"{self.metric} at step {self.step}: {self.original!r} (original) vs {self.rerun!r} (rerun), "
                f"difference {abs(self.rerun - self.original):.3g} {where} {self.band.describe()}")


@frozen
class Deviation:
    """The largest difference seen in one metric (reported for equivalent reruns)."""

    max_abs: float
    max_rel: float
    step: int | None  # where max_abs was seen


@frozen
class Verdict:
    kind: Kind
    band_source: str  # where the bands came from: "spec tolerances", "seed spread" or "default"
    compared: tuple[str, ...]  # metrics that took part
    excluded: dict[str, str]  # metric -> why it did not take part
    bands: dict[str, Band]  # the band each compared metric was held to
    band_sources: dict[str, str]  # metric -> "spec tolerances" | "seed spread" | "default"
    steps: int  # steps compared (train steps when there are any)
    divergence: Divergence | None = None
    first_difference: Divergence | None = None  # the first not-bit-identical value, for "equivalent"
    deviations: dict[str, Deviation] = field(factory=dict)
    batches: BatchCheck | None = None  # the batch hashes compared; None where a run recorded none

    @property
    def reproduced(self) -> bool:
        return self.kind != "diverged"

    def sources_text(self) -> str:
        """"spec tolerances", or "spec tolerances; default for train/lr" when bands came from several places."""
        others: dict[str, list[str]] = {}
        for m, src in self.band_sources.items():
            if src != self.band_source:
                others.setdefault(src, []).append(m)
        extra = "; ".join(f"{src} for {', '.join(ms)}" for src, ms in others.items())
        return f"{self.band_source}; {extra}" if extra else self.band_source

    def describe(self) -> str:
        if self.kind == "bitwise":
            return f"bitwise: {len(self.compared)} metrics identical at every one of {self.steps} steps"
        if self.kind == "equivalent":
            first = self.first_difference.describe() if self.first_difference else "none"
            return (f"equivalent: {len(self.compared)} metrics within their bands ({self.sources_text()}) at every "
                    f"one of {self.steps} steps; first difference: {first}")
        if self.batches is not None and self.batches.first is not None:
            numbers = self.divergence or self.first_difference
            after = f"; then {numbers.describe()}" if numbers is not None else "; every number is bit-identical"
            return f"diverged: {self.batches.describe()}{after}"
        assert self.divergence is not None
        return f"diverged: {self.divergence.describe()}"


def classify(metric: str) -> str | None:
    """None when the metric takes part; else why it does not."""
    field = metric.rsplit("/", 1)[-1]
    if field in TIMING or field.endswith(("_s", "_bytes", "per_s", "per_gpu")):
        return "timing or memory: depends on the machine, not the training"
    if field in DETERMINISTIC or field.endswith("_loss"):
        return None
    return "not known to be a deterministic function of the training"


def _as_curve(c: CurveLike) -> Curve:
    if isinstance(c, Curve):
        return c
    steps, values = c
    return Curve(steps if isinstance(steps, array) else array("q", steps),
                 values if isinstance(values, array) else array("d", values))


def _lookup(tolerances: Mapping[str, float | Band], metric: str) -> float | Band | None:
    """A tolerance by curve name ("train/loss") or its flat key ("train_loss")."""
    if metric in tolerances:
        return tolerances[metric]
    return tolerances.get(metric.replace("/", "_"))


def _band(metric: str, given: float | Band) -> Band:
    if isinstance(given, Band):
        return given
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given) or given < 0:
        raise InputError(f"tolerance for {metric} = {given!r} is not a relative tolerance;",
                         "give a number >= 0, e.g. 0.01 for 1%.")
    return Band(rel=float(given))


def _default_band(metric: str) -> Band:
    return Band(rel=DEFAULT_REL.get(metric.rsplit("/", 1)[-1], DEFAULT_REL_OTHER))


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN matches NaN


def _within(a: float, b: float, width: float) -> bool:
    if _same(a, b):
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False  # NaN/Inf on one side only
    return abs(b - a) <= width


def _first_missing(metric: str, o: Curve, r: Curve) -> Divergence | None:
    """The first step present on one side only (steps are in increasing order)."""
    i = j = 0
    while i < len(o.steps) and j < len(r.steps):
        if o.steps[i] == r.steps[j]:
            i += 1
            j += 1
        elif o.steps[i] < r.steps[j]:
            return Divergence(metric, o.steps[i], o.values[i], None, None)
        else:
            return Divergence(metric, r.steps[j], None, r.values[j], None)
    if i < len(o.steps):
        return Divergence(metric, o.steps[i], o.values[i], None, None)
    if j < len(r.steps):
        return Divergence(metric, r.steps[j], None, r.values[j], None)
    return None


def _metric_order(metric: str) -> tuple[int, str]:
    field = metric.rsplit("/", 1)[-1]
    rank = DETERMINISTIC.index(field) if field in DETERMINISTIC else len(DETERMINISTIC)
    return rank, metric


def verdict(original: Mapping[str, CurveLike], rerun: Mapping[str, CurveLike], *,
            tolerances: Mapping[str, float | Band] | None = None, band_source: str = "default",
            batches: BatchCheck | None = None) -> Verdict:
    """Compare a rerun's curves with the original's, step by step.

    ``original`` / ``rerun``: metric name -> (steps, values), e.g. ``RunData.curves``.
    ``tolerances``: metric -> relative tolerance (a float, as in ``[baseline.tolerances]``) or a
    Band; keys are curve names (``train/loss``) or flat keys (``train_loss``). Metrics without one
    get ``DEFAULT_REL``. ``band_source`` names where ``tolerances`` came from. ``batches``: the two runs'
    batch hashes compared (mcx.metrics.batches.compare_batches); a difference there is a divergence.
    """
    tolerances = tolerances or {}
    names = sorted(set(original) | set(rerun), key=_metric_order)
    excluded = {m: why for m in names if (why := classify(m)) is not None}
    compared = tuple(m for m in names if m not in excluded)
    if not compared:
        raise InputError("nothing to compare: neither run logged a metric that the training determines "
                         f"({', '.join(DETERMINISTIC)});", "check that both runs trained and wrote metrics.jsonl.")
    bands: dict[str, Band] = {}
    sources: dict[str, str] = {}
    for m in compared:
        given = _lookup(tolerances, m)
        if given is None:
            bands[m], sources[m] = _default_band(m), "default"
        else:
            bands[m], sources[m] = _band(m, given), band_source

    curves_o = {m: _as_curve(original[m]) for m in compared if m in original}
    curves_r = {m: _as_curve(rerun[m]) for m in compared if m in rerun}
    n_steps = max((len(c.steps) for m, c in curves_o.items() if m.startswith("train/")),
                  default=max((len(c.steps) for c in curves_o.values()), default=0))

    def result(kind: Kind, divergence: Divergence | None = None, first: Divergence | None = None,
               deviations: dict[str, Deviation] | None = None) -> Verdict:
        if batches is not None and batches.first is not None:
            kind = "diverged"
        return Verdict(kind, band_source, compared, excluded, bands, sources, n_steps, divergence, first,
                       deviations or {}, batches)

    # Structure first: a metric or a step on one side only is a divergence at its first step.
    candidates: list[Divergence] = []
    for m in compared:
        o, r = curves_o.get(m), curves_r.get(m)
        if o is None or r is None:
            c = o if r is None else r
            if c is not None and len(c.steps):
                candidates.append(Divergence(m, c.steps[0], c.values[0] if r is None else None,
                                             c.values[0] if o is None else None, None))
            continue
        if o.steps != r.steps and (miss := _first_missing(m, o, r)) is not None:
            candidates.append(miss)
    # Then values, up to the first structural problem.
    limit = min((d.step for d in candidates), default=None)
    firsts: list[Divergence] = []  # per metric, its first value that is not bit-identical
    deviations: dict[str, Deviation] = {}
    for m in compared:
        o, r = curves_o.get(m), curves_r.get(m)
        if o is None or r is None:
            continue
        if o.steps == r.steps and o.values.tobytes() == r.values.tobytes():
            deviations[m] = Deviation(0.0, 0.0, None)
            continue
        band = bands[m]
        r_at = None if o.steps == r.steps else dict(zip(r.steps, r.values))
        max_abs, max_rel, at, first = 0.0, 0.0, None, None
        for k, (step, a) in enumerate(zip(o.steps, o.values)):
            if limit is not None and step >= limit:
                break
            b = r.values[k] if r_at is None else r_at.get(step)
            if b is None or (_same(a, b) and math.copysign(1.0, a) == math.copysign(1.0, b)):
                continue
            inside = _within(a, b, band.width(step, a))
            if first is None:
                first = Divergence(m, step, a, b, band, within=inside)
            if not inside:
                candidates.append(Divergence(m, step, a, b, band))
                break
            diff = abs(b - a)
            if diff > max_abs:
                max_abs, at = diff, step
            if a != 0:
                max_rel = max(max_rel, diff / abs(a))
        if first is not None:
            firsts.append(first)
        deviations[m] = Deviation(max_abs, max_rel, at)
    first_diff = min(firsts, key=_position, default=None)
    if candidates:
        return result("diverged", min(candidates, key=_position), first_diff, deviations)
    if first_diff is None:
        return result("bitwise", deviations=deviations)
    return result("equivalent", None, first_diff, deviations)


def _position(d: Divergence) -> tuple[int, tuple[int, str]]:
    return d.step, _metric_order(d.metric)


def seed_spread_band(runs: Sequence[Mapping[str, CurveLike]], *, window: float = SEED_SPREAD_WINDOW) -> dict[str, Band]:
    """Bands from the spread between runs that differ only in their seed.

    Per deterministic metric and per step that every run logged: the spread max - min across the
    runs, then a centred rolling maximum over ``window`` of the steps (at least 5 points), so a
    step where the seeds happened to agree does not make the band collapse there. A metric that
    every seed logs identically (the LR schedule) gets a zero band: it must match exactly.
    """
    if len(runs) < 2:
        raise ValueError("seed_spread_band needs at least two runs with different seeds")
    curves = [{m: _as_curve(c) for m, c in run.items() if classify(m) is None} for run in runs]
    out: dict[str, Band] = {}
    for m in sorted(set.intersection(*(set(c) for c in curves)), key=_metric_order):
        maps = [dict(zip(c[m].steps, c[m].values)) for c in curves]
        common = sorted(set.intersection(*(set(d) for d in maps)))
        spread = []
        for s in common:
            vals = [d[s] for d in maps]
            finite = [v for v in vals if math.isfinite(v)]
            spread.append(max(finite) - min(finite) if len(finite) == len(vals) else math.inf)
        if not common:
            continue
        half = max(2, int(len(common) * window) // 2)
        smoothed = [max(spread[max(0, i - half): i + half + 1]) for i in range(len(spread))]
        out[m] = Band(abs_curve=Curve(array("q", common), array("d", smoothed)))
    return out


def _num(x: float | None) -> Any:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _band_dict(b: Band) -> dict[str, Any]:
    d: dict[str, Any] = {"rel": b.rel, "abs": b.abs, "text": b.describe()}
    if b.abs_curve is not None:
        d["abs_per_step"] = {"steps": list(b.abs_curve.steps), "values": [_num(v) for v in b.abs_curve.values]}
    return d


def _div_dict(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"metric": d.metric, "step": d.step, "original": _num(d.original), "rerun": _num(d.rerun),
            "band": _band_dict(d.band) if d.band is not None else None, "within": d.within, "text": d.describe()}


def verdict_to_dict(v: Verdict) -> dict[str, Any]:
    """The verdict as strict JSON data (non-finite numbers as "NaN"/"Infinity" strings)."""
    return {
        "verdict": v.kind,
        "text": v.describe(),
        "band_source": v.band_source,
        "band_sources": v.sources_text(),
        "steps": v.steps,
        "compared": list(v.compared),
        "excluded": dict(v.excluded),
        "bands": {m: {**_band_dict(b), "source": v.band_sources[m]} for m, b in v.bands.items()},
        "divergence": _div_dict(v.divergence),
        "first_difference": _div_dict(v.first_difference),
        "deviations": {m: {"max_abs": _num(d.max_abs), "max_rel": _num(d.max_rel), "step": d.step}
                       for m, d in v.deviations.items()},
        "batches": v.batches.to_dict() if v.batches is not None else None,
    }
