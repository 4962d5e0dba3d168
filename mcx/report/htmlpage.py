"""A Comparison as one self-contained HTML page: inline CSS, inline SVG charts, no scripts, no fetches.

Made to read on a laptop screen: the summary (what differs, which run is better, against noise),
the runs (with the colours the charts use), any regressions, the metric table with coloured deltas
(greyed within noise), the charts, what differs in config and fingerprint, then the definitions.
The train loss chart switches between smoothed and raw curves with two radio buttons and CSS
(``:checked ~``), so the toggle needs no script. Up to
``WIDE_MAX`` runs are columns; more runs turn the tables so that runs are rows. Every string that
comes from a run (names, spec values, fingerprint fields) goes through ``html.escape``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from mcx.report import fmt
from mcx.report.compare_view import ABSENT, Comparison, DiffRow, MetricRow, Plot, drawn_text, same_key
from mcx.report.eval_view import cell_text
from mcx.report.outcome import MEASURE, definitions, lines
from mcx.report.rolling import spread_band, trailing_mean
from mcx.report.svg import ENVELOPE_MAX, Line, colors, line_chart

WIDE_MAX = 6  # runs shown as table columns; beyond this runs become rows
REGRESSIONS_LISTED = 8  # the rest are marked in the metric table

CSS = """
:root{--fg:#1b1f24;--muted:#667085;--line:#e4e7ec;--bad:#b42318;--bad-bg:#fef3f2;--good:#067647;--accent:#175cd3}
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:var(--fg);
 font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1360px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:20px;margin:0 0 2px}
