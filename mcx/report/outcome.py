"""The summary at the top of a comparison: what differs, which run is better on the held-out metric
and by how much, and whether that is more than run-to-run noise.

Run-to-run noise is the seed spread: how far the held-out metric moves between recorded runs that
differ only in ``train.seed`` (``mcx.report.seeds``), the largest minus the smallest value, as
``mcx.report.verdict.seed_spread_band`` measures a curve's. Without seed runs it is unknown, and
the summary says how to measure it. ``lines`` words the summary once for every renderer, and
``definitions`` what each term a report shows means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from mcx.metrics.summary import BY_KEY, Metric
from mcx.report.rundata import RunData, summarize_run

if TYPE_CHECKING:
    from mcx.report.compare import Comparison

# The held-out metric, in order of preference: what a change is judged by.
HELD_OUT = ("valid_loss", "test_loss", "train_loss")
# Fingerprint entries derived from the components (their hashes; the patch the code hash covers).
DERIVED = frozenset({"component_hashes", "side"})
MEASURE = "mcx run SPEC --set train.seed=N"
SEED_SPREAD = ("the largest minus the smallest value of the held-out metric among recorded runs that differ "
               "only in train.seed (same code, environment, data and hardware)")


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
    ranked = [s for s in ranking if s.value is not None and math.isfinite(s.value)]
    if len(ranked) < 2:
        return None
    best = ranked[0]
    other = ranked[1] if best.run_id == reference or values.get(reference) is None \
        or not math.isfinite(values[reference]) else next(s for s in ranked if s.run_id == reference)
    delta = best.value - other.value
    return Margin(best.run_id, other.run_id, delta, _relative(delta, other.value))


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
        standings.append(Standing(rid, v, delta, _relative(delta, ref) if delta is not None else None))
    ranking = tuple(sorted(standings, key=lambda s: _rank_key(metric.better, s.value)))  # stable: ties keep order
    margin = _margin(ranking, values, reference)
    seed_only = config_keys == ("train.seed",) and not components
    noise = _noise(metric, (margin.best, margin.other) if margin else (), seeds, runs, seed_only)
    return Summary(config_keys, components, metric, reason, reference, role, ranking, margin, noise)


# -- words -------------------------------------------------------------------------------------------

def _changes(cmp: Comparison) -> str:
    from mcx.report.fmt import config_value, shorten

    s = cmp.summary
    assert s is not None
    parts = []
    if s.config_keys:
        if len(cmp.runs) == 2 and len(cmp.config_diff) <= 4:
            keys = ", ".join(f"{r.key} ({shorten(config_value(r.values[0]), 24)} → "
                             f"{shorten(config_value(r.values[1]), 24)})" for r in cmp.config_diff)
        else:
            more = len(s.config_keys) - 8
            keys = ", ".join(s.config_keys[:8]) + (f" and {more} more" if more > 0 else "")
        parts.append(f"config {keys}")
    if s.components:
        parts.append(f"fingerprint {', '.join(s.components)}")
    if not parts:
        return "What differs: nothing in config or fingerprint (the same spec and machine)."
    same = [c for c in cmp.fingerprint_same if c not in DERIVED]
    tail = f" Identical: {', '.join(same)}." if same else ""
    return f"What differs: {'; '.join(parts)}.{tail}"


def _who(cmp: Comparison, run_id: str) -> str:
    s = cmp.summary
    assert s is not None
    return f"{run_id} (the {s.reference_role})" if run_id == s.reference else run_id


def _headline(cmp: Comparison) -> list[str]:
    from mcx.report.fmt import value

    s = cmp.summary
    assert s is not None and s.metric is not None
    m, unit = s.metric, s.metric.unit
    used = f"{m.label}" + ("" if m.key == HELD_OUT[0] else f" ({s.reason})")
    diverged = [r.run_id for r in s.ranking if r.value is not None and math.isnan(r.value)]
    nan = f" NaN (diverged): {', '.join(diverged)}." if diverged else ""
    if s.margin is None:
        return [f"Held-out metric: {used}; fewer than two runs have a finite value, so there is nothing to rank.{nan}"]
    g = s.margin
    vals = {r.run_id: r.value for r in s.ranking}
    word = m.better  # "lower" | "higher"
    if g.delta == 0:
        return [f"{m.label[0].upper()}{m.label[1:]}: {_who(cmp, g.best)} and {_who(cmp, g.other)} are equal "
                f"({value(unit, vals[g.best])})."]
    rel = f" ({g.delta_rel:+.2%})" if g.delta_rel is not None else ""
    out = [f"Better on {used}: {_who(cmp, g.best)}, {value(unit, vals[g.best])} against {value(unit, vals[g.other])} "
           f"for {_who(cmp, g.other)}: {value(unit, abs(g.delta))} {word}{rel}.{nan}"]
    if len(s.ranking) > 2:
        ranked = ", ".join(f"{r.run_id} {value(unit, r.value)}" for r in s.ranking)
        out.append(f"Ranked by {m.label}, best first ({word} is better): {ranked}.")
    return out


def _noise_line(cmp: Comparison) -> str:
    from mcx.report.fmt import value

    s = cmp.summary
    assert s is not None and s.metric is not None and s.margin is not None
    n = s.noise
    if n is None:
        return ("Run-to-run noise: unknown; no run of these configs with another seed is recorded, so the "
                f"difference cannot yet be told from seed noise. Measure it with {MEASURE} for a few N "
                "(e.g. 1, 2, 3), then compare again.")
    of = f"{n.of}'s config" if n.of else "the compared runs, which differ only in train.seed"
    seeds = ", ".join(str(seed) for _, seed in n.seeds)
    few = "; two seeds give a rough estimate, more make it firmer" if len(n.seeds) == 2 else ""
    diff = abs(s.margin.delta)
    if s.within_noise:
        judged = "the difference is within it: not distinguishable from seed noise"
    else:
        ratio = f"{diff / n.spread:.1f}× it" if n.spread > 0 else "above it (the seeds agree exactly)"
        judged = f"the difference is {ratio}: more than seed noise"
    return (f"Run-to-run noise: the seed spread of {s.metric.label} is {value(s.metric.unit, n.spread)} "
            f"over {len(n.seeds)} runs of {of} (seeds {seeds}{few}); {judged}.")


def lines(cmp: Comparison) -> list[str]:
    """The summary in sentences (plain text; renderers escape it)."""
    s = cmp.summary
    if s is None:
        return []
    if len(cmp.runs) == 1:
        return ["One run: nothing to compare it with."]
    out = [_changes(cmp)]
    if s.metric is None:
        return out + [f"Held-out metric: none ({s.reason})."]
    out += _headline(cmp)
    if s.margin is not None:
        out.append(_noise_line(cmp))
    return out


def definitions(cmp: Comparison) -> list[tuple[str, str, str]]:
    """(key, term, definition) for each metric the report shows, then the noise and chart terms it uses."""
    from mcx.report.compare import STEP_NOISE
    from mcx.report.rolling import BAND, SMOOTHED

    out = [(row.metric.key, row.metric.label, row.metric.definition) for row in cmp.metrics]
    if any(c.within_noise for row in cmp.metrics for c in row.cells):
        out.append(("step_noise", "step noise", STEP_NOISE))
    if cmp.summary is not None and cmp.summary.margin is not None:
        out.append(("seed_spread", "seed spread (run-to-run noise)", SEED_SPREAD))
    views = {p.view for p in cmp.plots}
    if "smoothed" in views:
        out.append(("smoothed_train_loss", "smoothed train loss (chart)", SMOOTHED))
    if "spread" in views:
        out.append(("throughput_band", "throughput band (chart)", BAND))
    return out
