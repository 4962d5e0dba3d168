"""Terminal views of recorded runs (`mcx ls`, `mcx show`)."""

from __future__ import annotations

import time
from typing import Any

from mcx.metrics.summary import BY_KEY
from mcx.plan.steptime import short_step_note
from mcx.report.fmt import metric
from mcx.report.titled import titled_table

RUN_COLUMNS = ("run_id", "name", "status", "created", "stages", "train_loss", "valid_loss", "tokens_per_s_per_gpu",
               "tracking")


def render_runs(rows: list[dict[str, Any]], plain: bool = False) -> Any:
    """`mcx ls`: a rich table on a terminal; ``plain``: tab-separated text, a header line (RUN_COLUMNS) then
    one run a line, for `cut -f1`, `awk -F'\t'` and spreadsheets (tabs and newlines in values become spaces)."""
    cells = []
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])) if r.get("created") else "-"
        stages = " ".join(f"{k}:{(v or {}).get('status', '?')}" for k, v in (r.get("stages") or {}).items())
        final = r.get("final") or {}
        tracking = r.get("tracking") or {}
        cells.append([r.get("run_id", "?"), str(r.get("name") or "-"), str(r.get("status") or "-"), created, stages or "-",
                      metric("train_loss", final.get("train_loss")), metric("valid_loss", final.get("valid_loss")),
                      metric("tokens_per_s_per_gpu", final.get("tokens_per_s_per_gpu")), str(tracking.get("state", tracking.get("target", "")))])
    if plain:
        return "".join("\t".join(" ".join(c.split()) or "-" for c in line) + "\n" for line in [list(RUN_COLUMNS), *cells])
    t = titled_table(f"{len(rows)} runs")
    for col in ("run ID", "name", "status", "created", "stages", "train loss", "valid loss", "tokens/s/GPU", "tracking"):
        # Words are never split ("finish/ed"): the name and the stages wrap at spaces, the rest stays whole.
        t.add_column(col, no_wrap=col not in ("name", "stages"))
    for line in cells:
        t.add_row(*line)
    return t


SHOW_METRICS = ("train_loss", "valid_loss", "test_ppl", "tokens_per_s_per_gpu", "mfu", "step_time_s", "mem_peak_bytes")


