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

from mcx.metrics.batches import BatchCheck
from mcx.report.compare_view import STEP_NOISE, Comparison
from mcx.report.fmt import config_value, shorten, value
from mcx.report.heldout import (
    DERIVED,
    HELD_OUT,
    Margin,
    SeedNoise,
    Standing,
    Summary,
    summarize_comparison,
)
from mcx.report.rolling import BAND, SMOOTHED

MEASURE = "mcx run SPEC --set train.seed=N"
SEED_SPREAD = ("the largest minus the smallest value of the held-out metric among recorded runs that differ "
               "only in train.seed (same code, environment, data and hardware)")


# -- words -------------------------------------------------------------------------------------------

def _changes(cmp: Comparison) -> str:
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
    if cmp.batches is not None:
        out.append(_batches_line(cmp.batches))
    if s.metric is None:
        return out + [f"Held-out metric: none ({s.reason})."]
    out += _headline(cmp)
    if s.margin is not None:
        out.append(_noise_line(cmp))
    return out


def _batches_line(b: BatchCheck) -> str:
    """Whether the two runs trained on the same inputs (their batch hashes, D69): before any number."""
    if b.note is not None:
        return f"Batches: not compared ({b.note})."
    if b.first is not None:
        f = b.first
        return (f"Batches: they differ first at step {f.step}, micro-batch {f.micro_batch}, data-parallel rank "
                f"{f.dp_rank}; from there on the runs trained on different data.")
    return f"Batches: the same at every step both trained ({b.steps} steps): the same data in the same order."


def definitions(cmp: Comparison) -> list[tuple[str, str, str]]:
    """(key, term, definition) for each metric the report shows, then the noise and chart terms it uses."""
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


__all__ = ["DERIVED", "HELD_OUT", "MEASURE", "SEED_SPREAD", "Margin", "SeedNoise", "Standing", "Summary", "definitions",
           "lines", "summarize_comparison"]
