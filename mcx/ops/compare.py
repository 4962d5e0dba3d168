"""`mcx compare`: config and fingerprint diffs, metric table with baseline deltas, loss curves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from mcx.errors import InputError
from mcx.eval.scores import RUN_FILE, read_evaluation
from mcx.metrics.batches import BatchCheck, compare_batches, read_batches
from mcx.ops.outputs import check_output_file, write_text
from mcx.ops.records import run_dirs
from mcx.ops.sweep import show
from mcx.report.compare_view import Comparison, compare as build
from mcx.report.eval_view import EvalRow, eval_rows
from mcx.report.rundata import RunData, load_run_dir
from mcx.report.seeds import seed_runs
from mcx.report.sweep_report import SweepSection, SweepTrial
from mcx.track.lineage import RunAncestor, describe_source, lineage

if TYPE_CHECKING:
    from rich.console import RenderableType


BEST_COMPARED = 5  # `--sweep`: the best complete trials whose runs are compared


def compare(run_ids: list[str], *, project: Path, experiment: str | None, baseline: str | None, fmt: str,
            out: str | None, sweep: str | None = None) -> RenderableType | None:
    """The report in ``fmt`` (text; a rich table for ``table`` on the terminal); written to ``out`` (and None
    returned) when given. ``sweep``: that sweep's best
    trials are compared, and the report shows its objective against each parameter and every trial."""
    import json

    if out:  # a bad -o is bad input, said before any run is read
        check_output_file(out, "-o")
    section = None
    if sweep is not None:
        section = _sweep_section(project, sweep)
        best = [t.run_id for t in section.trials if t.state == "complete" and t.run_id][:BEST_COMPARED]
        run_ids = [*run_ids, *(r for r in best if r not in run_ids)]
    dirs = run_dirs(project, run_ids, experiment)
    base = None
    if baseline:
        base_id = baseline
        if not _looks_like_run_id(baseline):
            from mcx.track.baseline import resolve

            base_id = resolve(project, baseline)
        base = load_run_dir(run_dirs(project, [base_id], None)[0])
    runs = [load_run_dir(d) for d in dirs if base is None or d.name != base.run_id]
    if not runs:
        raise InputError("only the baseline was given;", "name at least one other run to compare with it.")
    cmp = build(runs, base)
    if seeds := _seed_groups(project, cmp):
        cmp = build(runs, base, seeds=seeds)
    if chains := _chains(project, [h.run_id for h in cmp.runs]):
        cmp = attrs.evolve(cmp, lineage=chains)
    if section is not None:
        cmp = attrs.evolve(cmp, sweep=section)
    every_dir = [*dirs, *run_dirs(project, [base.run_id], None)] if base is not None else dirs
    if evals := _evals(cmp, every_dir):
        cmp = attrs.evolve(cmp, evals=evals)
    if len(cmp.runs) == 2 and (batches := _batches(cmp, every_dir)):
        cmp = attrs.evolve(cmp, batches=batches)
    if fmt == "table":
        from mcx.report.table import to_table, to_table_text

        rendered: RenderableType = to_table_text(cmp) if out else to_table(cmp)
    elif fmt == "md":
        from mcx.report.markdown import to_markdown

        rendered = to_markdown(cmp)
    elif fmt == "json":
        from mcx.report.jsondoc import to_json

        rendered = json.dumps(to_json(cmp, curves=True), sort_keys=True, indent=1)
    else:
        from mcx.report.htmlpage import to_html

        rendered = to_html(cmp)
    if out:
        assert isinstance(rendered, str)  # every format is text when written (the table: to_table_text)
        write_text(Path(out), rendered, "-o")
        return None
    return rendered


def _evals(cmp: Comparison, dirs: list[Path]) -> tuple[EvalRow, ...]:
    """The runs' downstream scores (eval.json), in the comparison's order; none when no run was evaluated."""
    where = {d.name: d for d in dirs}
    found = [read_evaluation(where[h.run_id] / RUN_FILE) if h.run_id in where else None for h in cmp.runs]
    return eval_rows(found) if any(found) else ()


def _batches(cmp: Comparison, dirs: list[Path]) -> BatchCheck | None:
    """Two runs' batch hashes (their main stage's, as the curves), step by step; None unless both recorded them."""
    where = {d.name: d for d in dirs}
    found = []
    for h in cmp.runs:
        d = where.get(h.run_id)
        if d is None:
            return None
        found.append(read_batches(d / "full" if (d / "full").is_dir() else d / "smoke"))
    return compare_batches(found[0], found[1])


def _seed_groups(project: Path, cmp: Comparison) -> dict[str, list[RunData]]:
    """The summary's run-to-run noise: for each run of its headline, the recorded runs that differ from
    it only in train.seed (a scan of the project's fingerprints; only those runs' metrics are read)."""
    groups = {}
    for run_id in cmp.summary.pair if cmp.summary is not None else ():
        try:
            found = seed_runs(project, run_id)
        except InputError:  # a record this mcx cannot read gives no estimate; the summary says "unknown"
            continue
        if len(found) >= 2:
            groups[run_id] = [s.data for s in found]
    return groups


def _sweep_section(project: Path, name: str) -> SweepSection:
    result = show(name, project)
    if result.best is None:
        raise InputError(f"sweep {name} has no complete trial to compare;", f"run it first (`mcx sweep SPEC`), or see "
                         f"`mcx sweep show {name}`.")
    return SweepSection(name=name, objective=result.objective, direction=result.direction,
                        parameters=result.parameters,
                        trials=tuple(SweepTrial(number=t.number, params=t.params, state=t.state, value=t.value,
                                                run_id=t.run_id) for t in result.trials))


def _chains(project: Path, run_ids: list[str]) -> dict[str, tuple[str, ...]]:
    """Each run's sources, oldest first (mcx lineage), for runs that started from other weights."""
    out = {}
    for run_id in run_ids:
        try:
            ancestors = lineage(project, run_id).ancestors
        except InputError:  # a run known only to the tracking store
            continue
        if ancestors:
            last = ancestors[-1]
            first = ["random weights"] if isinstance(last, RunAncestor) and last.here else []
            out[run_id] = tuple(first + [describe_source(a) for a in reversed(ancestors)])
    return out


def _looks_like_run_id(text: str) -> bool:
    import re

    return re.fullmatch(r"[0-9a-f]{12}", text) is not None
