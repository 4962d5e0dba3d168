"""The parallel layout: degrees, Megatron-Core's rules for them, and recommendations.

The rules are Megatron-Core 0.19's (``parallel_state.initialize_model_parallel``,
``TransformerConfig.__post_init__``, the MoE layer and the interleaved schedule) and Megatron-LM's
argument checks, each reported with its TOML key and the fix, all at once:

* TP x PP x CP divides the world size (nodes x GPUs per node); DP = world / (TP x PP x CP).
* Expert parallel lives on its own grid of expert-TP (= TP) x EP x expert-DP x PP over the same
  ranks, so TP x EP x PP must divide the world too, i.e. EP divides DP x CP.
* TP divides the attention heads and the query groups; PP (x VPP) divides the layers; EP divides
  the experts; the global batch is a multiple of micro batch x DP.
* The interleaved schedule needs PP > 2 (Megatron-LM, with P2P overlap off as mcx runs it;
  parallel_state itself needs PP > 1) and a number of micro-batches that is a multiple of PP.
* Context parallel needs the sequence to split into 2 x CP chunks (load-balanced causal CP).
* Sequence parallel needs TP > 1; MoE with TP > 1 needs sequence parallel (MCore's MoE layer
  refuses to train without it).
* Context parallel, FP8 and sequence parallel need Transformer Engine (the local spec's torch norms
  and SDPA attention implement none of them); FP8 needs Ada, Hopper or newer.

Degrees left unset in ``[parallel]`` are chosen here: the valid layout with the most data
parallelism (smallest TP x PP x CP) whose memory per GPU fits, preferring TP (within a node) over
PP over CP; pipeline parallel from the start above 70B parameters and context parallel above 8K
tokens (rules of thumb from Megatron's scaling recipes), expert parallel as wide as a node allows.
"""

from __future__ import annotations

import itertools
import math

from attrs import evolve

from mcx.spec.rules import divisors
from mcx.errors import SpecError
from mcx.plan.layout import Layout as Layout  # re-exported: the planner and the stages take it from here
from mcx.plan.gpus import GiB, gpu_info, supports_fp8
from mcx.plan.memory import TIGHT_FRACTION, estimate_memory
from mcx.plan.params import count_params, require_vocab_size
from mcx.spec.schema import ExperimentSpec

Problems = list[tuple[str, str]]

PP_FROM_PARAMS = 70e9  # recommend pipeline parallel above this many parameters
CP_FROM_SEQ = 8192  # recommend context parallel above this sequence length
REFERENCE_MEMORY = 80 * GiB  # sizing recommendations when hardware.gpu = "any"


def _listing(values: list[int]) -> str:
    values = sorted(set(values))
    if len(values) == 1:
        return str(values[0])
    return ", ".join(map(str, values[:-1])) + f" or {values[-1]}"


def transformer_impl(spec: ExperimentSpec, te_available: bool | None) -> tuple[str, bool]:
    """The layer implementation the worker will build and whether that is known for sure.

    ``auto`` is Transformer Engine where it is importable on a GPU, else the local spec (as the
    worker decides). Not knowing (planning for a cluster from a login node) assumes Transformer
    Engine, as production GPU images carry it.
    """
    impl = spec.model.transformer_impl
    if impl != "auto":
        return impl, True
    if spec.hardware.gpu == "cpu" or te_available is False:
        return "local", True
    return "transformer_engine", te_available is True


