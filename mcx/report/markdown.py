"""A Comparison as GitHub-flavoured Markdown (for pull requests, wikis, CI summaries)."""

from __future__ import annotations

from collections.abc import Sequence

from mcx.report import fmt
from mcx.report.compare_view import ABSENT, Comparison, DiffRow, drawn_text
from mcx.report.outcome import MEASURE, definitions, lines

_MD_SPECIAL = str.maketrans({**{c: f"\\{c}" for c in "\\`*_{}[]()#+!|~"}, "&": "&amp;", "<": "&lt;", ">": "&gt;"})


def md_escape(text: str) -> str:
    """Text that Markdown shows as written, on one table row: markup characters backslash-escaped, HTML
    characters as entities (so no tag survives), newlines flattened."""
    return text.translate(_MD_SPECIAL).replace("\r", " ").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks and pipes inside the text."""
    text = text.replace("\n", " ").replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align_right_from: int = 1) -> list[str]:
    sep = [":--" if i < align_right_from else "--:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _run_head(cmp: Comparison, i: int) -> str:
    h = cmp.runs[i]
    return _code(h.run_id) + (" (baseline)" if h.is_baseline else "")


def _diff(cmp: Comparison, rows: Sequence[DiffRow]) -> list[str]:
    header = ["key", *(_run_head(cmp, i) for i in range(len(cmp.runs)))]
    body = [[_code(r.key), *(fmt.DASH if v is ABSENT else md_escape(fmt.config_value(v)) for v in r.values)]
            for r in rows]
    return _table(header, body, align_right_from=len(header))


def to_markdown(cmp: Comparison) -> str:
    """The comparison as a Markdown document."""
    out = ["## Run comparison", ""]
    run_rows = [[_code(h.run_id), md_escape(h.name), md_escape(h.status), "baseline" if h.is_baseline else ""]
                for h in cmp.runs]
    if cmp.summary is not None:
        out += ["### Summary", ""]
        out += [f"- {md_escape(line).replace(md_escape(MEASURE), _code(MEASURE))}" for line in lines(cmp)]
        out.append("")
    out += _table(["run", "name", "status", ""], run_rows, align_right_from=4)
    out.append("")
    if cmp.sweep is not None:
        from mcx.report.sweep_report import to_markdown as sweep_markdown

        out += sweep_markdown(cmp.sweep)
    if cmp.baseline is not None:
        if cmp.regressions:
            out.append(f"**{len(cmp.regressions)} regression(s) against the baseline:**")
            out.append("")
            out += [f"- {md_escape(r.describe())}" for r in cmp.regressions]
        else:
            out.append("No regressions against the baseline.")
        out.append("")
    if cmp.metrics:
        out += ["### Metrics", ""]
        header = ["metric", *(_run_head(cmp, i) for i in range(len(cmp.runs)))]
        rows = []
        for row in cmp.metrics:
            arrow = "↓" if row.metric.better == "lower" else "↑"
            tol = f" (tol {row.tolerance:.1%})" if row.tolerance else ""
            cells = []
            for h, cell in zip(cmp.runs, row.cells):
                text = fmt.value(row.metric.unit, cell.value)
                if cmp.baseline is not None and not h.is_baseline:
                    d, noise = fmt.delta(row.metric.unit, cell), fmt.noise(cell)
                    if cell.regressed:
                        text = f"**{text} ({d}) ▲ regression**" if d else f"**{text} ▲ regression**"
                    elif noise:
                        text = f"{text} ({d}, {noise})"
                    elif d:
                        text = f"{text} ({d})"
                cells.append(text)
            rows.append([f"{row.metric.label} {arrow}{tol}", *cells])
        out += _table(header, rows)
        out.append("")
    if cmp.mixture:
        out += ["### Data mixture (requested -> drawn)", ""]
        header = ["component", *(_run_head(cmp, i) for i in range(len(cmp.runs)))]
        out += _table(header, [[_code(row.component), *(drawn_text(d) for d in row.cells)] for row in cmp.mixture])
        out.append("")
    out += ["### Config differences", ""]
    out += _diff(cmp, cmp.config_diff) if cmp.config_diff else ["The resolved specs are identical."]
    out.append("")
    if cmp.fingerprint_diff or cmp.fingerprint_same:
        out += ["### Fingerprint differences", ""]
        for component, diff_rows in cmp.fingerprint_diff.items():
            out += [f"**{md_escape(component)}**", ""]
            out += _diff(cmp, diff_rows)
            out.append("")
        if cmp.fingerprint_same:
            out += [f"Identical in every run: {md_escape(', '.join(cmp.fingerprint_same))}.", ""]
    if cmp.notes:
        out += ["### Notes", ""]
        out += [f"- {md_escape(n)}" for n in cmp.notes]
        out.append("")
    out += ["### Definitions", ""]
    out += [f"- **{md_escape(term)}**: {md_escape(text)}" for _, term, text in definitions(cmp)]
    out.append("")
    return "\n".join(out)
