"""What `mcx run`, `mcx reproduce` and `mcx tune` print on stdout when they end: the result, from what the
library returned (typed: `mcx run`'s summary, `mcx reproduce`'s verdict, `mcx tune`'s trials, whose ``to_dict()``
`--json` prints), never the progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mcx.report.fmt import metric
from mcx.report.plan_view import render_plan
from mcx.report.titled import titled_table

if TYPE_CHECKING:
    from mcx.plan.steptime import StepTime
    from mcx.plan.tuning import Candidate
    from mcx.report.reproduction import Reproduction
    from mcx.report.tune_results import TuneLayoutsResult, TuneResult
    from mcx.plan.shown import DryRun
    from mcx.track.run_summary import RunSummary




def _where(rows: list[tuple[str, str]]) -> Table:
    t = Table.grid(padding=(0, 2))
    for key, value in rows:
        t.add_row(key, Text(value))
    return t


def render_run_result(summary: RunSummary) -> RenderableType:
    """The stage table (status, checks passed, losses, speed), the run ID and where its files are."""
    title = Text(f"run {summary.run_id} ({summary.name or ''}): {summary.status}", style="bold")
    if summary.cached:
        title.append(" (cached: not trained again)")
    t = titled_table(title)
    for col in ("stage", "status", "checks", "final train loss", "valid loss", "tokens/s/GPU", "MFU"):
        t.add_column(col, no_wrap=True)
    for name, st in summary.stages.items():
        passed = sum(1 for c in st.checks.values() if isinstance(c, dict) and c.get("passed"))
        m = st.metrics
        t.add_row(name, str(st.status), f"{passed}/{len(st.checks)}" if st.checks else "-",
                  metric("train_loss", m.get("train_loss")), metric("valid_loss", m.get("valid_loss")),
                  metric("tokens_per_s_per_gpu", m.get("tokens_per_s_per_gpu")), metric("mfu", m.get("mfu")))
    rows = [("run ID", str(summary.run_id))]
    if summary.run_dir:
        rows.append(("run directory", summary.run_dir))
    base = summary.baseline or {}
    if base:
        rows.append(("baseline", f"{base.get('baseline')}: {base.get('verdict')} ({base.get('detail')})"))
    tracking = summary.tracking
    if tracking is not None and tracking.state:
        rows.append(("tracking", f"{tracking.target}: {tracking.state}"
                     + ("; run `mcx sync`" if tracking.state == "pending" else "")))
    rows.append(("record", f"mcx show {summary.run_id}"))
    return Group(t, _where(rows))


def render_dry_run(result: DryRun) -> RenderableType:
    """`mcx run --dry-run`: the plan, then each stage's launcher and layout, or its sbatch script."""
    parts: list[RenderableType] = [render_plan(result.plan, result.run_id)]
    for stage, launch in result.launch.items():
        script = result.scripts.get(stage)
        if script is not None:
            parts += [Text(""), Text(f"{stage} stage: sbatch script", style="bold"), Text(script)]
        else:
            parts += [Text(""), Text.assemble((f"{stage} stage", "bold"),
                                              f": {launch.kind} launcher, layout {launch.layout.job_dict()}")]
    return Group(*parts)


def render_verdict(rep: Reproduction) -> RenderableType:
    """`mcx reproduce`: the verdict, what it compared and where the reproduction is."""
    v = rep.verdict
    title = Text(f"reproduction {rep.reproduction} of {rep.run_id}: ", style="bold")
    title.append(v.kind, style="bold green" if v.kind in ("bitwise", "equivalent") else "bold red")
    rows = [("verdict", v.describe())]
    if v.batches is not None:  # before any number: were the same batches trained? (D69)
        rows.append(("batches", v.batches.describe()))
    rows += [("band", str(v.sources_text() or v.band_source)),
            ("steps compared", str(v.steps)),
            ("metrics compared", ", ".join(v.compared) or "-"),
            ("rerun status", str(rep.status))]
    at = v.divergence
    if at is not None:
        rows.append(("diverged at", f"step {at.step}, {at.metric}: {at.original!r} (original) vs "
                     f"{at.rerun!r} (reproduction)"))
    for drifts, label in ((rep.environment_drift, "environment drift"), (rep.hardware_drift, "hardware differs")):
        for d in drifts:
            rows.append((label, f"{d.key}: recorded {d.recorded}, now {d.now}"))
    rows.append(("reproduction directory", rep.reproduction_dir))
    return Group(title, _where(rows))


