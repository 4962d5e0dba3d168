"""Peak memory per GPU, with its breakdown, and a verdict against the GPU's memory.

Model state per parameter (Megatron-Core's DDP + distributed optimizer, as Megatron's own
``theoretical_memory_usage.py`` counts it): bf16/fp16 weights (2 B), fp32 main gradients (4 B; 2 B
with ``train.grad_reduce_in_bf16``), Adam's fp32 master weights + m + v (12 B), the last sharded
over data x context parallel ranks with the distributed optimizer (expert parameters over the
expert data-parallel ranks, world / (TP x EP x PP)). fp32 training keeps no master copy (8 B); FP8
adds Transformer Engine's cached FP8 weight and its transpose (2 B, not calibrated).

Activations follow Korthikanti et al. 2022 (the formula Megatron uses), per layer and token, in
elements of the activation dtype, for the flash-style attention mcx always runs (TE's fused
attention, or torch SDPA on the local spec), where the ``5as/h`` score-matrix term disappears:

* kept whole on every tensor-parallel rank unless sequence parallel: the two norm inputs and the
  two column-parallel GEMM inputs (4h);
* split over TP: Q, K, V (GQA-sized), the attention output, the MLP's first GEMM output
  (2 x ffn with SwiGLU) and its second GEMM input (ffn); an MoE layer keeps its permuted tokens
  (top-k x h) and the top-k experts' MLP activations instead of the dense MLP's.

That is 34h bytes per token for LLaMA-3 8B layers, and matches Transformer Engine within 1%
(measured on H200). Megatron-Core's local spec (torch norms, torch SDPA core attention, unfused
RoPE) measured ``LOCAL_ACTIVATION_FACTOR`` times that. Context parallel divides the tokens; full
recomputation keeps only each recompute chunk's input (h) plus one chunk being recomputed; the
selective recompute of core attention saves nothing with flash attention (no score matrix).
With pipeline parallel the first stage holds min(PP, micro-batches) micro-batches in flight under
1F1B, x (1 + (PP - 1) / (PP x VPP)) with interleaving; the last stage one, plus the logits: bf16
logits and the fp32 softmax of Megatron's vocab-parallel cross entropy (6 B per vocab entry), and
4 B more where the fused cross entropy runs (``mcx.plan.fusions``: its compiled kernels hold an
fp32 working copy of the logits).

Calibrated on H200 peaks (bf16, seq 4096, distributed optimizer; tests/test_plan.py holds them):
within 2% for every case mcx measured, within 8% of another loop's (docs/gpu.md, "Reference figures").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
from attrs import frozen

from mcx.plan.fusions import cross_entropy_fusion
from mcx.plan.gpus import GiB, gpu_info
from mcx.plan.params import Shapes, count_params, stage_params

if TYPE_CHECKING:
    from mcx.plan.layout import Layout
    from mcx.spec.schema import ExperimentSpec

# Local spec vs the structural (TE) count, fitted to mcx's own H200 peaks, not the bare loop's of
# docs/gpu.md (D18).
LOCAL_ACTIVATION_FACTOR = 1.07
RUNTIME_OVERHEAD_BYTES = 1 * GiB  # CUDA context (0.53 GiB measured on H200), cuBLAS/NCCL workspaces
TIGHT_FRACTION = 0.90  # above this share of the GPU's memory the verdict is "tight"
# Above this share the allocator's fragments decide, and without expandable segments the verdict is "tight":
# on H200 a run planned at 87% ran out of memory with 10 GiB reserved but unallocated, and fitted with
# expandable segments (D23); on H100 one planned at 89.6% ran out allocating its 7.8 GiB fp32 logits (D76).
FRAGMENTATION_FRACTION = 0.85
ALLOCATOR_SETTING = "train.expandable_segments = true"
ALLOCATOR_ENV, ALLOCATOR_VALUE = "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"  # what the worker sets for it
# How an allocation failure reads (CUDA's OutOfMemoryError, the host allocator's, cuBLAS's), lower-cased:
# the worker classifies its crash by it, `mcx tune` a trial's logs when the worker left no result.
OOM_TEXTS = ("out of memory", "outofmemory", "can't allocate memory", "cublas_status_alloc_failed")
ALLOCATOR_HINT = f"if it runs out of memory with much memory reserved but unallocated, set {ALLOCATOR_SETTING}"
LOGITS_BYTES_16BIT = 2 + 4  # bf16 logits + the fp32 softmax the cross entropy keeps for backward
FUSED_CE_EXTRA_BYTES = 4  # the fused (compiled) cross entropy's fp32 working copy (+3.9 GiB measured on H200 at 8K tokens)


@frozen(kw_only=True)
class MemoryEstimate:
    stage: str  # the pipeline stage with the highest peak: "first", "last" or "only" (PP = 1)
    weights: int
    gradients: int
    optimizer: int
    activations: int  # transformer layers, all micro-batches in flight
    logits: int  # output layer and loss (last stage)
    overhead: int
    in_flight_microbatches: float
    capacity: int | None  # the GPU's usable memory; None when the GPU is not in the table
    verdict: str  # "fits" | "tight" | "does not fit" | "unknown"
    fixes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.overhead

    def breakdown(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "logits": self.logits, "overhead": self.overhead}


def fits_fraction(expandable: bool) -> float:
    """The share of a GPU's memory a plan may take and still be said to fit: with the caching allocator's
    expandable segments off, its fragments make the last 15% unsafe (FRAGMENTATION_FRACTION)."""
    return TIGHT_FRACTION if expandable else FRAGMENTATION_FRACTION


def verdict(total: int, capacity: int | None, *, expandable: bool) -> str:
    if capacity is None:
        return "unknown"
    if total <= fits_fraction(expandable) * capacity:
        return "fits"
    return "tight" if total <= capacity else "does not fit"


def _bytes_per_param(spec: ExperimentSpec) -> tuple[float, int, int]:
    """(weights, gradients, optimizer) bytes per parameter."""
    t = spec.train
    if t.precision == "fp32":
        return 4, 4, 8
    weights = 2 + (2 if t.precision.startswith("fp8") else 0)  # + TE's fp8 weight and transpose caches
    return weights, 2 if t.grad_reduce_in_bf16 else 4, 12


def checkpoint_bytes(spec: ExperimentSpec, params: int) -> int:
    """Bytes of one checkpoint of ``params`` parameters: the weights as trained (bf16 or fp32) and the
    optimizer's state (fp32 main weights where the weights are 16-bit, and Adam's two moments)."""
    weights = 4 if spec.train.precision == "fp32" else 2
    return int(params * (weights + (0 if weights == 4 else 4) + 8))


def _layer_elements(spec: ExperimentSpec, layout: Layout) -> tuple[float, float]:
    """(kept activations of one layer, its input alone) in elements per token of one GPU's share."""
    s = Shapes.of(spec.model)
    tp = layout.tp
    seq_split = tp if layout.sequence_parallel else 1
    attention = (s.query_proj + 2 * s.kv_proj) + s.query_proj
    if s.num_experts:
        # Routed tokens are gathered over TP before the experts (expert TP = TP): top-k copies of
        # every token of the sequence, unsplit, plus the experts' split MLP activations.
        routed_tokens = s.topk * s.hidden
        mlp = s.topk * (s.moe_fc1_out + s.moe_ffn)
    else:
        routed_tokens, mlp = 0, s.fc1_out + s.ffn
    kept = 4 * s.hidden / seq_split + (attention + mlp) / tp + routed_tokens
    return kept, s.hidden / seq_split