def _static_rules(spec: ExperimentSpec, te_available: bool | None) -> tuple[Problems, list[str]]:
    """Rules that do not depend on the parallel degrees."""
    problems: Problems = []
    warnings: list[str] = []
    t, m, par, gpu = spec.train, spec.model, spec.parallel, spec.hardware.gpu
    te_here = False if gpu == "cpu" else te_available
    if m.transformer_impl == "transformer_engine" and te_here is False:
        where = "on CPU" if gpu == "cpu" else "where this runs (transformer_engine is not importable)"
        problems.append(("model.transformer_impl", f"\"transformer_engine\" cannot run {where}; set it to \"auto\" "
                         "or \"local\", or install Transformer Engine"))
    if t.precision.startswith("fp8"):
        fp8 = supports_fp8(gpu)
        if fp8 is False:
            info = gpu_info(gpu)
            what = "a CPU" if gpu == "cpu" else f"{gpu} ({info.architecture if info else 'no FP8'})"
            problems.append(("train.precision", f"\"{t.precision}\" needs FP8 Tensor Cores (Ada L40S, Hopper H100/H200, "
                             f"Blackwell B200); hardware.gpu = \"{gpu}\" is {what}; use \"bf16\""))
        elif fp8 is None:
            warnings.append(f"train.precision = \"{t.precision}\" needs an Ada, Hopper or newer GPU; hardware.gpu = "
                            f"\"{gpu}\" does not say which; name the GPU to have this checked")
    if t.cuda_graphs:
        problems += cuda_graph_problems(spec)
    if par.overlap_param_gather and not par.distributed_optimizer:
        problems.append(("parallel.overlap_param_gather", "true needs parallel.distributed_optimizer = true (only the "
                         "distributed optimizer gathers parameters); set overlap_param_gather = false"))
    if par.overlap_param_gather and not par.overlap_grad_reduce:
        problems.append(("parallel.overlap_param_gather", "true needs parallel.overlap_grad_reduce = true, as in "
                         "Megatron-LM; enable overlap_grad_reduce or set overlap_param_gather = false"))
    return problems, warnings


def cuda_graph_problems(spec: ExperimentSpec) -> Problems:
    """What a step captured as one CUDA graph cannot hold (train.cuda_graphs, D75)."""
    t, m = spec.train, spec.model
    out: Problems = []
    if spec.hardware.gpu == "cpu":
        out.append(("train.cuda_graphs", "true needs a GPU (CUDA graphs); hardware.gpu = \"cpu\"; set it to false"))
    if t.precision == "fp16":
        out.append(("train.cuda_graphs", "true cannot run with train.precision = \"fp16\": dynamic loss scaling "
                    "replaces its scale tensor between steps, which a captured graph would not see; use \"bf16\""))
    if m.num_experts is not None:
        out.append(("train.cuda_graphs", "true cannot capture a mixture-of-experts layer: Megatron-Core sizes its "
                    "token buffers from counts it reads back to the host every step; set it to false"))
    return out


def te_features(spec: ExperimentSpec, *, cp: int, sequence_parallel: bool) -> list[tuple[str, str, str]]:
    """(key, feature, alternative) for each feature of the job that only Transformer Engine implements."""
    needs: list[tuple[str, str, str]] = []
    if cp > 1:
        needs.append(("parallel.context", f"context parallel (parallel.context = {cp})", "use parallel.context = 1"))
    if spec.train.precision.startswith("fp8"):
        needs.append(("train.precision", f"FP8 (train.precision = \"{spec.train.precision}\")", "use \"bf16\""))
    if sequence_parallel:
        needs.append(("parallel.sequence_parallel", f"sequence parallel with {spec.model.normalization}",
                      "set parallel.sequence_parallel = false"))
    if spec.train.te_op_fuser:
        needs.append(("train.te_op_fuser", "the fused MLP (train.te_op_fuser = true)", "set train.te_op_fuser = false"))
    return needs


def needs_transformer_engine(spec: ExperimentSpec) -> bool:
    """Whether the spec as written asks for Transformer Engine (by name or by a feature only it has)."""
    if spec.model.transformer_impl == "transformer_engine":
        return True
    return bool(te_features(spec, cp=spec.parallel.context or 1, sequence_parallel=spec.parallel.sequence_parallel))


