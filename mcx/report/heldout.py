"""The facts of a comparison's summary: which run is better on the held-out metric, by how much, and
the run-to-run noise (seed spread) to hold that against. ``mcx.report.compare_view`` puts them in its
``Comparison``; ``mcx.report.outcome`` words them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from mcx.metrics.summary import BY_KEY, Metric
from mcx.report.rundata import RunData, summarize_run

# The held-out metric, in order of preference: what a change is judged by.
HELD_OUT = ("valid_loss", "test_loss", "train_loss")
# Fingerprint entries derived from the components (their hashes; the patch the code hash covers).
DERIVED = frozenset({"component_hashes", "side"})


@frozen
class Standing:
    """One run on the held-out metric, against the reference run."""

    run_id: str
    value: float | None
    delta: float | None = None  # value - reference's value
    delta_rel: float | None = None  # delta / |reference's value|


@frozen
class Margin:
    """The best run against the other run of the headline: ``delta = best - other``."""

    best: str
    other: str
    delta: float
    delta_rel: float | None  # delta / |other|


@frozen
class SeedNoise:
    of: str  # the run whose config the seed runs repeat ("" for the compared runs themselves)
    spread: float  # max - min of the held-out metric over the seed runs
    seeds: tuple[tuple[str, Any], ...]  # (run ID, train.seed) of each seed run


@frozen
class Summary:
    config_keys: tuple[str, ...]  # config keys that differ between the runs
    components: tuple[str, ...]  # fingerprint components that differ (the config diff aside)
    metric: Metric | None  # the held-out metric used; None when no run has a loss
    reason: str  # why that metric: the preferred one, or why not
    reference: str  # the run deltas are against: the baseline, else the first run given
    reference_role: str  # "baseline" | "first run given"
    ranking: tuple[Standing, ...]  # best first; NaN after numbers, runs without a value last
    margin: Margin | None  # None with fewer than two runs that have a number
    noise: SeedNoise | None  # None: unknown (no seed runs recorded)

    @property
    def pair(self) -> tuple[str, ...]:
        """The runs the headline compares: whose seed runs measure the noise."""
        return (self.margin.best, self.margin.other) if self.margin else ()

    @property
    def within_noise(self) -> bool | None:
        """Whether the margin is no larger than the seed spread; None when either is unknown."""
        if self.margin is None or self.noise is None:
            return None
        return abs(self.margin.delta) <= self.noise.spread


def _choose(values: Mapping[str, Sequence[float | None]]) -> tuple[Metric | None, str]:
    """The first held-out metric every run has, else the first that two runs have, and why."""
    for need in ("all", "two"):
        for key in HELD_OUT:
            have = [v for v in values[key] if v is not None]
            if have and (len(have) == len(values[key]) if need == "all" else len(have) >= 2):
                return BY_KEY[key], _reason(key, values, need)
    return None, "no run logged a validation, test or train loss"


def _reason(key: str, values: Mapping[str, Sequence[float | None]], need: str) -> str:
    skipped = [BY_KEY[k].label for k in HELD_OUT[:HELD_OUT.index(key)]]
    parts = []
    if skipped:
        parts.append(f"not every run has a {' or a '.join(skipped)}")
    if key == "train_loss":
        parts.append("a training metric, not a held-out one")
    if need == "two":
        parts.append(f"{sum(v is None for v in values[key])} run(s) have none")
    return "; ".join(parts) or "the held-out metric"


def _rank_key(better: str, value: float | None) -> tuple[int, float]:
    if value is None:
        return 2, 0.0
    if math.isnan(value):
        return 1, 0.0
    return 0, value if better == "lower" else -value


def _relative(delta: float, ref: float) -> float | None:
    return delta / abs(ref) if math.isfinite(ref) and ref != 0 and math.isfinite(delta) else None


def _margin(ranking: Sequence[Standing], values: Mapping[str, float | None], reference: str) -> Margin | None:
    """The best run against the reference, or against the runner-up when the best is the reference."""
    ranked = [(s.run_id, s.value) for s in ranking if s.value is not None and math.isfinite(s.value)]
    if len(ranked) < 2:
        return None
    (best, best_value), ref = ranked[0], values.get(reference)
    other, other_value = ranked[1] if best == reference or ref is None or not math.isfinite(ref) \
        else next(r for r in ranked if r[0] == reference)
    delta = best_value - other_value
    return Margin(best, other, delta, _relative(delta, other_value))


def _noise(metric: Metric, pair: Sequence[str], seeds: Mapping[str, Sequence[RunData]],
           runs: Sequence[RunData], seed_only: bool) -> SeedNoise | None:
    """The largest seed spread among the headline runs' seed runs (and the compared runs themselves
    when they differ only in their seed)."""
    groups = [(rid, seeds[rid]) for rid in pair if len(seeds.get(rid, ())) >= 2]
    if seed_only and len(runs) >= 2:
        groups.append(("", runs))
    found = []
    for rid, group in groups:
        vals = [(r, v) for r in group if (v := summarize_run(r)[metric.key]) is not None and math.isfinite(v)]
        if len(vals) >= 2:
            spread = max(v for _, v in vals) - min(v for _, v in vals)
            found.append(SeedNoise(rid, spread, tuple((r.run_id, r.spec.get("train.seed")) for r, _ in vals)))
    return max(found, key=lambda n: n.spread, default=None)


def summarize_comparison(run_ids: Sequence[str], summaries: Sequence[Mapping[str, float | None]],
                         baseline: str | None, *, config_keys: tuple[str, ...], components: Sequence[str],
                         seeds: Mapping[str, Sequence[RunData]], runs: Sequence[RunData]) -> Summary:
    """The summary of runs ``run_ids`` (their summary metrics ``summaries``, in the same order)."""
    components = tuple(c for c in components if c not in DERIVED)
    metric, reason = _choose({k: [s[k] for s in summaries] for k in HELD_OUT})
    reference = baseline or run_ids[0]
    role = "baseline" if baseline else "first run given"
    if metric is None:
        return Summary(config_keys, components, None, reason, reference, role, (), None, None)
    values = {rid: s[metric.key] for rid, s in zip(run_ids, summaries)}
    ref = values[reference]
    standings = []
    for rid in run_ids:
        v = values[rid]
        delta = v - ref if v is not None and ref is not None and rid != reference else None
        standings.append(Standing(rid, v, delta, _relative(delta, ref) if delta is not None and ref is not None else None))
    ranking = tuple(sorted(standings, key=lambda s: _rank_key(metric.better, s.value)))  # stable: ties keep order
    margin = _margin(ranking, values, reference)
    seed_only = config_keys == ("train.seed",) and not components
    noise = _noise(metric, (margin.best, margin.other) if margin else (), seeds, runs, seed_only)
    return Summary(config_keys, components, metric, reason, reference, role, ranking, margin, noise)