def _in_flight(layout: Layout, microbatches: int) -> float:
    if layout.pp == 1:
        return 1.0
    if layout.vpp:
        return layout.pp * (1 + (layout.pp - 1) / (layout.pp * layout.vpp))
    return float(min(layout.pp, microbatches))


def estimate_memory(spec: ExperimentSpec, layout: Layout, *, vocab_size: int, transformer_impl: str,
                    suggest_fixes: bool = True) -> MemoryEstimate:
    """Peak bytes on the most loaded GPU (first or last pipeline stage) for ``layout``."""
    m, t = spec.model, spec.train
    counts = count_params(m, vocab_size, layout.tp)
    wb, gb, ob = _bytes_per_param(spec)
    act_b = 4 if t.precision == "fp32" else 2
    microbatches = max(1, t.global_batch_size // (t.micro_batch_size * layout.dp))
    tokens = t.micro_batch_size * m.seq_length / layout.cp  # per micro-batch on one GPU
    kept, layer_input = _layer_elements(spec, layout)
    factor = LOCAL_ACTIVATION_FACTOR if transformer_impl == "local" else 1.0
    dropout_masks = 2 * m.hidden_size / (layout.tp if layout.sequence_parallel else 1) if m.hidden_dropout > 0 else 0
    per_layer = tokens * (kept * act_b * factor + dropout_masks)
    layers = m.num_layers // layout.pp
    if t.recompute_granularity == "full":
        n = min(t.recompute_num_layers, layers)
        if t.recompute_method == "uniform":
            stored = math.ceil(layers / n) * tokens * layer_input * act_b
        else:
            stored = n * tokens * layer_input * act_b + (layers - n) * per_layer
        working = (n if t.recompute_method == "uniform" else 1) * per_layer
    else:
        stored, working = layers * per_layer, 0.0
    expert_dp = max(1, layout.world_size // (layout.tp * layout.ep * layout.pp))
    dense_dp = layout.dp * layout.cp if layout.distributed_optimizer else 1
    expert_shards = expert_dp if layout.distributed_optimizer else 1
    fused_ce = cross_entropy_fusion(t, on_gpu=spec.hardware.gpu != "cpu")
    logits_bytes = (LOGITS_BYTES_16BIT + (FUSED_CE_EXTRA_BYTES if fused_ce else 0)) if act_b == 2 else 4
    logits_per_token = counts.padded_vocab / layout.tp * logits_bytes
    final_norm = 2 * m.hidden_size * act_b / (layout.tp if layout.sequence_parallel else 1)

    info = gpu_info(spec.hardware.gpu)
    capacity = info.memory_bytes if info else None
    candidates: list[MemoryEstimate] = []
    stages = [("only", True, True)] if layout.pp == 1 else [("first", True, False), ("last", False, True)]
    for name, first, last in stages:
        sp = stage_params(counts, m, tp=layout.tp, pp=layout.pp, ep=layout.ep, first=first, last=last)
        in_flight = _in_flight(layout, microbatches) if first else 1.0
        candidates.append(MemoryEstimate(
            stage=name, in_flight_microbatches=in_flight,
            weights=int(sp.total * wb), gradients=int(sp.total * gb),
            optimizer=int(sp.dense * ob / dense_dp + sp.experts * ob / expert_shards),
            activations=int(in_flight * stored + working),
            logits=int(tokens * (logits_per_token + final_norm)) if last else 0,
            overhead=RUNTIME_OVERHEAD_BYTES, capacity=capacity, verdict="unknown"))
    worst = max(candidates, key=lambda c: c.total)  # the first of equal peaks, in stage order
    est = attrs.evolve(worst, verdict=verdict(worst.total, capacity, expandable=t.expandable_segments))
    if suggest_fixes and est.verdict in ("tight", "does not fit"):
        est = attrs.evolve(est, fixes=tuple(memory_fixes(spec, layout, est, vocab_size, transformer_impl)))
    return est


def memory_fixes(spec: ExperimentSpec, layout: Layout, est: MemoryEstimate, vocab_size: int, impl: str) -> list[str]:
    """Changes that lower the peak, each with the peak it gives; those that make it fit first."""
    t, m = spec.train, spec.model
    options: list[tuple[str, ExperimentSpec, Layout]] = []
    if t.recompute_granularity != "full":
        options.append(('train.recompute_granularity = "full" (recompute_method = "uniform", recompute_num_layers = 1)',
                        attrs.evolve(spec, train=attrs.evolve(t, recompute_granularity="full", recompute_method="uniform",
                                                              recompute_num_layers=1)), layout))
    if t.micro_batch_size > 1:
        options.append((f"train.micro_batch_size = 1 (global batch kept at {t.global_batch_size})",
                        attrs.evolve(spec, train=attrs.evolve(t, micro_batch_size=1)), layout))
    if not layout.distributed_optimizer and layout.dp * layout.cp > 1:
        options.append(("parallel.distributed_optimizer = true", spec, attrs.evolve(layout, distributed_optimizer=True)))
    if layout.tp > 1 and not layout.sequence_parallel:
        options.append(("parallel.sequence_parallel = true", spec, attrs.evolve(layout, sequence_parallel=True)))
    groups = m.num_query_groups or m.num_attention_heads
    tp2 = layout.tp * 2
    if (m.num_attention_heads % tp2 == 0 and groups % tp2 == 0 and tp2 <= layout.gpus_per_node
            and layout.dp % 2 == 0 and ((layout.dp // 2) * layout.cp) % layout.ep == 0):
        options.append((f"parallel.tensor = {tp2}", spec, attrs.evolve(layout, tp=tp2, dp=layout.dp // 2)))
    pp2 = layout.pp * 2
    if (m.num_layers % (pp2 * (layout.vpp or 1)) == 0 and layout.dp % 2 == 0
            and ((layout.dp // 2) * layout.cp) % layout.ep == 0):
        options.append((f"parallel.pipeline = {pp2}", spec, attrs.evolve(layout, pp=pp2, dp=layout.dp // 2)))
    scored = []
    for text, s2, l2 in options:
        e = estimate_memory(s2, l2, vocab_size=vocab_size, transformer_impl=impl, suggest_fixes=False)
        if e.total < est.total:
            scored.append((e.verdict != "fits", e.total, f"{text}: {e.total / GiB:.1f} GiB ({e.verdict})"))
    return [text for _, _, text in sorted(scored)]


def allocator_items(conf: str | None) -> list[str]:
    """The settings in a ``PYTORCH_CUDA_ALLOC_CONF`` value, e.g. ["max_split_size_mb:128", ALLOCATOR_VALUE]."""
    return [s for s in (item.strip() for item in (conf or "").split(",")) if s]


def other_allocator_items(conf: str | None) -> list[str]:
    """The settings in ``conf`` other than expandable segments (which ``train.expandable_segments`` carries)."""
    return [s for s in allocator_items(conf) if not s.startswith("expandable_segments")]


def with_expandable_segments(conf: str | None) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` with expandable segments on, the other settings in ``conf`` kept."""
    return ",".join([*other_allocator_items(conf), ALLOCATOR_VALUE])


def fragments(facts: dict[str, Any]) -> float | None:
    """Bytes the CUDA allocator held reserved but unallocated when a worker ran out of memory (``facts``:
    ``mcx.train.worker.out_of_memory``), when they are what ``train.expandable_segments`` is for: at
    least 1 GiB and 5% of the GPU, with the setting off. None otherwise."""
    allocated, reserved = facts.get("allocated_bytes"), facts.get("reserved_bytes")
    if allocated is None or reserved is None or facts.get("expandable_segments"):
        return None
    unused = reserved - allocated
    return unused if unused >= max(GiB, 0.05 * (facts.get("capacity_bytes") or 0)) else None


def oom_advice(est: MemoryEstimate, facts: dict[str, Any], fixes: list[str]) -> list[str]:
    """What to try after a stage ran out of memory: the worker's ``facts`` (``mcx.train.worker.
    out_of_memory``) beside the planner's estimate ``est`` for that stage, then ``fixes``."""
    tips = []
    allocated, reserved = facts.get("allocated_bytes"), facts.get("reserved_bytes")
    capacity = facts.get("capacity_bytes") or est.capacity
    if allocated is not None and reserved is not None:
        of = f" of the GPU's {capacity / GiB:.1f} GiB" if capacity else ""
        tips.append(f"the planner estimated {est.total / GiB:.1f} GiB per GPU; when the worker ran out, "
                    f"{allocated / GiB:.1f} GiB were allocated and {reserved / GiB:.1f} GiB reserved{of}")
        unused = fragments({**facts, "capacity_bytes": capacity})
        if unused is not None:
            tips.append(f"{unused / GiB:.1f} GiB were reserved but unallocated (the allocator's fragments): "
                        f"set {ALLOCATOR_SETTING} and run again")
    else:
        tips.append(f"the planner estimated {est.total / GiB:.1f} GiB per GPU"
                    + (f" of {capacity / GiB:.1f} GiB" if capacity else ""))
    tips += [f"lower the peak: {fix}" for fix in fixes[:3]]
    return tips