def render_tune(result: TuneResult) -> RenderableType:
    """`mcx tune`: every trial, the best and the spec written."""
    t = titled_table("micro-batch sweep", style="bold")
    for col in ("micro-batch", "fits", "tokens/s/GPU", "MFU", "peak memory", "expandable segments"):
        t.add_column(col, no_wrap=True)
    for row in result.trials:
        m = row.trial.measured
        t.add_row(str(row.micro_batch_size), "yes" if m is not None else "out of memory",
                  metric("tokens_per_s_per_gpu", None if m is None else m.tokens_per_s_per_gpu),
                  "-" if m is None else metric("mfu", m.mfu), metric("mem_peak_bytes", None if m is None else m.mem_peak_bytes),
                  "on" if row.trial.expandable_segments else "off")
    return Group(t, _where([("best", f"micro_batch_size={result.best.micro_batch_size}"), ("tuned spec", result.spec)]))


def _layout_cells(c: Candidate) -> list[str]:
    lay, st = c.layout, c.settings
    recompute = st.get("train.recompute_granularity", "none")
    return [str(lay.tp), str(lay.pp), str(lay.vpp or "-"), str(lay.cp), str(lay.ep), str(lay.dp),
            str(st["train.micro_batch_size"]), "-" if recompute == "none" else recompute]


def _overheads(step: StepTime) -> str:
    """The two largest shares of the predicted step beside compute (exposed communication, bubble, ...)."""
    top = sorted(((v, k) for k, v in step.breakdown().items() if k != "compute" and v > 0), reverse=True)[:2]
    return ", ".join(f"{k} {v / step.step_s:.0%}" for v, k in top) or "-"


def render_tune_layouts(result: TuneLayoutsResult) -> RenderableType:
    """`mcx tune --layouts`: the model's ranking, the measured trials beside their predictions, the spec written."""
    t = titled_table(f"layouts ranked by the step-time model ({result.fitting:,} of {result.considered:,} valid "
                     "layouts fit)", style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("#", "TP", "PP", "VPP", "CP", "EP", "DP", "mbs", "recompute", "memory", "step", "tokens/s/GPU", "MFU",
                "beside compute"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("recompute", "beside compute") else "right")
    current = result.current
    rows = list(result.ranking)
    if current and (current.rank is None or current.rank > len(rows)):
        rows.append(current)
    for row in rows:
        c, p = row.candidate, row.candidate.step
        mark = " (spec)" if current and c.settings == current.candidate.settings else ""
        memory = metric("mem_peak_bytes", c.memory_bytes) + (" tight" if c.verdict == "tight" else "")
        t.add_row(f"{row.rank or '-'}{mark}", *_layout_cells(c), memory, f"{p.step_s:.3g} s",
                  f"{p.tokens_per_s_per_gpu:,.0f}", f"{p.mfu:.0%}", _overheads(p))
    parts: list[RenderableType] = [t]
    if result.trials:
        m = titled_table("measured", style="bold")
        for col in ("#", "fits", "tokens/s/GPU", "predicted", "model error", "peak memory", "expandable segments"):
            m.add_column(col, no_wrap=True)
        for trial in result.trials:
            predicted = trial.candidate.step.tokens_per_s_per_gpu
            measured = trial.trial.measured
            speed = None if measured is None else measured.tokens_per_s_per_gpu
            m.add_row(str(trial.rank), "yes" if measured is not None else "out of memory",
                      metric("tokens_per_s_per_gpu", speed), f"{predicted:,.0f}",
                      f"{speed / predicted - 1:+.1%}" if speed else "-",  # the step's, as mcx show
                      metric("mem_peak_bytes", None if measured is None else measured.mem_peak_bytes),
                      "on" if trial.trial.expandable_segments else "off")
        parts.append(m)
    if result.best is not None:
        best = result.best
        parts.append(_where([("best", f"layout {best.rank}: {best.trial.tokens_per_s_per_gpu:,.0f} "
                                      "tokens/s/GPU measured"), ("tuned spec", str(result.spec))]))
    else:
        parts.append(Text(f"not measured: {result.not_measured}; run mcx tune --layouts where the spec's GPUs "
                          "are (or with launch.kind = \"slurm\") to measure the top ones and write the tuned spec"))
    return Group(*parts)
