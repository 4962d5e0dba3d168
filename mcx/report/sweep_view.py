"""What `mcx sweep` and `mcx sweep show` print on stdout: the trials, best first, from the dict the library
returned (the object `--json` prints)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mcx.report.fmt import config_value, metric
from mcx.report.titled import titled_table


def render_sweep(result: dict[str, Any]) -> RenderableType:
    """One row a trial: its parameters, state, objective and run; the best trial first and marked."""
    objective = result["objective"]
    title = Text(f"sweep {result['name']}: {result['status']}", style="bold")
    done = sum(t["state"] in ("complete", "pruned", "failed") for t in result["trials"])
    title.append(f" ({result['method']}, {done} of {result['max_trials']} trials done; objective {objective}, "
                 f"{result['direction']})")
    t = titled_table(title)
    for col in ("trial", *result["parameters"], "state", objective, "run", ""):
        t.add_column(col, no_wrap=col != "")
    best = (result.get("best") or {}).get("number")
    for trial in result["trials"]:
        mark = "best" if trial["number"] == best else ""
        note = trial.get("detail") or ("already trained" if trial.get("cached") else "")
        if trial["state"] == "planned" and trial.get("gpu_hours") is not None:
            note = f"{trial['gpu_hours']:,.2f} GPU-hours" + (", already trained" if trial.get("cached") else "")
        t.add_row(f"{trial['number']} {mark}".strip(), *(config_value(trial["params"].get(k)) for k in result["parameters"]),
                  trial["state"], metric(objective, trial.get("value")), trial.get("run_id") or "-", note)
    rows = Table.grid(padding=(0, 2))
    if result.get("gpu_hours") is not None:
        rows.add_row("GPU-hours (plan)", f"{result['gpu_hours']:,.2f}")
    if best is not None:
        b = result["best"]
        rows.add_row("best", f"trial {best}: {objective} {metric(objective, b.get('value'))}, run {b.get('run_id')} "
                             f"(mcx show {b.get('run_id')})")
    if result["status"] == "planned":
        rows.add_row("run it", "the same command without --dry-run")
    else:
        rows.add_row("report", f"mcx compare --sweep {result['name']} --format html -o {result['name']}.html")
    return Group(t, rows)