h2{font-size:15px;margin:0 0 10px}
h3{font-size:13px;margin:14px 0 6px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.sub{color:var(--muted);margin:0 0 12px}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin:12px 0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{padding:5px 12px;border-bottom:1px solid #eef0f3;text-align:right;vertical-align:top;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{font-weight:600;border-bottom:1px solid var(--line);vertical-align:bottom}
tbody tr:hover{background:#f9fafb}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;font-size:12.5px}
.sw{display:inline-block;width:11px;height:11px;border-radius:3px;margin-right:7px;vertical-align:-1px}
.runname{display:block;font-weight:400;color:var(--muted);font-size:12px;max-width:260px;overflow:hidden;
 text-overflow:ellipsis}
.dir{color:var(--muted);font-size:12px;margin-left:4px}
.tol{color:var(--muted);font-size:11.5px;margin-left:6px}
.d{display:inline-block;min-width:5.6em;font-size:12px;color:var(--muted);text-align:right}
.d.bad{color:var(--bad);font-weight:600}.d.good{color:var(--good)}
td.bad{background:var(--bad-bg)}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;border:1px solid currentColor}
.st-finished{color:var(--good)}.st-failed,.st-diverged{color:var(--bad)}.st-preempted,.st-incomplete{color:#b54708}
.base{color:var(--accent);font-weight:600;font-size:12px}
table.runs th,table.runs td{text-align:left}
.alert{border-color:#fda29b;background:var(--bad-bg)}
.alert h2{color:var(--bad)}
.alert li{margin:2px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(540px,1fr));gap:10px 18px}
figure{margin:0}
svg.chart{width:100%;height:auto;display:block}
.diff th{text-align:left}
.diff td{text-align:left;white-space:normal;word-break:break-word;max-width:420px;
 font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;font-size:12.5px}
.diff td.chg{background:#fffaeb}
.absent{color:#98a2b3}
.same{color:var(--muted);margin:6px 0 0}
.notes li{color:var(--muted)}
.d.noise,.nz{color:#98a2b3}.nz{display:block;font-size:11px}
.summary{margin:0;padding-left:18px}.summary li{margin:3px 0}
.view{position:absolute;opacity:0}
.toggle{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:0 0 8px;color:var(--muted);font-size:12.5px}
.toggle label{padding:1px 10px;border:1px solid var(--line);border-radius:12px;cursor:pointer;color:var(--fg)}
#view-smoothed:checked~.toggle label[for=view-smoothed],#view-raw:checked~.toggle label[for=view-raw]{
 background:var(--accent);border-color:var(--accent);color:#fff}
#view-smoothed:focus-visible~.toggle label[for=view-smoothed],#view-raw:focus-visible~.toggle label[for=view-raw]{
 outline:2px solid var(--accent);outline-offset:1px}
#view-smoothed:checked~.grid .raw{opacity:.22}
#view-raw:checked~.grid .smoothed{display:none}
.defs td{white-space:normal;text-align:left;max-width:900px}
footer{color:var(--muted);font-size:12px;margin-top:18px}
"""


def _run_head(cmp: Comparison, i: int, color: str) -> str:
    h = cmp.runs[i]
    base = ' <span class="base">baseline</span>' if h.is_baseline else ""
    name = f'<span class="runname" title="{escape(h.name)}">{escape(h.name)}</span>' if h.name else ""
    return f'<span class="sw" style="background:{color}"></span><code>{escape(h.run_id)}</code>{base}{name}'


def _matrix(corner: str, row_heads: Sequence[str], col_heads: Sequence[str], cells: Sequence[Sequence[str]],
            *, runs_are_columns: bool, cls: str = "") -> str:
    """A table of ``cells[row][run]``; with ``runs_are_columns`` False, runs become the rows."""
    if not runs_are_columns:
        row_heads, col_heads = col_heads, row_heads
        cells = [list(col) for col in zip(*cells)]
        corner = "run"
    head = "".join(f"<th>{h}</th>" for h in col_heads)
    body = "".join(f"<tr><th>{rh}</th>{''.join(row)}</tr>" for rh, row in zip(row_heads, cells))
    cls_attr = f' class="{cls}"' if cls else ""
    return (f'<div class="scroll"><table{cls_attr}><thead><tr><th>{corner}</th>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _metric_cells(cmp: Comparison, row: MetricRow) -> list[str]:
    out = []
    for h, cell in zip(cmp.runs, row.cells):
        text = escape(fmt.value(row.metric.unit, cell.value))
        if cmp.baseline is None or h.is_baseline:
            out.append(f"<td>{text}</td>")
            continue
        d = fmt.delta(row.metric.unit, cell)
        word = fmt.verdict_word(cell)
        cls = "noise" if cell.within_noise else ("bad" if cell.regressed else ("good" if cell.improved else ""))
        title = f' title="{word}"' if word else ""
        mark = " ▲" if cell.regressed else ""
        note = f'<span class="nz">{escape(fmt.noise(cell))}</span>' if cell.within_noise else ""
        td_cls = ' class="bad"' if cell.regressed else ""
        out.append(f'<td{td_cls}{title}>{text} <span class="d {cls}">{escape(d)}{mark}</span>{note}</td>')
    return out


def _metric_head(row: MetricRow) -> str:
    arrow = "↓" if row.metric.better == "lower" else "↑"
    tip = f"{row.metric.better} is better"
    tol = f'<span class="tol">tol {row.tolerance:.1%}</span>' if row.tolerance else ""
    return f'{escape(row.metric.label)}<span class="dir" title="{tip}">{arrow}</span>{tol}'


def _diff_table(rows: Sequence[DiffRow], heads: Sequence[str], wide: bool) -> str:
    cells = []
    for r in rows:
        ref = r.values[0]
        line = []
        for v in r.values:
            text = escape(fmt.config_value(v))
            cls = "absent" if v is ABSENT else ("chg" if same_key(v) != same_key(ref) else "")
            line.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        cells.append(line)
    keys = [f"<code>{escape(r.key)}</code>" for r in rows]
    return _matrix("key", keys, heads, cells, runs_are_columns=wide, cls="diff")


def _runs_section(cmp: Comparison, palette: Sequence[str]) -> str:
    rows = []
    for h, color in zip(cmp.runs, palette):
        status = escape(h.status)
        rows.append(f'<tr><td><span class="sw" style="background:{color}"></span><code>{escape(h.run_id)}</code></td>'
                    f"<td>{escape(h.name)}</td>"
                    f'<td><span class="badge st-{escape(h.status, quote=True)}">{status}</span></td>'
                    f'<td>{"<span class=base>baseline</span>" if h.is_baseline else ""}</td></tr>')
    return ('<div class="scroll"><table class="runs"><thead><tr><th>run</th><th>name</th><th>status</th><th></th>'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _lineage_section(cmp: Comparison, color_of: dict[str, str]) -> str:
    """Where each run's weights came from: its chain of sources, oldest first, then the run."""
    items = []
    for h in cmp.runs:
        steps = [*cmp.lineage.get(h.run_id, ("random weights",)), h.run_id]
        chain = " → ".join(f"<code>{escape(x)}</code>" for x in steps)
        items.append(f'<li><span class="sw" style="background:{color_of[h.run_id]}"></span>{chain}</li>')
    return f'<section id="lineage"><h2>Lineage</h2><ul class="summary">{"".join(items)}</ul></section>'


def _summary_section(cmp: Comparison, color_of: dict[str, str]) -> str:
    """The summary's sentences, run IDs with their colour swatch and the seed command as code."""
    items = []
    for line in lines(cmp):
        text = escape(line).replace(escape(MEASURE), f"<code>{escape(MEASURE)}</code>")
        for h in cmp.runs:  # run IDs are escaped before they are looked for, so no markup gets in
            rid = escape(h.run_id)
            text = re.sub(rf"\b{re.escape(rid)}\b", f'<span class="sw" style="background:{color_of[h.run_id]}">'
                          f"</span><code>{rid}</code>", text)
        items.append(f"<li>{text}</li>")
    return f'<section id="summary"><h2>Summary</h2><ul class="summary">{"".join(items)}</ul></section>'


def _chart(cmp: Comparison, plot: Plot, color_of: dict[str, str]) -> str:
    bands = plot.view == "spread" and len(plot.series) <= ENVELOPE_MAX  # more bands blur together
    lines_ = []
    for s in plot.series:
        steps, values = s.curve.steps, s.curve.values
        lines_.append(Line(s.run_id, s.label + (" (baseline)" if s.run_id == cmp.baseline else ""), color_of[s.run_id],
                           steps, values, smooth=trailing_mean(steps, values) if plot.view == "smoothed" else None,
                           band=spread_band(steps, values) if bands else None))
    return line_chart(lines_, chart_id=f"chart-{plot.key}", title=plot.title, x_label="step", y_label=plot.y_label,
                      zero_based=plot.zero_based)


def _curves_section(cmp: Comparison, color_of: dict[str, str]) -> str:
    figs = "".join(f"<figure>{_chart(cmp, plot, color_of)}</figure>" for plot in cmp.plots)
    toggle = ""
    if any(p.view == "smoothed" for p in cmp.plots):
        toggle = ('<input type="radio" class="view" name="loss-view" id="view-smoothed" checked>'
                  '<input type="radio" class="view" name="loss-view" id="view-raw">'
                  '<div class="toggle" id="loss-toggle">Train loss: <label for="view-smoothed">smoothed</label>'
                  '<label for="view-raw">raw</label><span>smoothed: a trailing mean over the last 1% of steps '
                  "(at least 10), the window of train loss (final); raw curves stay faint behind it</span></div>")
    note = ""
    if any(p.view == "spread" for p in cmp.plots):
        note = ('<p class="same">Throughput: the shaded band is the step-to-step spread, p10..p90 of the per-step '
                "values in a sliding window (see Definitions).</p>")
    return f'<section id="curves"><h2>Curves</h2>{toggle}<div class="grid">{figs}</div>{note}</section>'


def _definitions_section(cmp: Comparison) -> str:
    rows = "".join(f"<tr><th>{escape(term)}</th><td>{escape(text)}</td></tr>" for _, term, text in definitions(cmp))
    return (f'<section id="definitions"><h2>Definitions</h2><div class="scroll"><table class="defs">'
            f"<tbody>{rows}</tbody></table></div></section>")


def to_html(cmp: Comparison) -> str:
    """The comparison as one HTML document (UTF-8 text)."""
    palette = colors(len(cmp.runs))
    color_of = {h.run_id: c for h, c in zip(cmp.runs, palette)}
    wide = len(cmp.runs) <= WIDE_MAX
    heads = [_run_head(cmp, i, palette[i]) for i in range(len(cmp.runs))]
    ids = ", ".join(h.run_id for h in cmp.runs)
    n = len(cmp.runs)
    summary = [f"{n} run{'s' if n != 1 else ''}"]
    if cmp.baseline:
        k = len(cmp.regressions)
        summary.append(f"baseline <code>{escape(cmp.baseline)}</code>")
        summary.append(f"{k} regression{'s' if k != 1 else ''}" if k else "no regressions")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mcx compare: {escape(ids)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<header><h1>Run comparison</h1>",
        f'<p class="sub">{" · ".join(summary)}</p></header>',
        _summary_section(cmp, color_of) if cmp.summary is not None else "",
        _runs_section(cmp, palette),
    ]
    if cmp.sweep is not None:
        from mcx.report.sweep_report import to_html as sweep_html

        parts.append(sweep_html(cmp.sweep, color_of))
    if cmp.lineage:
        parts.append(_lineage_section(cmp, color_of))
    if cmp.regressions:
        items = "".join(f"<li>{escape(r.describe())}</li>" for r in cmp.regressions[:REGRESSIONS_LISTED])
        if len(cmp.regressions) > REGRESSIONS_LISTED:
            items += f"<li>… and {len(cmp.regressions) - REGRESSIONS_LISTED} more, marked ▲ in the table</li>"
        parts.append(f'<section class="alert" id="regressions"><h2>Regressions against the baseline</h2>'
                     f"<ul>{items}</ul></section>")
    parts.append('<section id="metrics"><h2>Metrics</h2>')
    if cmp.metrics:
        cells = [_metric_cells(cmp, row) for row in cmp.metrics]
        parts.append(_matrix("metric", [_metric_head(r) for r in cmp.metrics], heads, cells, runs_are_columns=wide))
        parts.append('<p class="same">How each number is computed: see <a href="#definitions">Definitions</a>.</p>')
    else:
        parts.append('<p class="same">No metrics were logged by these runs.</p>')
    parts.append("</section>")
    if cmp.plots:
        parts.append(_curves_section(cmp, color_of))
    if cmp.mixture:
        parts.append('<section id="mixture"><h2>Data mixture</h2>'
                     '<p class="same">Each component\'s requested share, then the share and samples the run drew.</p>')
        parts.append(_matrix("component", [f"<code>{escape(row.component)}</code>" for row in cmp.mixture], heads,
                             [[f"<td>{escape(drawn_text(d))}</td>" for d in row.cells] for row in cmp.mixture],
                             runs_are_columns=wide))
        parts.append("</section>")
    if cmp.evals:
        parts.append('<section id="eval"><h2>Evaluation</h2><p class="same">lm-evaluation-harness scores with their '
                     'standard errors; "(noise)": the difference from the first run\'s is within their combined '
                     'standard error.</p>')
        parts.append(_matrix("task/metric", [f"<code>{escape(row.label)}</code>" for row in cmp.evals], heads,
                             [[f"<td>{escape(cell_text(row, i))}</td>" for i in range(len(cmp.runs))]
                              for row in cmp.evals], runs_are_columns=wide))
        parts.append("</section>")
    parts.append('<section id="config"><h2>Config differences</h2>')
    if cmp.config_diff:
        parts.append(_diff_table(cmp.config_diff, heads, wide))
    else:
        parts.append('<p class="same">The resolved specs are identical.</p>')
    parts.append("</section>")
    parts.append('<section id="fingerprint"><h2>Fingerprint differences</h2>')
    for component, rows in cmp.fingerprint_diff.items():
        parts.append(f"<h3>{escape(component)}</h3>")
        parts.append(_diff_table(rows, heads, wide))
    if cmp.fingerprint_same:
        parts.append(f'<p class="same">Identical in every run: {escape(", ".join(cmp.fingerprint_same))}.</p>')
    elif not cmp.fingerprint_diff:
        parts.append('<p class="same">No fingerprint records.</p>')
    parts.append("</section>")
    if cmp.notes:
        items = "".join(f"<li>{escape(note)}</li>" for note in cmp.notes)
        parts.append(f'<section class="notes" id="notes"><h2>Notes</h2><ul>{items}</ul></section>')
    parts.append(_definitions_section(cmp))
    parts.append("<footer>Generated by mcx compare.</footer></main></body></html>")
    return "\n".join(parts)