def _te_rules(spec: ExperimentSpec, layout: Layout, te_available: bool | None) -> tuple[Problems, list[str]]:
    """Features only Transformer Engine implements, against the implementation that will run."""
    problems: Problems = []
    warnings: list[str] = []
    needs = te_features(spec, cp=layout.cp, sequence_parallel=layout.sequence_parallel)
    impl = spec.model.transformer_impl
    te_here = False if spec.hardware.gpu == "cpu" else te_available
    unknown: list[str] = []  # features whose need cannot be checked from here: said in one warning
    for path, what, alternative in needs:
        if impl == "local":
            problems.append((path, f"{what} needs Transformer Engine, but model.transformer_impl = \"local\"; set it "
                             f"to \"auto\" or \"transformer_engine\", or {alternative}"))
        elif te_here is False:
            where = "on CPU" if spec.hardware.gpu == "cpu" else "where this runs (transformer_engine is not importable)"
            problems.append((path, f"{what} needs Transformer Engine, which is not available {where}; install it "
                             f"on the GPU machines, or {alternative}"))
        elif te_here is None and impl == "auto":
            unknown.append(what)
    if unknown:
        named = unknown[0] if len(unknown) == 1 else ", ".join(unknown[:-1]) + " and " + unknown[-1]
        warnings.append(f"{named} need{'s' * (len(unknown) == 1)} Transformer Engine; whether the training environment "
                        "has it cannot be checked from here; make sure it does, or set model.transformer_impl = "
                        "\"transformer_engine\" to fail early")
    return problems, warnings


