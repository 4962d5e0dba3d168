"""Terminal views of recorded runs (`mcx ls`, `mcx show`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mcx.eval.scores import STDERR, Evaluation
from mcx.metrics.summary import BY_KEY
from mcx.plan.steptime import short_step_note
from mcx.report.eval_view import evaluation_lines, score_text
from mcx.report.fmt import metric
from mcx.report.titled import titled_table
from mcx.report.compare_view import drawn_text
from mcx.report.rundata import Drawn
from mcx.track.lineage import Ancestor, Lineage, ModelSource, RunAncestor
from mcx.track.run_entry import CodeProvenance, RunEntry, ShownRun

if TYPE_CHECKING:
    from rich.console import Group
    from rich.table import Table

RUN_COLUMNS = ("run_id", "name", "status", "created", "stages", "train_loss", "valid_loss", "tokens_per_s_per_gpu",
               "tracking")


def render_runs(rows: list[RunEntry], columns: tuple[str, ...] = ()) -> Table:
    """`mcx ls` on a terminal: a rich table; ``columns`` (`--columns`, resolved) after the usual ones."""
    t = titled_table(f"{len(rows)} runs")
    for col in ("run ID", "name", "status", "created", "stages", "train loss", "valid loss", "tokens/s/GPU", "tracking"):
        # Words are never split ("finish/ed"): the name and the stages wrap at spaces, the rest stays whole.
        t.add_column(col, no_wrap=col not in ("name", "stages"))
    lines = _run_cells(rows, columns)
    for i, col in enumerate(columns, start=len(RUN_COLUMNS)):  # named as asked; a value is never split, a long
        widest = max((len(line[i]) for line in lines), default=1)  # name folds over its value's width
        t.add_column(col, justify="right", overflow="fold", min_width=widest)
    for line in lines:
        t.add_row(*line)
    return t


def runs_text(rows: list[RunEntry], columns: tuple[str, ...] = ()) -> str:
    """`mcx ls` off a terminal: tab-separated text, a header line (RUN_COLUMNS, then ``columns``) then one run a
    line, for `cut -f1`, `awk -F'\t'` and spreadsheets (tabs and newlines in values become spaces)."""
    lines = [[*RUN_COLUMNS, *columns], *_run_cells(rows, columns)]
    return "".join("\t".join(" ".join(c.split()) or "-" for c in line) + "\n" for line in lines)


def column_text(row: RunEntry, column: str) -> str:
    """An extra column's cell: the summary value as every surface prints it, a score with its standard error."""
    value, stderr = row.final.get(column), row.final.get(column + STDERR)
    if isinstance(value, (int, float)) and isinstance(stderr, (int, float)) and not isinstance(value, bool):
        return score_text(float(value), float(stderr))
    return metric(column, value)


def _run_cells(rows: list[RunEntry], columns: tuple[str, ...] = ()) -> list[list[str]]:
    cells = []
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created)) if r.created else "-"
        stages = " ".join(f"{k}:{v.status or '?'}" for k, v in r.stages.items())
        cells.append([r.run_id or "?", str(r.name or "-"), str(r.status or "-"), created, stages or "-",
                      metric("train_loss", r.final.get("train_loss")), metric("valid_loss", r.final.get("valid_loss")),
                      metric("tokens_per_s_per_gpu", r.final.get("tokens_per_s_per_gpu")), _where_recorded(r),
                      *(column_text(r, c) for c in columns)])
    return cells


def _where_recorded(run: RunEntry) -> str:
    """The tracking column: the target a local run records to ("None" before its first record); blank for a
    run only the store knows."""
    return str(run.tracking.target) if run.source == "local" else ""


SHOW_METRICS = ("train_loss", "valid_loss", "test_ppl", "tokens_per_s_per_gpu", "mfu", "step_time_s", "mem_peak_bytes")


