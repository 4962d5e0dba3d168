"""Downstream evaluation in the views: `mcx eval`'s lines, and the scores beside each other in `mcx compare`,
where a difference within the standard errors reads as noise (D68)."""

from __future__ import annotations

import math

from mcx.eval.scores import Evaluation, Score

NOISE_SIGMAS = 1.0  # a difference within this many combined standard errors is noise


def score_text(value: float, stderr: float | None) -> str:
    return f"{value:.4f}" if stderr is None else f"{value:.4f} ± {stderr:.4f}"


def evaluation_lines(target: str, ev: Evaluation) -> list[str]:
    """The header (what, how, from where) and one line a score."""
    s = ev.settings
    how = [f"lm-evaluation-harness {ev.harness}", f"{s.get('num_fewshot', 0)}-shot"]
    if s.get("limit") is not None:
        how.append(f"limit {s['limit']}")
    how.append(ev.device)
    head = f"{target}: {', '.join(how)}" + (" (from the cache)" if ev.cached else f", {ev.wall_s:.1f} s")
    width = max((len(x.task) for x in ev.scores), default=4)
    mwidth = max((len(x.metric) for x in ev.scores), default=6)
    return [head] + [f"  {x.task:<{width}}  {x.metric:<{mwidth}}  {score_text(x.value, x.stderr)}" for x in ev.scores]


def within_noise(a: Score, b: Score) -> bool | None:
    """Whether two scores differ by less than their combined standard error (None: a standard error is missing)."""
    if a.stderr is None or b.stderr is None:
        return None
    return abs(a.value - b.value) <= NOISE_SIGMAS * math.hypot(a.stderr, b.stderr)