def render_run(record: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")
    for key in ("run_id", "name", "status", "state", "source"):
        if record.get(key) is not None:
            head.add_row(key, str(record[key]))
    if record.get("spec_path"):
        head.add_row("spec", str(record["spec_path"]))
    if record.get("code"):
        head.add_row("code", code_line(record["code"]))
    tracking = record.get("tracking") or {}
    if tracking.get("mlflow_url"):
        head.add_row("MLflow", str(tracking["mlflow_url"]))
    elif tracking.get("mlflow_run"):
        head.add_row("MLflow", f"run {tracking['mlflow_run']} in {tracking.get('target')} "
                               f"(experiment {tracking.get('experiment')})")
    check = record.get("step_time")
    if check:
        note = short_step_note(check["predicted_s"])
        head.add_row("step time", f"{check['measured_s']:.4g} s measured (median step), {check['predicted_s']:.4g} s "
                                  f"predicted on {check['gpu']}: the model is {check['error']:+.1%} off"
                                  + (f"; {note}" if note else ""))
    if tracking.get("pending_ops"):
        head.add_row("unsent", f"{tracking['pending_ops']} records (send with `mcx sync`)")
    for stage, ck in (record.get("checkpoints") or {}).items():
        if stage == "error":
            head.add_row("checkpoints", str(ck.get("detail")))
            continue
        where = ck["path"] + ("" if ck.get("present") else " (not here: `mcx pull`)")
        dvc = f", DVC md5 {ck['md5']}" + (f" on remote {ck['remote']}" if ck.get("remote") else "") if ck.get("md5") else ""
        head.add_row(f"{stage} checkpoint", where + dvc)
    stage_recs = {name: st or {} for name, st in (record.get("stages") or {}).items()}
    stages = titled_table("stages (metrics as docs/metrics.md defines them)")
    stages.add_column("", no_wrap=True)
    for name in stage_recs:
        stages.add_column(name, justify="right", overflow="fold")
    for label, cell in (("status", lambda st: str(st.get("status"))), ("passed", lambda st: str(st.get("passed"))),
                        ("steps", lambda st: str(st.get("steps")))):
        stages.add_row(label, *(cell(st) for st in stage_recs.values()))
    for key in SHOW_METRICS:
        stages.add_row(BY_KEY[key].label, *(metric(key, (st.get("final") or {}).get(key)) for st in stage_recs.values()))
    mixed = {name: st["mixture"] for name, st in stage_recs.items() if st.get("mixture")}
    if mixed:  # a mixture's realised shares beside the requested ones (D60)
        stages.add_row("mixture: requested -> drawn", *("" for _ in stage_recs))
        for part in sorted({p for m in mixed.values() for p in m}):
            stages.add_row(f"  {part}", *(_drawn((mixed.get(name) or {}).get(part)) for name in stage_recs))
    tags = titled_table("fingerprint")
    tags.add_column("tag", overflow="fold")
    tags.add_column("value", overflow="fold")
    for k, v in sorted((record.get("tags") or {}).items()):
        tags.add_row(k, str(v))
    return Group(head, stages, tags)


def _drawn(part: dict[str, Any] | None) -> str:
    """A component's requested share, and the share and samples the run drew from it."""
    if not part:
        return "-"
    return f"{part['requested']:.1%} -> {part['share']:.1%} ({part['samples']:,} samples)"


def code_line(code: dict[str, Any]) -> str:
    """A run's code provenance in one line: commit, branch, uncommitted paths, mcx and the modules its ID hashed."""
    where = f"commit {code['commit'][:12]}" if code.get("commit") else "outside git"
    if code.get("branch"):
        where += f" on {code['branch']}"
    if code.get("dirty"):
        paths = code.get("changes") or []
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        where += f", with uncommitted changes ({shown})" if paths else ", with uncommitted changes"
    hashed = (f"{code['modules']} of its modules hashed into the run ID" if code.get("modules") is not None
              else "the commit hashed into the run ID (recorded before D52)")
    return f"{where}; mcx {code.get('mcx_version')}, {hashed}"


def render_lineage(chain: dict[str, Any]) -> Any:
    """`mcx lineage`: the first source at the top, then each ancestor, the run, and its descendants indented."""
    t = titled_table(f"lineage of {chain['run']['run_id']}")
    for col in ("", "run ID / source", "name", "status", "started from"):
        t.add_column(col, no_wrap=col != "name")
    ancestors = chain["ancestors"]
    rows = []
    for i, a in enumerate(ancestors):  # nearest first; each started from the next one
        if a["kind"] != "run":
            origin = a.get("exported_from") or {}
            rows.append(["source", f"{a['kind']}:{a.get('path') or '?'}", "-", "-",
                         f"exported from {origin.get('run_id')} step {origin.get('step')}" if origin.get("run_id")
                         else f"content {str(a.get('content'))[:12]}"])
            continue
        older = ancestors[i + 1] if i + 1 < len(ancestors) else None
        rows.append(["ancestor", a["run_id"], str(a.get("name") or "-"),
                     str(a.get("status") or "-") if a["here"] else "not in this project",
                     _from(older) if (older or a["here"]) else "?"])
    rows.reverse()
    run = chain["run"]
    rows.append(["this run", run["run_id"], str(run.get("name") or "-"), str(run.get("status") or "-"),
                 _from(ancestors[0] if ancestors else None)])
    for d in chain["descendants"]:
        rows.append(["  " * (d["depth"] - 1) + "descendant", d["run_id"], str(d.get("name") or "-"),
                     str(d.get("status") or "-"), f"{d['parent']} step {d.get('step')}"
                     + (f" via {d['via']}" if d.get("via") else "")])
    for row in rows:
        t.add_row(*row)
    return t


def _from(source: dict[str, Any] | None) -> str:
    if source is None:
        return "random weights"
    if source["kind"] == "run":
        return f"{source['run_id']} step {source.get('step')}"
    return f"{source['kind']}:{source.get('path') or '?'}"