def render_run(shown: ShownRun) -> Group:
    from rich.console import Group
    from rich.table import Table

    record, tracking = shown.entry, shown.entry.tracking
    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")
    for key, value in (("run_id", record.run_id), ("name", record.name), ("status", record.status),
                       ("state", record.state), ("source", record.source)):
        if value is not None:
            head.add_row(key, str(value))
    if shown.spec_path:
        head.add_row("spec", shown.spec_path)
    if shown.code:
        head.add_row("code", code_line(shown.code))
    if tracking.mlflow_url:
        head.add_row("MLflow", tracking.mlflow_url)
    elif tracking.mlflow_run:
        head.add_row("MLflow", f"run {tracking.mlflow_run} in {tracking.target} (experiment {tracking.experiment})")
    check = record.step_time
    if check:
        note = short_step_note(check.predicted_s)
        head.add_row("step time", f"{check.measured_s:.4g} s measured (median step), {check.predicted_s:.4g} s "
                                  f"predicted on {check.gpu}: the model is {check.error:+.1%} off"
                                  + (f"; its host took {check.host_layer_s * 1000:.1f} ms a layer and micro-batch, "
                                     f"which this project's next plans on {check.gpu} use" if check.host_layer_s else "")
                                  + (f"; {note}" if note else ""))
    for stage, slow in shown.slowest_ranks.items():
        head.add_row(f"{stage} slowest rank", slow.describe())
    for stage, where in shown.profiles.items():
        head.add_row(f"{stage} profile", f"{where} (trace-rank<R>.json.gz: ui.perfetto.dev; ops-rank<R>.txt: ops by "
                                         "self CPU time)")
    if tracking.pending_ops:
        head.add_row("unsent", f"{tracking.pending_ops} records (send with `mcx sync`)")
    if shown.checkpoints_error is not None:
        head.add_row("checkpoints", shown.checkpoints_error)
    for stage, ck in shown.checkpoints.items():
        where = ck.path + ("" if ck.present else " (not here: `mcx pull`)")
        dvc = f", DVC md5 {ck.md5}" + (f" on remote {ck.remote}" if ck.remote else "") if ck.md5 else ""
        head.add_row(f"{stage} checkpoint", where + dvc)
    stages = titled_table("stages (metrics as docs/metrics.md defines them)")
    stages.add_column("", no_wrap=True)
    for name in record.stages:
        stages.add_column(name, justify="right", overflow="fold")
    for label, cell in (("status", lambda st: str(st.status)), ("passed", lambda st: str(st.passed)),
                        ("steps", lambda st: str(st.steps))):
        stages.add_row(label, *(cell(st) for st in record.stages.values()))
    routed = any((st.final or {}).get("moe_expert_load") is not None for st in record.stages.values())
    for key in (*SHOW_METRICS, "moe_expert_load") if routed else SHOW_METRICS:  # the routing: a mixture of experts
        stages.add_row(BY_KEY[key].label, *(metric(key, (st.final or {}).get(key)) for st in record.stages.values()))
    mixed = {name: st.mixture for name, st in record.stages.items() if st.mixture}
    if mixed:  # a mixture's realised shares beside the requested ones (D60)
        stages.add_row("mixture: requested -> drawn", *("" for _ in record.stages))
        for part in sorted({p for m in mixed.values() for p in m}):
            stages.add_row(f"  {part}", *(drawn_text(Drawn.parse((mixed.get(name) or {}).get(part))) for name in record.stages))
    tags = titled_table("fingerprint")
    tags.add_column("tag", overflow="fold")
    tags.add_column("value", overflow="fold")
    for k, v in sorted(shown.tags.items()):
        tags.add_row(k, str(v))
    if shown.evaluation is None:
        return Group(head, stages, tags)
    ev = titled_table("evaluation (" + evaluation_lines(record.run_id or "", shown.evaluation)[0].split(": ", 1)[1] + ")")
    for column in ("task", "metric", "score ± stderr"):
        ev.add_column(column, overflow="fold")
    for score in shown.evaluation.scores:
        ev.add_row(score.task, score.metric, score_text(score.value, score.stderr))
    if not shown.eval_steps:
        return Group(head, stages, ev, tags)
    return Group(head, stages, ev, eval_steps_table(shown.eval_steps), tags)


def eval_steps_table(steps: dict[int, Evaluation]) -> Table:
    """[eval] every (D71): one row a checkpoint's step, one column a task's metric (score ± stderr)."""
    names = list(dict.fromkeys(f"{s.task}/{s.metric}" for ev in steps.values() for s in ev.scores))
    t = titled_table("evaluation at checkpoints (score ± standard error)")
    t.add_column("step", justify="right", no_wrap=True)
    for name in names:
        t.add_column(name, justify="right", overflow="fold")
    for step, ev in sorted(steps.items()):
        by_name = {f"{s.task}/{s.metric}": s for s in ev.scores}
        t.add_row(str(step), *(score_text(by_name[n].value, by_name[n].stderr) if n in by_name else "-" for n in names))
    return t


def code_line(code: CodeProvenance) -> str:
    """A run's code provenance in one line: commit, branch, uncommitted paths, mcx and the modules its ID hashed."""
    where = f"commit {code.commit[:12]}" if code.commit else "outside git"
    if code.branch:
        where += f" on {code.branch}"
    if code.dirty:
        paths = code.changes
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        where += f", with uncommitted changes ({shown})" if paths else ", with uncommitted changes"
    hashed = (f"{code.modules} of its modules hashed into the run ID" if code.modules is not None
              else "the commit hashed into the run ID (recorded before D52)")
    return f"{where}; mcx {code.mcx_version}, {hashed}"


def render_lineage(chain: Lineage) -> Table:
    """`mcx lineage`: the first source at the top, then each ancestor, the run, and its descendants indented."""
    t = titled_table(f"lineage of {chain.run.run_id}")
    for col in ("", "run ID / source", "name", "status", "started from"):
        t.add_column(col, no_wrap=col != "name")
    ancestors = chain.ancestors
    rows = []
    for i, a in enumerate(ancestors):  # nearest first; each started from the next one
        if isinstance(a, ModelSource):
            origin = a.exported_from
            rows.append(["source", f"{a.kind}:{a.path or '?'}", "-", "-",
                         f"exported from {origin.run_id} step {origin.step}"
                         if origin is not None and origin.run_id else f"content {str(a.content)[:12]}"])
            continue
        older = ancestors[i + 1] if i + 1 < len(ancestors) else None
        rows.append(["ancestor", a.run_id, str(a.name or "-"), str(a.status or "-") if a.here else "not in this project",
                     _from(older) if (older or a.here) else "?"])
    rows.reverse()
    run = chain.run
    rows.append(["this run", run.run_id, str(run.name or "-"), str(run.status or "-"),
                 _from(ancestors[0] if ancestors else None)])
    for d in chain.descendants:
        rows.append(["  " * (d.depth - 1) + "descendant", d.run_id, str(d.name or "-"), str(d.status or "-"),
                     f"{d.parent} step {d.step}" + (f" via {d.via}" if d.via else "")])
    for row in rows:
        t.add_row(*row)
    return t


def _from(source: Ancestor | None) -> str:
    if source is None:
        return "random weights"
    if isinstance(source, RunAncestor):
        return f"{source.run_id} step {source.step}"
    return f"{source.kind}:{source.path or '?'}"
