"""Downstream evaluation in the views: `mcx eval`'s lines, and the scores beside each other in `mcx compare`,
where a difference within the standard errors reads as noise (D68)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from attrs import frozen

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


@frozen
class EvalRow:
    """One task's metric across the compared runs: each run's score (None: not evaluated on it), and whether
    it differs from the first run's within their standard errors (None for the first run, or unknown)."""

    task: str
    metric: str
    higher_is_better: bool | None
    cells: tuple[Score | None, ...]
    noise: tuple[bool | None, ...]

    @property
    def label(self) -> str:
        arrow = "" if self.higher_is_better is None else (" ↑" if self.higher_is_better else " ↓")
        return f"{self.task}/{self.metric}{arrow}"


def eval_rows(evaluations: Sequence[Evaluation | None]) -> tuple[EvalRow, ...]:
    """The compared runs' scores side by side (their order: the baseline, when there is one, first). Only the
    scores of evaluations with the same settings and harness compare; a row lists whatever each run has."""
    by_run = [{(s.task, s.metric): s for s in ev.scores} if ev is not None else {} for ev in evaluations]
    keys = sorted({k for scores in by_run for k in scores})
    rows = []
    for key in keys:
        cells = tuple(scores.get(key) for scores in by_run)
        first = cells[0]
        noise = tuple(None if i == 0 or c is None or first is None else within_noise(first, c)
                      for i, c in enumerate(cells))
        better = next((c.higher_is_better for c in cells if c is not None), None)
        rows.append(EvalRow(key[0], key[1], better, cells, noise))
    return tuple(rows)


def cell_text(row: EvalRow, i: int) -> str:
    score = row.cells[i]
    if score is None:
        return "-"
    return score_text(score.value, score.stderr) + (" (noise)" if row.noise[i] else "")