def layout_problems(spec: ExperimentSpec, layout: Layout, te_available: bool | None = None) -> Problems:
    """Every rule that involves the parallel degrees, with its key and the fix."""
    m, t, hw = spec.model, spec.train, spec.hardware
    tp, pp, cp, ep, vpp, world = layout.tp, layout.pp, layout.cp, layout.ep, layout.vpp, layout.world_size
    groups = m.num_query_groups or m.num_attention_heads
    out: Problems = []
    heads_ok = [d for d in divisors(math.gcd(m.num_attention_heads, groups)) if d <= hw.gpus_per_node or d == 1]
    if m.num_attention_heads % tp:
        out.append(("parallel.tensor", f"{tp} does not divide model.num_attention_heads = {m.num_attention_heads}; "
                    f"use {_listing(heads_ok)}"))
    elif groups % tp:
        out.append(("parallel.tensor", f"{tp} does not divide model.num_query_groups = {groups} (each rank needs whole "
                    f"key/value groups); use {_listing(heads_ok)}"))
    model_parallel = tp * pp * cp
    dp: int | None = world // model_parallel if world % model_parallel == 0 else None
    if dp is None:
        out.append(("parallel", f"tensor x pipeline x context = {tp} x {pp} x {cp} = {model_parallel} does not divide "
                    f"the world size {world} (hardware.nodes = {hw.nodes} x hardware.gpus_per_node = "
                    f"{hw.gpus_per_node}); lower the degrees or change the GPU count"))
    if m.num_layers % pp:
        out.append(("parallel.pipeline", f"{pp} does not divide model.num_layers = {m.num_layers}; use "
                    f"{_listing([d for d in divisors(m.num_layers) if d <= world])}"))
    if vpp is not None and vpp > 1:
        if pp < 2:
            # mcx runs the interleaved schedule with overlapped P2P (Megatron-LM's default), for
            # which Megatron-LM asks only for pipelining (> 2 stages is its rule without overlap).
            out.append(("parallel.virtual_pipeline", f"{vpp} needs parallel.pipeline >= 2 (interleaving splits each "
                        f"pipeline stage); got pipeline = {pp}; remove virtual_pipeline or raise pipeline"))
        elif m.num_layers % (pp * vpp):
            out.append(("parallel.virtual_pipeline", f"pipeline x virtual_pipeline = {pp} x {vpp} does not divide "
                        f"model.num_layers = {m.num_layers}; use a virtual_pipeline that divides "
                        f"{m.num_layers // pp if m.num_layers % pp == 0 else 'the layers per stage'}"))
        if dp is not None and t.global_batch_size % (t.micro_batch_size * dp) == 0:
            microbatches = t.global_batch_size // (t.micro_batch_size * dp)
            if microbatches % pp:
                out.append(("train.global_batch_size", f"{t.global_batch_size} gives {microbatches} micro-batches per "
                            f"step; the interleaved schedule needs a multiple of parallel.pipeline = {pp}; use a "
                            f"multiple of {t.micro_batch_size * dp * pp}"))
    if cp > 1 and m.seq_length % (2 * cp):
        out.append(("model.seq_length", f"{m.seq_length} must be a multiple of 2 x parallel.context = {2 * cp} "
                    "(load-balanced causal context parallel); change one of them"))
    if m.num_experts is not None:
        if m.num_experts % ep:
            fitting = [d for d in divisors(m.num_experts) if dp is None or (dp * cp) % d == 0]
            out.append(("parallel.expert", f"{ep} does not divide model.num_experts = {m.num_experts}; use "
                        f"{_listing(fitting)}"))
        elif dp is not None and (dp * cp) % ep:
            out.append(("parallel.expert", f"{ep} must divide data parallel x context parallel = {dp} x {cp} = "
                        f"{dp * cp} (Megatron-Core folds expert parallel into those ranks: TP x EP x PP must divide "
                        f"the world size); use {_listing([d for d in divisors(dp * cp) if m.num_experts % d == 0])}"))
        if tp > 1 and not layout.sequence_parallel:
            out.append(("parallel.sequence_parallel", f"a mixture-of-experts model with parallel.tensor = {tp} needs "
                        "sequence parallel (Megatron-Core's MoE layer refuses to train without it); set it to true"))
    if t.cuda_graphs and world > 1:
        out.append(("train.cuda_graphs", f"true runs one GPU a run in this version, and this layout has {world}: a graph "
                    "that holds the collectives of several GPUs is not validated yet (D75); train on one GPU "
                    "(hardware.nodes = 1, hardware.gpus_per_node = 1) or set cuda_graphs = false"))
    if layout.sequence_parallel and tp == 1:
        out.append(("parallel.sequence_parallel", "true needs parallel.tensor > 1 (it splits the sequence over the "
                    "tensor-parallel ranks; Megatron turns it off at TP = 1); set it to false or raise tensor"))
    if dp is not None and t.global_batch_size % (t.micro_batch_size * dp):
        unit = t.micro_batch_size * dp
        lower = max(unit, t.global_batch_size // unit * unit)
        out.append(("train.global_batch_size", f"{t.global_batch_size} is not a multiple of train.micro_batch_size x "
                    f"data parallel = {t.micro_batch_size} x {dp} = {unit}; use e.g. {lower} or {lower + unit}"))
    if t.recompute_granularity == "full" and m.num_layers % pp == 0 and t.recompute_num_layers > m.num_layers // pp:
        out.append(("train.recompute_num_layers", f"{t.recompute_num_layers} exceeds the {m.num_layers // pp} layers "
                    f"of a pipeline stage; use 1 to {m.num_layers // pp}"))
    return out + _te_rules(spec, layout, te_available)[0]


def _make(spec: ExperimentSpec, tp: int, pp: int, cp: int, ep: int) -> Layout:
    hw, par = spec.hardware, spec.parallel
    world = hw.nodes * hw.gpus_per_node
    mp = tp * pp * cp
    return Layout(tp=tp, pp=pp, vpp=par.virtual_pipeline if par.virtual_pipeline != 1 else None, cp=cp, ep=ep,
                  dp=world // mp if world % mp == 0 else 0, world_size=world, gpus_per_node=hw.gpus_per_node,
                  nodes=hw.nodes, sequence_parallel=par.sequence_parallel,
                  distributed_optimizer=par.distributed_optimizer)


def _candidates(spec: ExperimentSpec) -> dict[str, list[int]]:
    m, par, hw = spec.model, spec.parallel, spec.hardware
    world = hw.nodes * hw.gpus_per_node
    groups = m.num_query_groups or m.num_attention_heads
    pow2 = [2 ** i for i in range(world.bit_length()) if 2 ** i <= world]
    cands = {
        "tensor": [d for d in divisors(math.gcd(m.num_attention_heads, groups)) if d <= min(world, hw.gpus_per_node)],
        "pipeline": [d for d in divisors(m.num_layers) if d <= world],
        "context": [c for c in pow2 if m.seq_length % (2 * c) == 0 or c == 1],
        "expert": [d for d in divisors(m.num_experts) if d <= world] if m.num_experts else [1],
    }
    for key in cands:
        fixed = getattr(par, key)
        if fixed is not None:
            cands[key] = [fixed]
    return cands


def _search(spec: ExperimentSpec, te_available: bool | None, vocab: int, impl: str) -> tuple[Layout | None, bool]:
    """The preferred valid layout for the unset degrees, and whether it fits in memory."""
    m, par = spec.model, spec.parallel
    cands = _candidates(spec)
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    info = gpu_info(spec.hardware.gpu)
    capacity = info.memory_bytes if info else (None if spec.hardware.gpu == "cpu" else REFERENCE_MEMORY)
    params = count_params(m, vocab).total
    min_pp = 2 if par.pipeline is None and params > PP_FROM_PARAMS else 1
    min_cp = 1
    if par.context is None and m.seq_length > CP_FROM_SEQ:
        min_cp = 2 ** math.ceil(math.log2(m.seq_length / CP_FROM_SEQ))
    valid = []
    for tp, pp, cp, ep in itertools.product(cands["tensor"], cands["pipeline"], cands["context"], cands["expert"]):
        if world % (tp * pp * cp):
            continue
        layout = _make(spec, tp, pp, cp, ep)
        if layout_problems(spec, layout, te_available):
            continue
        if capacity is None:
            total, fits = 0, True
        else:
            total = estimate_memory(spec, layout, vocab_size=vocab, transformer_impl=impl, suggest_fixes=False).total
            fits = total <= TIGHT_FRACTION * capacity
        thumb = pp >= min(min_pp, max(cands["pipeline"])) and cp >= min(min_cp, max(cands["context"]))
        wide_ep = -ep if ep * tp <= spec.hardware.gpus_per_node else ep
        valid.append(((not fits, not thumb, tp * pp * cp, pp, cp, wide_ep, tp), total, layout, fits))
    if not valid:
        return None, False
    if not any(v[3] for v in valid):  # nothing fits: the smallest footprint, the plan says it does not fit
        best = min(valid, key=lambda v: (v[1], v[0]))
    else:
        best = min(valid, key=lambda v: v[0])
    return best[2], best[3]


def resolve_layout(spec: ExperimentSpec, *, te_available: bool | None,
                   vocab_size: int | None = None) -> tuple[Layout, list[str], list[str]]:
    """The layout for ``spec`` (unset degrees chosen), its warnings and recommendations.

    Raises SpecError with every problem at once. ``te_available``: whether Transformer Engine is
    importable where the worker runs; None = cannot be known here (warnings instead of errors).
    """
    par, m = spec.parallel, spec.model
    problems, warnings = _static_rules(spec, te_available)
    recommendations: list[str] = []
    vocab = require_vocab_size(spec, vocab_size)
    impl, _ = transformer_impl(spec, te_available)
    unset = [k for k in ("tensor", "pipeline", "context", "expert")
             if getattr(par, k) is None and not (k == "expert" and m.num_experts is None)]
    fixed = _make(spec, par.tensor or 1, par.pipeline or 1, par.context or 1, par.expert or 1)
    layout: Layout | None = fixed
    if unset:
        layout, fits = _search(spec, te_available, vocab, impl)
        if layout is None:
            problems += layout_problems(spec, fixed, te_available)
            problems.append(("parallel", f"no value of the unset {', '.join('parallel.' + k for k in unset)} satisfies "
                             "the rules above; set the degrees explicitly"))
        else:
            recommendations += _explain_choice(spec, layout, unset, fits)
    else:
        problems += layout_problems(spec, fixed, te_available)
    if problems:
        raise SpecError(_dedupe(problems))
    assert layout is not None
    warnings += _te_rules(spec, layout, te_available)[1]
    warnings += _layout_warnings(spec, layout)
    recommendations += _advice(spec, layout)
    return layout, warnings, recommendations


def _dedupe(problems: Problems) -> Problems:
    return list(dict.fromkeys(problems))  # the first of each, in order


def _explain_choice(spec: ExperimentSpec, layout: Layout, unset: list[str], fits: bool) -> list[str]:
    if layout.world_size == 1:
        return []  # one GPU: nothing to choose
    gpu = spec.hardware.gpu
    memory = {"cpu": "", "any": " (GPU unnamed: sized for 80 GiB)"}.get(gpu, f" on {gpu}")
    why = (f"the most data parallelism whose memory fits{memory}" if fits
           else f"the smallest memory footprint of the valid layouts{memory}, which still does not fit")
    values = {"tensor": layout.tp, "pipeline": layout.pp, "context": layout.cp, "expert": layout.ep}
    chosen = ", ".join(f"parallel.{k} = {values[k]}" for k in unset)
    return [f"{chosen}: chosen ({why}); set them in [parallel] to pin the layout"]


def _layout_warnings(spec: ExperimentSpec, layout: Layout) -> list[str]:
    t = spec.train
    out = []
    if layout.tp > layout.gpus_per_node:
        out.append(f"parallel.tensor = {layout.tp} spans nodes (hardware.gpus_per_node = {layout.gpus_per_node}); "
                   "tensor-parallel traffic over the network is slow; keep TP within a node")
    microbatches = t.global_batch_size // (t.micro_batch_size * layout.dp)
    if layout.pp > 1 and microbatches < layout.pp:
        out.append(f"{microbatches} micro-batches per step with parallel.pipeline = {layout.pp}: the pipeline never "
                   f"fills (bubble {(layout.pp - 1) / (microbatches + layout.pp - 1):.0%}); raise train.global_batch_size")
    info = gpu_info(spec.hardware.gpu)
    if info is not None and not info.nvlink and layout.tp > 1:
        out.append(f"parallel.tensor = {layout.tp} on {info.model} (no NVLink): tensor parallel runs over PCIe")
    return out


def _advice(spec: ExperimentSpec, layout: Layout) -> list[str]:
    out = []
    if layout.tp > 1 and not layout.sequence_parallel and spec.model.num_experts is None:
        out.append(f"parallel.sequence_parallel = true: with tensor = {layout.tp} every rank keeps whole-sequence norm "
                   "and GEMM inputs; sequence parallel splits them too, at no extra communication")
    if not layout.distributed_optimizer and layout.dp * layout.cp > 1:
        out.append(f"parallel.distributed_optimizer = true shards Adam's fp32 state over the {layout.dp * layout.cp} "
                   "data x context parallel ranks")
    t = spec.train
    if t.precision.startswith("fp8") and not t.te_op_fuser and spec.model.num_experts is None \
            and spec.model.transformer_impl != "local":
        out.append("train.te_op_fuser = true runs each MLP as one Transformer Engine op sequence, SwiGLU fused with "
                   "its FP8 casts: 0.6-1.7% faster and up to 5 GiB less on H200 (D29)")
    if layout.pp > 1 and layout.vpp is None and spec.model.num_layers % (layout.pp * 2) == 0 and layout.pp > 2:
        microbatches = t.global_batch_size // (t.micro_batch_size * layout.dp)
        if microbatches % layout.pp == 0:
            out.append("parallel.virtual_pipeline = 2 would halve the pipeline bubble (interleaved 1F1B) "
                       "at a small cost in activation memory")
    return out


def with_degrees(spec: ExperimentSpec, layout: Layout) -> ExperimentSpec:
    """``spec`` with the layout's degrees written into [parallel] (for a stage's job file)."""
    return evolve(spec, parallel=evolve(spec.parallel, tensor=layout.tp, pipeline=layout.pp, context=layout.cp,
                                        expert=layout.ep if spec.model.num_experts is not None else spec.parallel.expert,
                                        virtual_pipeline=layout.vpp, sequence_parallel=layout.sequence_parallel))
