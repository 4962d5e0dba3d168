"""`mcx plan` on a terminal: the plan (``mcx.plan.shown.ShownPlan``) as rich tables. Fits an 100-column terminal."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mcx.plan.gpus import gpu_info
from mcx.plan.mixture import DataRow
from mcx.plan.planner import Plan, StagePlan
from mcx.plan.shown import ShownPlan
from mcx.plan.steptime import device_for, host_weight, step_seconds
from mcx.report.titled import titled_table

_GiB = 1 << 30
_VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "does not fit": "bold red", "unknown": "dim"}
_DASH = "—"
_SOURCE = {"model": "step-time model", "assumed": "budget.assumed_mfu", "measured": "measured"}


def _gib(n: float | None) -> str:
    if n is None:
        return _DASH
    return f"{n / _GiB:,.1f} GiB" if n >= _GiB / 10 else f"{n / (1 << 20):,.1f} MiB"


def _count(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{n:,.0f}"


def _flops(n: float) -> str:
    for div, unit in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if n >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def _hours(h: float | None) -> str:
    if h is None:
        return "unknown"
    if h < 1:
        return f"{h * 60:.1f} min"
    if h < 48:
        return f"{h:.1f} h"
    return f"{h / 24:.1f} days ({h:,.0f} h)"


def _seconds(s: float | None) -> str:
    return "unknown" if s is None else step_seconds(s)


def _table(title: str, *columns: str, right: tuple[int, ...] = ()) -> Table:
    t = titled_table(title, style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                     show_header=bool(columns and any(columns)), min_width=len(title) + 2)
    for i, c in enumerate(columns):
        t.add_column(c, justify="right" if i in right else "left")
    return t


def _layout_table(p: Plan) -> Table:
    lay = p.layout
    t = _table("Parallel layout", "TP", "PP", "VPP", "CP", "EP", "DP", "GPUs", "SP", "dist. opt.", "layer spec",
               right=tuple(range(7)))
    impl = {"transformer_engine": "TE"}.get(p.transformer_impl, p.transformer_impl)
    t.add_row(str(lay.tp), str(lay.pp), str(lay.vpp or _DASH), str(lay.cp), str(lay.ep), str(lay.dp),
              f"{lay.world_size} ({lay.nodes}x{lay.gpus_per_node})",
              "on" if lay.sequence_parallel else "off", "on" if lay.distributed_optimizer else "off",
              impl + ("" if p.transformer_impl_known else " (assumed)"))
    return t


def _model_table(p: Plan) -> Table:
    par = p.params
    t = _table("Parameters", "", "", right=(1,))
    t.add_row("total", _count(par.total))
    if par.active != par.total:
        t.add_row("active per token", _count(par.active))
    t.add_row("on the most loaded GPU", _count(p.params_per_gpu))
    t.add_row("vocabulary (padded)", f"{p.vocab_size:,} ({par.padded_vocab:,})")
    return t


def _memory_table(p: Plan) -> RenderableType:
    mem = p.memory
    total = mem.total
    stage = {"only": "", "first": ", first pipeline stage", "last": ", last pipeline stage"}[mem.stage]
    t = _table(f"Memory per GPU{stage}", "", "", "share", right=(1, 2))
    for name, n in mem.breakdown().items():
        t.add_row(name, _gib(n), f"{n / total:.0%}" if total else "")
    t.add_row(Text("total", style="bold"), Text(_gib(total), style="bold"), "")
    cap = mem.capacity
    gpu = p.spec.hardware.gpu
    if cap:
        line = Text(f"{_gib(total)} of {_gib(cap)} on {gpu} ({total / cap:.0%}): ")
    else:
        line = Text(f"{_gib(total)}; hardware.gpu = \"{gpu}\" has no known memory: ")
    line.append(mem.verdict, style=_VERDICT_STYLE.get(mem.verdict, ""))
    parts: list[RenderableType] = [t, line]
    for fix in mem.fixes:
        parts.append(Text(f"  fix: {fix}", style="yellow"))
    return Group(*parts)


def _compute_table(p: Plan) -> Table:
    c = p.cost
    t = _table("Compute, time and cost", "", "", right=(1,))
    t.add_row("FLOPs per step (Megatron's count)", _flops(p.flops_per_step))
    t.add_row("FLOPs per token", _flops(p.flops_per_token))
    t.add_row("tokens per step", f"{p.tokens_per_step:,} ({p.num_microbatches} micro-batches per DP rank)")
    t.add_row("steps, tokens", f"{p.spec.train.train_iters:,}, {_count(p.tokens_per_step * p.spec.train.train_iters)}")
    info, model = gpu_info(p.spec.hardware.gpu), c.predicted
    peak = info.bf16_tflops * 1e12 if info else None
    source = _SOURCE.get(c.mfu_source, c.mfu_source)
    mfu = _DASH if c.mfu is None else f"{c.mfu:.0%}"
    t.add_row("MFU (vs bf16 dense peak)", f"{mfu} ({source})" + (f" of {peak / 1e12:,.0f} TFLOP/s" if peak else
                                                                  "; peak unknown"))
    t.add_row("step time", _seconds(c.step_time_s) + (f" ({source})" if c.step_time_s is not None else ""))
    if model and c.mfu_source != "model":
        t.add_row("the model's step time", f"{_seconds(model.step_s)} ({model.mfu:.0%} MFU)")
    if model:
        t.add_row("tokens/s/GPU (the model's)", f"{model.tokens_per_s_per_gpu:,.0f}")
    t.add_row("wall time", _hours(c.wall_time_h))
    t.add_row("GPU-hours", _DASH if c.gpu_hours is None else f"{c.gpu_hours:,.1f}")
    if c.cost is not None:
        t.add_row("cost", f"{c.cost:,.0f} (at {p.spec.budget.gpu_hour_price:g} per GPU-hour)")
    if c.max_gpu_hours is not None:
        over = c.over_budget
        status = (Text("unchecked (no GPU-hours)", style="dim") if over is None
                  else Text("over budget: needs --yes", style="bold red") if over
                  else Text("within budget", style="green"))
        t.add_row("budget", Text.assemble(f"{c.max_gpu_hours:,.0f} GPU-hours: ", status))
    return t


def _step_table(p: Plan) -> RenderableType:
    """Where the model's step goes: compute, exposed communication, the pipeline bubble, the rest."""
    model = p.cost.predicted
    if not model:
        return Text("")
    step = model.step_s
    t = _table("Step time, predicted (docs/steptime.md)", "", "", "share", right=(1, 2))
    for name, seconds in model.breakdown().items():
        if seconds > 0:
            t.add_row(name, _seconds(seconds), f"{seconds / step:.0%}")
    t.add_row(Text("step", style="bold"), Text(_seconds(step), style="bold"), "")
    floor = _host_floor(p)
    if floor and (model.host_wait_s > 0 or p.host_floor is not None):
        t.add_row("host floor", floor, "")
    return t


