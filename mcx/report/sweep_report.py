"""A sweep in `mcx compare --sweep`: its objective against each parameter, and every trial.

The compared runs are the sweep's best complete trials (their curves are the report's own); this module
adds what only the sweep knows: which values each trial had, and which ended pruned or failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, cast

from attrs import frozen

from mcx.report import fmt
from mcx.report.svg import Point, scatter_chart

OTHER = "#9a9a9a"  # trials that are not among the compared runs
LOG_RATIO = 20.0  # a positive numeric parameter spanning this factor is drawn on a log scale
FIGURE_MAX_PX = 560  # a sweep's chart stays this wide when it is the only one


@frozen
class SweepTrial:
    number: int
    params: Mapping[str, Any]
    state: str  # complete | pruned | failed | running
    value: float | None
    run_id: str | None


@frozen
class SweepSection:
    name: str
    objective: str
    direction: str
    parameters: tuple[str, ...]
    trials: tuple[SweepTrial, ...]  # best first


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def axis(values: Sequence[Any]) -> tuple[bool, list[str] | None]:
    """(log scale, categories) for a parameter's values: numbers on a linear or log axis, the rest as
    categories in the order first seen."""
    if values and _numeric(values):
        positive = all(v > 0 for v in values)
        return positive and max(values) / min(values) >= LOG_RATIO, None
    seen: list[str] = []
    for v in values:
        if fmt.config_value(v) not in seen:
            seen.append(fmt.config_value(v))
    return False, seen


def charts(section: SweepSection, color_of: Mapping[str, str]) -> list[str]:
    """One scatter chart a parameter: each complete trial's objective over its value."""
    done = [t for t in section.trials if t.state == "complete" and t.value is not None]
    best = done[0].number if done else None
    out = []
    for i, key in enumerate(section.parameters):
        values: list[Any] = [t.params.get(key) for t in done]  # config values: numbers, or categories
        log_x, categories = axis(values)
        points = [Point(x=float(categories.index(fmt.config_value(v))) if categories is not None else float(v),
                        y=float(cast(float, t.value)), color=color_of.get(t.run_id or "", OTHER), ring=t.number == best,
                        label=f"trial {t.number}: {key} = {fmt.config_value(v)}, {section.objective} "
                              f"{fmt.metric(section.objective, t.value)} (run {t.run_id})")
                  for t, v in zip(done, values)]
        out.append(scatter_chart(points, chart_id=f"sweep-{i}", title=f"{section.objective} vs {key}",
                                 x_label=key + (" (log scale)" if log_x else ""), y_label=section.objective,
                                 log_x=log_x, categories=categories,
                                 integer=all(isinstance(v, int) for v in values)))
    return out


def to_html(section: SweepSection, color_of: Mapping[str, str]) -> str:
    heads = "".join(f"<th>{escape(h)}</th>" for h in ("trial", *section.parameters, "state", section.objective, "run"))
    rows = []
    for t in section.trials:
        cells = [str(t.number), *(fmt.config_value(t.params.get(k)) for k in section.parameters), t.state,
                 fmt.metric(section.objective, t.value), t.run_id or "-"]
        swatch = (f'<span class="sw" style="background:{color_of[t.run_id]}"></span>'
                  if t.run_id is not None and t.run_id in color_of else "")
        rows.append("<tr>" + "".join(f"<td>{swatch if j == 0 else ''}{escape(c)}</td>" for j, c in enumerate(cells))
                    + "</tr>")
    figs = "".join(f'<figure style="max-width:{FIGURE_MAX_PX}px">{c}</figure>' for c in charts(section, color_of))
    return (f'<section id="sweep"><h2>Sweep {escape(section.name)}</h2>'
            f'<p class="sub">{len(section.trials)} trials; objective {escape(section.objective)} '
            f"({escape(section.direction)}); the best trial is ringed; compared below: the best complete "
            f'trials, in colour</p><div class="grid">{figs}</div>'
            f'<div class="scroll"><table class="runs"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}'
            "</tbody></table></div></section>")


def to_json(section: SweepSection) -> dict[str, Any]:
    return {"name": section.name, "objective": section.objective, "direction": section.direction,
            "parameters": list(section.parameters),
            "trials": [{"number": t.number, "params": dict(t.params), "state": t.state, "value": t.value,
                        "run_id": t.run_id} for t in section.trials]}


def to_markdown(section: SweepSection) -> list[str]:
    head = ["trial", *section.parameters, "state", section.objective, "run"]
    out = [f"### Sweep {section.name}", "", f"Objective {section.objective} ({section.direction}), best first.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in section.trials:
        cells = [str(t.number), *(fmt.config_value(t.params.get(k)) for k in section.parameters), t.state,
                 fmt.metric(section.objective, t.value), f"`{t.run_id}`" if t.run_id else "-"]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [""]
