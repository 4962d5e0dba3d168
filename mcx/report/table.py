"""A Comparison for the terminal: rich tables (runs, regressions, metrics, config, fingerprint)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from mcx.contract.status import Status
from mcx.report import fmt
from mcx.report.compare_view import ABSENT, Comparison, DiffRow, MetricRow, drawn_text, same_key
from mcx.report.eval_view import cell_text
from mcx.report.outcome import lines
from mcx.report.plain import plain_text
from mcx.report.titled import titled_table

WIDE_MAX = 6  # runs shown as columns; more runs become rows
VALUE_WIDTH = 48  # long values (hashes, paths, package lists) are cut on a terminal; a pipe, JSON and HTML keep them

_STATUS_STYLE: dict[str, str] = {Status.FINISHED: "green", Status.FAILED: "red", Status.DIVERGED: "red", Status.PREEMPTED: "yellow",
                 Status.INTERRUPTED: "yellow", Status.INCOMPLETE: "yellow"}


def _cut(text: str, width: int, shorten: bool) -> str:
    return fmt.shorten(text, width) if shorten else text


def _run_column(cmp: Comparison, i: int, shorten: bool = True) -> Text:
    h = cmp.runs[i]
    t = Text(h.run_id, style="bold")
    if h.is_baseline:
        t.append(" (baseline)", style="cyan")
    if h.name:
        t.append("\n" + _cut(h.name, 32, shorten), style="dim")
    return t


def _metric_cell(cmp: Comparison, row: MetricRow, i: int) -> Text:
    cell = row.cells[i]
    text = Text(fmt.value(row.metric.unit, cell.value))
    if cmp.baseline is None or cmp.runs[i].is_baseline:
        return text
    d = fmt.delta_text(row.metric.unit, cell)  # within noise: says so, and dim like no change
    if d:
        style = "bold red" if cell.regressed else ("green" if cell.improved else "dim")
        text.append(f" {d}", style=style)
        if cell.regressed:
            text.append(" ▲", style="bold red")
    return text


def _grid(title: str, corner: str, row_heads: Sequence[Text], run_heads: Sequence[Text],
          cells: Sequence[Sequence[Text]], *, runs_are_columns: bool, right: bool) -> Table:
    """A table of ``cells[row][run]``; with ``runs_are_columns`` False, runs become the rows."""
    if not runs_are_columns:
        cells = [list(col) for col in zip(*cells)]
        row_heads, col_heads = run_heads, row_heads
    else:
        col_heads = run_heads
    table = titled_table(title, style="bold")
    table.add_column(corner, no_wrap=True)
    for head in col_heads:
        table.add_column(head, justify="right" if right else "left", overflow="fold")
    for head, row in zip(row_heads, cells):
        table.add_row(head, *row)
    return table


def _diff_table(cmp: Comparison, title: str, rows: Sequence[DiffRow], wide: bool, shorten: bool) -> Table:
    cells = []
    for r in rows:
        ref = same_key(r.values[0])
        line = []
        for v in r.values:
            style = "dim" if v is ABSENT else ("yellow" if same_key(v) != ref else "")
            line.append(Text(_cut(fmt.config_value(v), VALUE_WIDTH, shorten), style=style))
        cells.append(line)
    heads = [_run_column(cmp, i, shorten) for i in range(len(cmp.runs))]
    keys = [Text(r.key, style="cyan") for r in rows]
    return _grid(title, "key" if wide else "run", keys, heads, cells, runs_are_columns=wide, right=False)


class _Report:
    """The comparison, built when a console renders it: values are cut to fit only on a terminal."""

    def __init__(self, cmp: Comparison) -> None:
        self.cmp = cmp

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _build(self.cmp, shorten=options.is_terminal)


def to_table(cmp: Comparison) -> RenderableType:
    """Everything in the comparison as one renderable for ``rich.console.Console.print``."""
    return _Report(cmp)


def to_table_text(cmp: Comparison) -> str:
    """The table as a pipe receives it: plain, whole lines, values uncut (``--format table -o FILE``)."""
    return plain_text(to_table(cmp))


def _build(cmp: Comparison, shorten: bool) -> RenderableType:
    parts: list[RenderableType] = []
    if cmp.summary is not None:  # first, as in the Markdown, JSON and HTML reports
        summary = Text("Summary", style="bold")
        for line in lines(cmp):
            summary.append(f"\n  {line}")
        parts.append(summary)
    runs = titled_table("Runs", style="bold")
    for col in ("run", "name", "status", ""):
        runs.add_column(col)
    for h in cmp.runs:
        runs.add_row(Text(h.run_id), Text(h.name), Text(h.status, style=_STATUS_STYLE.get(h.status, "")),
                     Text("baseline", style="cyan") if h.is_baseline else "")
    parts.append(runs)
    if cmp.regressions:
        text = Text("Regressions against the baseline:\n", style="bold red")
        for r in cmp.regressions:
            text.append(f"  {r.describe()}\n", style="red")
        parts.append(text)
    wide = len(cmp.runs) <= WIDE_MAX
    if cmp.metrics:
        heads = []
        for row in cmp.metrics:
            arrow = "↓" if row.metric.better == "lower" else "↑"
            head = Text(f"{row.metric.label} {arrow}")
            if row.tolerance:
                head.append(f" tol {row.tolerance:.1%}", style="dim")
            heads.append(head)
        cells = [[_metric_cell(cmp, row, i) for i in range(len(cmp.runs))] for row in cmp.metrics]
        run_heads = [_run_column(cmp, i, shorten) for i in range(len(cmp.runs))]
        parts.append(_grid("Metrics", "metric" if wide else "run", heads, run_heads, cells,
                           runs_are_columns=wide, right=True))
    if cmp.mixture:
        run_heads = [_run_column(cmp, i, shorten) for i in range(len(cmp.runs))]
        parts.append(_grid("Data mixture: requested -> drawn", "component" if wide else "run",
                           [Text(row.component) for row in cmp.mixture], run_heads,
                           [[Text(drawn_text(d)) for d in row.cells] for row in cmp.mixture],
                           runs_are_columns=wide, right=True))
    if cmp.evals:
        run_heads = [_run_column(cmp, i, shorten) for i in range(len(cmp.runs))]
        parts.append(_grid("Evaluation: score ± standard error ((noise): within it of the first run's)",
                           "task/metric" if wide else "run", [Text(row.label) for row in cmp.evals], run_heads,
                           [[Text(cell_text(row, i)) for i in range(len(cmp.runs))] for row in cmp.evals],
                           runs_are_columns=wide, right=True))
    if cmp.config_diff:
        parts.append(_diff_table(cmp, "Config differences", cmp.config_diff, wide, shorten))
    else:
        parts.append(Text("Config: the resolved specs are identical.", style="dim"))
    for component, rows in cmp.fingerprint_diff.items():
        parts.append(_diff_table(cmp, f"Fingerprint differences: {component}", rows, wide, shorten))
    if cmp.fingerprint_same:
        parts.append(Text(f"Fingerprint identical in every run: {', '.join(cmp.fingerprint_same)}.", style="dim"))
    for note in cmp.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)