def _host_floor(p: Plan) -> str | None:
    """The host's time a layer and micro-batch the step was priced with, and where it comes from (D78)."""
    learned, dev = p.host_floor, device_for(p.spec)
    if dev is None:
        return None
    m = p.spec.model
    moe = f"; a MoE layer {host_weight(m.num_experts, m.moe_grouped_gemm, dev.cal):g}x that" if m.num_experts else ""
    if learned is not None:
        n = len(learned.runs)
        return (f"{learned.host_layer_s * 1000:.1f} ms a layer and micro-batch{moe}, measured by {n} run{'s' * (n > 1)} "
                f"of this project on {learned.gpu} (calibrated: {learned.calibrated_s * 1000:.1f} ms)")
    return f"{dev.cal.host_layer_s * 1000:.1f} ms a layer and micro-batch{moe} (calibrated)"


def _smoke_line(smoke: StagePlan | None) -> RenderableType:
    if smoke is None:
        return Text("Smoke stage: disabled (smoke.enabled = false)", style="dim")
    m, tr, hw, lay = smoke.spec.model, smoke.spec.train, smoke.spec.hardware, smoke.layout
    heads = f"{m.num_attention_heads} heads" + (f"/{m.num_query_groups} groups" if m.num_query_groups else "")
    experts = f", {m.num_experts} experts" if m.num_experts else ""
    devices = f"CPU processes ({tr.precision})" if hw.gpu == "cpu" else "GPUs"  # smoke.gpu = "cpu": the CPU backend
    text = Text("Smoke stage: ", style="bold")
    text.append(f"{m.num_layers} layers, hidden {m.hidden_size}, {heads}, ffn {m.ffn_hidden_size}{experts}, "
                f"seq {m.seq_length}, batch {tr.global_batch_size}, {tr.train_iters} steps at lr {tr.lr:g} "
                f"on {hw.nodes}x{hw.gpus_per_node} {devices}: TP {lay.tp} PP {lay.pp} CP {lay.cp} "
                f"EP {lay.ep} DP {lay.dp}")
    limit = smoke.time
    if limit is not None:
        where = "its sbatch --time" if smoke.spec.launch.kind == "slurm" else "a Slurm job's --time; not enforced here"
        text.append(f"\n  time limit {limit.slurm} ({where}): {limit.detail}")
    return text


def _data_table(rows: tuple[DataRow, ...]) -> Table:
    t = _table("Training data: the mixture as the run reads it", "component", "tokens (train part)", "share",
               "tokens read", "epochs", right=(1, 2, 3, 4))
    for r in rows:
        epochs = "—" if r.epochs is None else f"{r.epochs:.2f}"
        t.add_row(r.name, _count(r.tokens), f"{r.share:.1%}", _count(r.tokens_read), epochs)
    return t


def render_plan(shown: ShownPlan, run_id: str | None) -> RenderableType:
    """The whole plan: layout, parameters, memory with its verdict, compute/time/cost, smoke, notes."""
    p = shown.plan
    title = Text.assemble(("Plan ", "bold"), (p.spec.name, "bold cyan"))
    if run_id:
        title.append(f"   run {run_id}", style="bold")
    parts: list[RenderableType] = [title, _layout_table(p), _model_table(p), _memory_table(p), Text(""),
                                   _compute_table(p), _step_table(p), _smoke_line(p.smoke)]
    if shown.data:  # a mixture's components (D60)
        parts[-1:-1] = [Text(""), _data_table(shown.data)]
    for heading, items, mark, style in (("Warnings", shown.warnings, "!", "yellow"),
                                        ("Recommendations", p.recommendations, "->", "")):
        if items:
            notes = Table.grid(padding=(0, 1))
            notes.add_column(justify="right", style=style or None)
            notes.add_column(style=style or None)
            for item in items:
                notes.add_row(mark, item)
            parts += [Text(""), Text(heading, style=f"bold {style}".strip()), notes]
    return Group(*parts)
