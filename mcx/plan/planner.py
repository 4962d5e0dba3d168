"""One plan from one spec: layout, parameters, memory, FLOPs, time, cost and each stage (a StagePlan).

Pure: no files, no devices, no torch. ``te_available`` (whether Transformer Engine is importable
where the worker runs; None when that cannot be known here), the device a job started here gets and
a measured MFU come from the caller, which probes them.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from mcx.errors import SpecError
from mcx.plan.cost import CostEstimate, estimate_cost
from mcx.plan.flops import flops_per_iteration, flops_per_token
from mcx.plan.gpus import GiB, gpu_info
from mcx.plan.hostfloor import HostFloor
from mcx.plan.layout import Device
from mcx.plan.layout_rules import Layout, cuda_graph_problems, resolve_layout, transformer_impl
from mcx.plan.memory import (ALLOCATOR_HINT, ALLOCATOR_SETTING, FRAGMENTATION_FRACTION, MemoryEstimate,
                             estimate_memory, fits_fraction, verdict)
from mcx.plan.params import ParamCounts, count_params, require_vocab_size, stage_params
from mcx.plan.smoketime import SmokeTime, smoke_time_limit
from mcx.plan.stages import Stage, smoke_spec
from mcx.plan.steptime import StepTime, predict_worker, step_seconds
from mcx.spec.schema import ExperimentSpec

_STAND_IN_VOCAB = 32000  # only to find the other problems of a spec whose vocabulary is unknown
HOST_ADVICE_SHARE = 0.25  # the host's wait above this share of the predicted step: say what removes it

@frozen(kw_only=True)
class StagePlan:
    """One stage as it trains (its job's spec, layout and device), planned once by make_plan: nothing else
    derives a stage's spec, layout or device.

    Two facts depend on the machine the stage runs on; both are planned here, from what the caller probed:

    * ``device``: "cpu" where the stage's ``hardware.gpu`` is "cpu"; "cuda" for a Slurm job (its nodes are
      not this machine, and the spec names their GPUs); for a local or torchrun launch, the job starts here,
      so the device this machine offers (``local_device``: the hardware fingerprint's probe, a GPU visible
      or not). The worker builds on exactly this device.
    * Transformer Engine: the layer implementation is planned from ``te_available`` as the caller found it
      (mcx.ops.plan.te_for_plan); where it is None (a Slurm job, a spec planned away from its GPUs) it is
      assumed present, and the launch checks it (mcx.launch.preflight here; on Slurm the worker's first seconds).
    """

    stage: Stage
    spec: ExperimentSpec  # the spec the stage trains: the spec as written (full), or its shrunk copy (smoke)
    layout: Layout
    device: Device
    memory: MemoryEstimate  # the planner's estimate (the smoke stage's is checked against its measured peak)
    time: SmokeTime | None = None  # the smoke stage's time limit (its launch.slurm.time) and where it came from


@frozen(kw_only=True)
class Plan:
    spec: ExperimentSpec
    layout: Layout
    transformer_impl: str  # "transformer_engine" | "local"
    transformer_impl_known: bool  # False: assumed (Transformer Engine could not be probed)
    vocab_size: int
    params: ParamCounts  # padded vocabulary at the layout's TP
    params_per_gpu: int  # the most loaded GPU
    memory: MemoryEstimate
    flops_per_step: int
    flops_per_token: float
    tokens_per_step: int
    num_microbatches: int
    cost: CostEstimate
    warnings: tuple[str, ...]
    recommendations: tuple[str, ...]
    full: StagePlan
    smoke: StagePlan | None  # None: smoke.enabled = false
    host_floor: HostFloor | None = None  # the host's time a layer, learned from this project's runs (None: calibrated)

    def stage(self, name: str) -> StagePlan:
        """The planned stage ``name``; a smoke stage is planned whenever smoke.enabled."""
        if name not in ("full", "smoke"):
            raise ValueError(f"unknown stage {name!r}")
        planned = self.full if name == "full" else self.smoke
        if planned is None:
            raise ValueError(f"no {name} stage is planned (smoke.enabled = false)")
        return planned


def _device(spec: ExperimentSpec, local_device: Device | None) -> Device:
    """The device a stage of ``spec`` trains on (StagePlan.device says why)."""
    if spec.hardware.gpu == "cpu":
        return "cpu"
    if spec.launch.kind == "slurm" or local_device is None:
        return "cuda"
    return local_device


def make_plan(spec: ExperimentSpec, *, te_available: bool | None = None, vocab_size: int | None = None,
              mfu: float | None = None, local_device: Device | None = None,
              host_floor: HostFloor | None = None) -> Plan:
    """Plan ``spec``; raise SpecError listing every layout problem.

    ``vocab_size``: the tokenizer's size when the spec leaves model.vocab_size unset and the
    tokenizer is a file; ``mfu``: a measured MFU for the time and cost lines; ``local_device``: the
    device a job started on this machine gets (None: not probed, the spec's GPUs are assumed);
    ``host_floor``: the host's time a layer as this project's runs measured it (mcx.plan.hostfloor).
    """
    try:
        vocab = require_vocab_size(spec, vocab_size)
    except SpecError as exc:  # report it with every layout problem, found with a stand-in vocabulary
        try:
            resolve_layout(spec, te_available=te_available, vocab_size=_STAND_IN_VOCAB)
        except SpecError as more:
            raise SpecError([*exc.problems, *more.problems]) from None
        raise
    layout, warnings, recommendations = resolve_layout(spec, te_available=te_available, vocab_size=vocab)
    impl, impl_known = transformer_impl(spec, te_available)
    m, t = spec.model, spec.train
    counts = count_params(m, vocab, layout.tp)
    per_gpu = max(stage_params(counts, m, tp=layout.tp, pp=layout.pp, ep=layout.ep, first=first, last=last).total
                  for first, last in ([(True, True)] if layout.pp == 1 else [(True, False), (False, True)]))
    memory = estimate_memory(spec, layout, vocab_size=vocab, transformer_impl=impl)
    flops = flops_per_iteration(m, padded_vocab=counts.padded_vocab, global_batch_size=t.global_batch_size)
    step = predict_worker(spec, layout, padded_vocab=counts.padded_vocab, impl=impl,
                          host_layer_s=None if host_floor is None else host_floor.host_layer_s)
    cost = estimate_cost(spec, flops_per_step=flops, world_size=layout.world_size, mfu=mfu, predicted=step)
    warnings = [*warnings, *_memory_warnings(spec, memory), *_cost_warnings(spec, cost)]
    micro = t.global_batch_size // (t.micro_batch_size * layout.dp)  # micro-batches a step, per DP rank
    recommendations = [*recommendations, *_host_advice(spec, layout, step, micro, impl)]
    full = StagePlan(stage="full", spec=spec, layout=layout, device=_device(spec, local_device), memory=memory)
    # "any" trains on what this machine has; a named GPU may be planned away from it (its worker refuses CPU)
    if t.cuda_graphs and spec.hardware.gpu == "any" and full.device == "cpu":
        raise SpecError([("train.cuda_graphs", "true needs a GPU (CUDA graphs), and this machine has none visible, so "
                          "the run would train on CPU; set it to false here, or run where a GPU is")])
    smoke = None
    if spec.smoke.enabled:
        sspec, slayout = smoke_spec(spec, layout, te_available=te_available, vocab_size=vocab)
        smoke_impl = transformer_impl(sspec, te_available)[0]
        smoke = StagePlan(stage="smoke", spec=sspec, layout=slayout, device=_device(sspec, local_device),
                          memory=estimate_memory(sspec, slayout, vocab_size=vocab, transformer_impl=smoke_impl,
                                                 suggest_fixes=False),
                          time=smoke_time_limit(spec, sspec, slayout, vocab, impl=smoke_impl))
    return Plan(spec=spec, layout=layout, transformer_impl=impl, transformer_impl_known=impl_known, vocab_size=vocab,
                params=counts, params_per_gpu=per_gpu, memory=memory, flops_per_step=flops,
                flops_per_token=flops_per_token(m, padded_vocab=counts.padded_vocab),
                tokens_per_step=t.global_batch_size * m.seq_length,
                num_microbatches=micro,
                cost=cost, warnings=tuple(warnings), recommendations=tuple(recommendations), full=full, smoke=smoke,
                host_floor=host_floor)


def _memory_warnings(spec: ExperimentSpec, mem: MemoryEstimate) -> list[str]:
    if mem.capacity is None or mem.total <= FRAGMENTATION_FRACTION * mem.capacity:
        return []
    expandable = spec.train.expandable_segments
    fix = f"try {mem.fixes[0]}" if mem.fixes else ""
    head = f"memory: {mem.total / GiB:.1f} GiB per GPU"
    gpus = f"the {mem.capacity / GiB:.1f} GiB of each {spec.hardware.gpu}"
    if mem.verdict == "does not fit":
        return [f"{head} does not fit in {gpus}" + (f"; {fix}" if fix else "")]
    if mem.verdict == "fits":  # expandable segments on, between 85% and 90%
        return [f"{head} fits, but is over {FRAGMENTATION_FRACTION:.0%} of {gpus}"]
    limit = fits_fraction(expandable)
    if verdict(mem.total, mem.capacity, expandable=True) == "fits":  # the allocator's fragments decide
        return [f"{head} is tight in (over {limit:.0%} of) {gpus}: without {ALLOCATOR_SETTING} the allocator's "
                "fragments can run it out of memory; set it" + (f", or {fix}" if fix else "")]
    return [f"{head} is tight in (over {limit:.0%} of) {gpus}" + (f"; {fix}" if fix else "")
            + ("" if expandable else f"; {ALLOCATOR_HINT}")]


def _host_advice(spec: ExperimentSpec, layout: Layout, step: StepTime | None, micro: int, impl: str) -> list[str]:
    """Where the host, not the GPU, sets the predicted step (docs/steptime.md, "Small models"): what removes it."""
    if step is None or step.host_wait_s <= HOST_ADVICE_SHARE * step.step_s:
        return []
    t, m = spec.train, spec.model
    why = (f"the host sets this step ({step_seconds(step.step_s)} predicted for {step_seconds(step.step_s - step.host_wait_s)} "
           "of GPU work: Megatron-Core's Python and kernel launches, per layer and micro-batch"
           + (", and each MoE layer's wait on its token counts)" if m.num_experts else ")"))
    if not t.cuda_graphs and layout.world_size == 1 and not cuda_graph_problems(spec):
        return [f"train.cuda_graphs = true: {why}; one CUDA graph a step replays them without the host "
                "(3.3-4.7x at an 8-layer, 1024-wide model on two H100 hosts, D75, D77)"]
    out = []
    if m.num_experts and not m.moe_grouped_gemm and impl == "transformer_engine":
        out.append(f"model.moe_grouped_gemm = true: {why}; the local experts as one grouped GEMM cost the host less "
                   "a layer than one GEMM pair each (1.27-1.45x a step at 8 experts on one H100, D81)")
    if micro > 1:
        out.append(f"a larger train.micro_batch_size, if memory allows: {why}, and the host's part grows with the "
                   f"{micro} micro-batches a step")
    return out


def _cost_warnings(spec: ExperimentSpec, cost: CostEstimate) -> list[str]:
    if cost.peak_flops_per_gpu is None and spec.hardware.gpu not in ("cpu",):
        extra = " and budget.max_gpu_hours cannot be checked" if spec.budget.max_gpu_hours is not None else ""
        return [f"hardware.gpu = \"{spec.hardware.gpu}\" has no known peak: step time, GPU-hours and MFU are "
                f"unknown{extra}; name the GPU model"]
    return []


def _smoke_shapes(s: ExperimentSpec) -> dict[str, Any]:
    m, t = s.model, s.train
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
            "num_query_groups": m.num_query_groups, "ffn_hidden_size": m.ffn_hidden_size, "seq_length": m.seq_length,
            "num_experts": m.num_experts, "micro_batch_size": t.micro_batch_size,
            "global_batch_size": t.global_batch_size, "train_iters": t.train_iters, "lr": t.lr,
            "lr_warmup_iters": t.lr_warmup_iters, "precision": t.precision, "nodes": s.hardware.nodes,
            "gpus_per_node": s.hardware.gpus_per_node, "gpu": s.hardware.gpu}


def _smoke_dict(smoke: StagePlan) -> dict[str, Any]:
    hw, limit = smoke.spec.hardware, smoke.time
    assert limit is not None, "the smoke stage is planned with its time limit"
    return {"layout": smoke.layout.to_dict(), "shapes": _smoke_shapes(smoke.spec),
            "memory_per_gpu_bytes": smoke.memory.total, "nodes": hw.nodes, "gpus": hw.nodes * hw.gpus_per_node,
            "launcher": smoke.spec.launch.kind,
            "time_limit": {"slurm": limit.slurm, "seconds": limit.seconds, "source": limit.source,
                           "detail": limit.detail}}


def _predicted_dict(st: StepTime) -> dict[str, Any]:
    return {"step_time_s": st.step_s, "tokens_per_s_per_gpu": st.tokens_per_s_per_gpu,
            "tflops_per_gpu": st.tflops_per_gpu, "mfu": st.mfu, "breakdown_s": st.breakdown()}


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (``plan.json``, ``mcx plan --json``); the caller adds run_id."""
    spec, layout, mem, cost, p = plan.spec, plan.layout, plan.memory, plan.cost, plan.params
    info = gpu_info(spec.hardware.gpu)
    return {
        "name": spec.name,
        "layout": layout.to_dict(),
        "transformer_impl": plan.transformer_impl,
        "transformer_impl_assumed": not plan.transformer_impl_known,
        "gpu": {"model": spec.hardware.gpu, "known": info is not None,
                "memory_bytes": info.memory_bytes if info else None,
                "peak_bf16_flops": info.bf16_tflops * 1e12 if info else None},
        "params": {"total": p.total, "active": p.active, "per_gpu": plan.params_per_gpu,
                   "embedding": p.embedding, "output_layer": p.output_layer,
                   "vocab_size": plan.vocab_size, "padded_vocab_size": p.padded_vocab},
        "memory_per_gpu_bytes": mem.total,
        "memory": {"breakdown": mem.breakdown(), "stage": mem.stage, "capacity_bytes": mem.capacity,
                   "verdict": mem.verdict, "fixes": list(mem.fixes),
                   "in_flight_microbatches": mem.in_flight_microbatches},
        "flops_per_step": plan.flops_per_step,
        "flops_per_token": plan.flops_per_token,
        "tokens_per_step": plan.tokens_per_step,
        "num_microbatches": plan.num_microbatches,
        "train_iters": spec.train.train_iters,
        "total_tokens": plan.tokens_per_step * spec.train.train_iters,
        "mfu": cost.mfu,
        "mfu_source": cost.mfu_source,
        "step_time_s": cost.step_time_s,
        "predicted": None if cost.predicted is None else _predicted_dict(cost.predicted),
        "host_floor": None if plan.host_floor is None else plan.host_floor.to_dict(),
        "wall_time_h": cost.wall_time_h,
        "gpu_hours": cost.gpu_hours,
        "cost": cost.cost,
        "budget": {"max_gpu_hours": cost.max_gpu_hours, "over_budget": cost.over_budget,
                   "gpu_hour_price": spec.budget.gpu_hour_price},
        "warnings": list(plan.warnings),
        "recommendations": list(plan.recommendations),
        "smoke": None if plan.smoke is None else _smoke_dict(plan.smoke),
    }
