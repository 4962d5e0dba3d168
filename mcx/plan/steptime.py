"""Step time before the job: a model of one optimizer step on the spec's GPUs and layout, calibrated on
measured steps (docs/decisions.md D44, docs/benchmarks.md "The step-time model").

Pure arithmetic over the spec, the layout and the GPU table (mcx.plan.gpus). One pipeline stage's
micro-batch is priced layer by layer, then the schedule and the data-parallel step around it:

* **GEMMs** (QKV, output projection, the MLP or the experts, the logits): each at ``2 m n k`` FLOPs,
  ``max(compute, memory)`` plus a launch. Compute runs at the GPU's dense peak times the calibrated
  efficiency of large GEMMs for the precision; memory reads and writes the operands at HBM bandwidth, so
  small and skinny GEMMs cost what they cost. The backward runs each GEMM twice (data, weight gradient).
* **Core attention**: the causal half of ``QK^T`` and ``PV`` at the calibrated attention efficiency of the
  layer implementation (Transformer Engine's cuDNN kernels, or torch SDPA), the backward a calibrated
  multiple of the forward.
* **Element-wise work** (norms, RoPE, SwiGLU, residuals, FP8 casts, the loss): HBM passes over the
  activations counted per token, times a calibrated factor.
* **Communication**: tensor parallel's all-gathers and reduce-scatters (or all-reduces) of the
  activations, exposed unless ``tp_comm_overlap``; context parallel's ring of keys and values, hidden
  behind attention as far as it lasts; expert parallel's all-to-alls; pipeline sends; data parallel's
  gradient reduce-scatter and parameter all-gather, overlapped with the last backward and first forward
  when ``parallel.overlap_*`` say so. Links: NVLink inside a node, the network across nodes, at a
  calibrated fraction of their bandwidth.
* **The schedule**: 1F1B's bubble ``(pp - 1)`` micro-batch times, ``1 / vpp`` of it interleaved, paced by
  the slowest stage (the last one computes the logits); activation recomputation adds its forward passes.
* **The optimizer**: Adam over this GPU's share of the fp32 main parameters, at HBM bandwidth.
* **The host floor**: a GPU cannot run ahead of the host that launches its kernels. The host's time for a step
  (Megatron-Core's Python and launches, per layer and micro-batch, plus a fixed part a step) is priced beside
  the GPU's, and the step is the longer of the two; ``train.cuda_graphs`` replays the whole forward and backward
  as one graph, leaving the fixed part only. Small models' steps are this floor, and so are small mixtures of
  experts': a MoE layer costs the host several dense layers' time (routing, the token counts' sync, the experts).

Model FLOPs (mcx.plan.flops) over the predicted step give the predicted MFU, as the worker measures it.
"""

from __future__ import annotations

import attrs
from attrs import field, frozen

from mcx.plan.layout import Layout
from mcx.plan.flops import flops_per_iteration
from mcx.plan.fusions import cross_entropy_fusion
from mcx.plan.gpus import Gpu, gpu_info
from mcx.plan.params import Shapes, count_params, stage_params
from mcx.spec.schema import ExperimentSpec, GpuModel

BF16, FP8 = 2, 1  # bytes per element


@frozen(kw_only=True)
class Calibration:
    """The fitted constants (D44): fractions of a GPU's datasheet figures its kernels reach, and fixed costs.
    One set per architecture; fitted by benchmarks/steptime_fit.py on the measured steps it lists."""

    gemm_bf16: float  # large bf16 GEMMs: fraction of the dense bf16 peak
    gemm_fp8: float  # large FP8 GEMMs: fraction of the dense FP8 peak
    attention_te: float  # fused attention forward (cuDNN via Transformer Engine), long sequences: of the bf16 peak
    attention_local: float  # torch SDPA (flash) forward, long sequences: fraction of the bf16 peak
    attention_backward: float  # backward time / forward time of the core attention
    attention_len: float  # a kernel's query length at which attention runs at half its long-sequence efficiency
    elementwise: float  # factor on the counted HBM passes of element-wise work
    moe_layer_s: float  # per MoE layer per micro-batch, forward and backward: routing, token counts' host sync
    launch_s: float  # per GEMM launch
    layer_s: float  # per layer per micro-batch, forward and backward: host work and small kernels
    comm: float  # fraction of a link's bandwidth NCCL reaches
    dp_tail: float  # share of the overlapped data-parallel communication that stays exposed (last bucket)
    step_s: float  # per step: the optimizer's launch, the loss and grad-norm reductions, logging
    # The host floor (issue 41): the host's time a step, which the GPU's work cannot go under. Eager: per layer and
    # micro-batch, forward and backward (Megatron-Core's Python and launches); per step: the optimizer, the loss and
    # metrics, a graph's replay. 0: no floor.
    host_layer_s: float = 0.0
    host_step_s: float = 0.0
    # A MoE layer's host time a micro-batch in dense layers' (host_layer_s, so a learned floor scales it too): the
    # router, the token counts' sync, the permutation, and the experts one by one or as one grouped GEMM (D81).
    host_moe_sequential: float = 1.0
    host_moe_grouped: float = 1.0


CALIBRATIONS: dict[str, Calibration] = {  # benchmarks/steptime_fit.py --fit (docs/benchmarks.md)
    "Hopper": Calibration(gemm_bf16=0.621, gemm_fp8=0.5, attention_te=0.568, attention_local=0.395,
                          attention_backward=2.5, attention_len=517.0, elementwise=1.03, moe_layer_s=5e-4,
                          launch_s=6e-6, layer_s=2.02e-4, comm=0.75, dp_tail=0.1, step_s=0.01,
                          host_layer_s=0.00362, host_step_s=0.0123, host_moe_sequential=4.26, host_moe_grouped=3.34),
}
# Other architectures start from Hopper's fractions (their own peaks and bandwidths apply) until measured.
CALIBRATIONS["Ampere"] = CALIBRATIONS["Blackwell"] = CALIBRATIONS["Ada Lovelace"] = CALIBRATIONS["Hopper"]


@frozen(kw_only=True)
class Features:
    """What the step runs that the layout alone does not say (defaults: what mcx's worker runs)."""

    impl: str = "transformer_engine"  # or "local"
    tp_comm_overlap: bool = False  # TP collectives hidden behind GEMMs (Transformer Engine's userbuffers)
    fp8_param_gather: bool = False  # the distributed optimizer all-gathers FP8 parameters
    grouped_gemm: bool = False  # MoE experts as one grouped GEMM
    cuda_graphs: bool = False  # the forward and backward replayed as one CUDA graph (train.cuda_graphs): no per-layer host time


@frozen(kw_only=True)
class StepTime:
    """One optimizer step, predicted: its seconds and what they are spent on (seconds per step)."""

    step_s: float
    compute_s: float  # GEMMs, attention and element-wise work of every micro-batch (recomputation included)
    tp_s: float  # exposed tensor-parallel communication
    cp_s: float  # exposed context-parallel communication
    ep_s: float  # expert-parallel all-to-alls
    pp_s: float  # pipeline sends
    bubble_s: float  # the pipeline's fill and drain
    dp_s: float  # exposed data-parallel communication
    optimizer_s: float
    overhead_s: float  # per-layer host work and the per-step fixed cost
    host_s: float  # the host floor: the host's own time for the step (the step is at least this)
    host_layers: float  # layer passes a step the host launches one by one (micro-batches x layers; 0 graphed)
    host_wait_s: float  # how much of the step the GPU waits on the host: host_s above the GPU's step, else 0
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float | None  # of the bf16 dense peak, as the worker reports it

    def breakdown(self) -> dict[str, float]:
        """Seconds by part, summing to the step; "waiting on the host" only where the host floor sets the step."""
        parts = {"compute": self.compute_s, "tensor parallel": self.tp_s, "context parallel": self.cp_s,
                 "expert parallel": self.ep_s, "pipeline sends": self.pp_s, "pipeline bubble": self.bubble_s,
                 "data parallel": self.dp_s, "optimizer": self.optimizer_s, "overhead": self.overhead_s}
        return {**parts, "waiting on the host": self.host_wait_s} if self.host_wait_s > 0 else parts


@frozen
class _Device:
    gpu: Gpu
    cal: Calibration
    hbm: float = field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "hbm", self.gpu.hbm_tb_per_s * 1e12)

    def peak(self, fp8: bool) -> float:
        return (self.gpu.fp8_tflops if fp8 and self.gpu.fp8_tflops else self.gpu.bf16_tflops) * 1e12

    def gemm(self, m: float, n: float, k: float, *, fp8: bool, count: int = 1) -> float:
        """``count`` GEMMs of m x n x k: compute or operand traffic, whichever is longer, plus launches."""
        flops = 2 * m * n * k
        eff = self.cal.gemm_fp8 if fp8 else self.cal.gemm_bf16
        width = FP8 if fp8 else BF16
        moved = width * (m * k + k * n) + BF16 * m * n
        return count * (max(flops / (self.peak(fp8) * eff), moved / self.hbm) + self.cal.launch_s)

    def link(self, within_node: bool) -> float:
        """Bytes per second one GPU sends in a collective over NVLink (one direction) or the network."""
        g = self.gpu
        raw = (g.nvlink_gb_per_s / 2 if within_node and g.nvlink_gb_per_s else g.net_gb_per_s) * 1e9
        return raw * self.cal.comm


def device_for(spec: ExperimentSpec) -> _Device | None:
    gpu = gpu_info(spec.hardware.gpu)
    if gpu is None:
        return None
    return _Device(gpu, CALIBRATIONS[gpu.architecture])


def predict(spec: ExperimentSpec, layout: Layout, *, padded_vocab: int, features: Features | None = None,
            calibration: Calibration | None = None, host_layer_s: float | None = None) -> StepTime | None:
    """The step of ``spec`` on ``layout``; None where the GPU is not in the table (no datasheet to model).
    ``host_layer_s``: the host's time a layer and micro-batch as measured on the hosts that will run it
    (mcx.plan.hostfloor), in place of the calibration's."""
    dev = device_for(spec)
    if dev is None:
        return None
    if calibration is not None:
        dev = _Device(dev.gpu, calibration)
    if host_layer_s is not None:
        dev = _Device(dev.gpu, attrs.evolve(dev.cal, host_layer_s=host_layer_s))
    f = features or Features()
    return _predict(spec, layout, padded_vocab, f, dev)


def _predict(spec: ExperimentSpec, lay: Layout, padded_vocab: int, f: Features, dev: _Device) -> StepTime:
    m, t = spec.model, spec.train
    s = Shapes.of(m)
    fp8 = t.precision.startswith("fp8") and f.impl == "transformer_engine"
    seq = m.seq_length
    tokens = t.micro_batch_size * seq / lay.cp  # one micro-batch on one rank of the context group
    micro = max(1, t.global_batch_size // (t.micro_batch_size * lay.dp))
    per_stage = m.num_layers / lay.pp
    node = lay.gpus_per_node or dev.gpu.gpus_per_node
    replica = lay.world_size // lay.pp  # GPUs of one pipeline stage: data-parallel peers sit this far apart

    layer_fwd, layer_bwd, attn_fwd = _layer_compute(spec, s, lay, f, dev, tokens, fp8)
    recompute = _recompute(spec, layer_fwd, attn_fwd, per_stage)
    tp = _tp_comm(s, lay, f, dev, tokens, node)
    cp = _cp_comm(s, lay, dev, tokens, attn_fwd, node)
    ep = _ep_comm(s, lay, dev, tokens, node) if s.num_experts else 0.0
    layer = layer_fwd + layer_bwd + tp + cp + ep + dev.cal.layer_s
    # the fusion as the worker applies it: off in deterministic mode and for fp32 or fp16 parameters (D80)
    logits = _logits(s, lay, dev, tokens, padded_vocab, cross_entropy_fusion(t, on_gpu=True))
    chunks = lay.virtual_stages or 1
    send = 0.0
    if lay.pp > 1:  # activations forward, their gradients back; sequence-sharded with SP
        moved = 2 * chunks * BF16 * tokens * s.hidden / (lay.tp if lay.sequence_parallel else 1)
        send = moved / dev.link(replica < node)
        if chunks > 1:  # the interleaved schedule overlaps its sends with the next chunk's compute
            send = max(0.0, send - per_stage * (layer_fwd + layer_bwd))
    stage_mb = per_stage * layer + recompute + logits + send  # the last stage: the slowest
    bubble = (lay.pp - 1) * stage_mb / chunks
    pipeline = micro * stage_mb + bubble
    forward = per_stage * (layer_fwd + tp / 3 + cp / 3 + ep / 3) + logits / 3
    optimizer, dp = _optimizer_and_dp(spec, lay, f, dev, padded_vocab, (forward, stage_mb - forward), replica <= node)
    device = pipeline + optimizer + dp + dev.cal.step_s
    host_layers = 0.0 if f.cuda_graphs else micro * per_stage
    host = host_layers * dev.cal.host_layer_s * host_weight(s.num_experts, f.grouped_gemm, dev.cal) + dev.cal.host_step_s
    step = max(device, host)

    compute = micro * (per_stage * (layer_fwd + layer_bwd) + recompute + logits)
    flops = flops_per_iteration(m, padded_vocab=padded_vocab, global_batch_size=t.global_batch_size)
    world = lay.world_size
    peak = dev.gpu.bf16_tflops * 1e12
    return StepTime(step_s=step, compute_s=compute, tp_s=micro * per_stage * tp, cp_s=micro * per_stage * cp,
                    ep_s=micro * per_stage * ep, pp_s=micro * send, bubble_s=bubble, dp_s=dp, optimizer_s=optimizer,
                    overhead_s=micro * per_stage * dev.cal.layer_s + dev.cal.step_s,
                    host_s=host, host_layers=host_layers, host_wait_s=step - device,
                    tokens_per_s_per_gpu=t.global_batch_size * seq / step / world,
                    tflops_per_gpu=flops / step / world / 1e12, mfu=flops / step / world / peak)


def host_weight(num_experts: int | None, grouped_gemm: bool, cal: Calibration) -> float:
    """A layer's host time in dense layers' (D81): 1 for a dense layer."""
    if not num_experts:
        return 1.0
    return cal.host_moe_grouped if grouped_gemm else cal.host_moe_sequential


def _layer_compute(spec: ExperimentSpec, s: Shapes, lay: Layout, f: Features, dev: _Device, tokens: float,
                   fp8: bool) -> tuple[float, float, float]:
    """(forward, backward, core attention forward) seconds of one layer on one micro-batch."""
    m, tp, h, cal = spec.model, lay.tp, s.hidden, dev.cal
    gemms = dev.gemm(tokens, (s.query_proj + 2 * s.kv_proj) / tp, h, fp8=fp8)
    gemms += dev.gemm(tokens, h, s.query_proj / tp, fp8=fp8)
    moe = 0.0
    if s.num_experts:
        local = s.num_experts / lay.ep
        routed = tokens * s.topk  # balanced routing: every rank computes its tokens' top-k share
        count = 1 if f.grouped_gemm else max(1, round(local))
        per = routed / count
        gemms += dev.gemm(per, s.moe_fc1_out / tp, h, fp8=fp8, count=count)
        gemms += dev.gemm(per, h, s.moe_ffn / tp, fp8=fp8, count=count)
        gemms += dev.gemm(tokens, s.num_experts, h, fp8=False)  # the router
        # permute, sort by local expert, unsort, unpermute: each reads and writes the routed tokens, both ways
        moe = 16 * BF16 * routed * h / dev.hbm + cal.moe_layer_s
    else:
        gemms += dev.gemm(tokens, s.fc1_out / tp, h, fp8=fp8)
        gemms += dev.gemm(tokens, h, s.ffn / tp, fp8=fp8)
    # Causal: half of QK^T and PV. With CP, each rank holds two chunks of seq / 2cp (load balance) and the
    # ring's kernels run on those.
    attn_flops = 4 * tokens * m.seq_length * (s.query_proj / tp) / 2
    length = m.seq_length / (2 * lay.cp) if lay.cp > 1 else m.seq_length
    eff = (cal.attention_te if f.impl == "transformer_engine" else cal.attention_local)
    attn = attn_flops / (dev.gpu.bf16_tflops * 1e12 * eff * length / (length + cal.attention_len))
    # element-wise passes per token: norms and residuals over h (sequence-sharded with SP), RoPE over the
    # query and key heads, SwiGLU over the MLP width; FP8 adds a cast of each GEMM input; CP's ring corrects
    # its fp32 partial outputs once a step
    h_rows = tokens / tp if lay.sequence_parallel else tokens
    ffn = (s.moe_fc1_out * s.topk if s.num_experts else s.fc1_out) / tp
    passes = h_rows * 20 * h + tokens * (4 * (s.query_proj + s.kv_proj) / tp + 4 * ffn)
    if fp8:
        passes += tokens * (2 * h + ffn)
    if lay.cp > 1:
        passes += lay.cp * 4 * tokens * s.query_proj / tp
    ew = cal.elementwise * BF16 * passes / dev.hbm
    forward = gemms + attn + ew / 3 + moe / 3
    backward = 2 * gemms + cal.attention_backward * attn + 2 * ew / 3 + 2 * moe / 3
    return forward, backward, attn


def _recompute(spec: ExperimentSpec, layer_fwd: float, attn_fwd: float, per_stage: float) -> float:
    """Seconds a micro-batch's backward spends recomputing forwards on one stage."""
    t = spec.train
    if t.recompute_granularity == "selective":
        return per_stage * attn_fwd
    if t.recompute_granularity == "full":
        layers = per_stage if t.recompute_method == "uniform" else min(per_stage, t.recompute_num_layers)
        return layers * layer_fwd
    return 0.0


def _tp_comm(s: Shapes, lay: Layout, f: Features, dev: _Device, tokens: float, node: int) -> float:
    """Exposed tensor-parallel seconds of one layer (forward and backward): 8 all-gathers or reduce-scatters of
    the activations with sequence parallel, 4 all-reduces (twice the traffic each) without."""
    if lay.tp == 1 or f.tp_comm_overlap:
        return 0.0
    moved = 8 * (lay.tp - 1) / lay.tp * BF16 * tokens * s.hidden
    return moved / dev.link(lay.tp <= node)


def _cp_comm(s: Shapes, lay: Layout, dev: _Device, tokens: float, attn_fwd: float, node: int) -> float:
    """Exposed context-parallel seconds of one layer: the ring of keys and values (and their gradients) that
    attention's compute does not cover."""
    if lay.cp == 1:
        return 0.0
    kv = 2 * BF16 * tokens * s.kv_proj / lay.tp
    forward = (lay.cp - 1) * kv / dev.link(lay.tp * lay.cp <= node)
    backward = 2 * forward
    return max(0.0, forward - attn_fwd) + max(0.0, backward - dev.cal.attention_backward * attn_fwd)


def _ep_comm(s: Shapes, lay: Layout, dev: _Device, tokens: float, node: int) -> float:
    """Expert-parallel seconds of one MoE layer: dispatch and combine, forward and backward."""
    if lay.ep == 1:
        return 0.0
    moved = 4 * (lay.ep - 1) / lay.ep * BF16 * tokens * s.topk * s.hidden
    return moved / dev.link(lay.ep * lay.tp <= node)


def _logits(s: Shapes, lay: Layout, dev: _Device, tokens: float, vocab: int, fused: bool) -> float:
    """The last stage's output layer and loss for one micro-batch, forward and backward (bf16 GEMMs)."""
    gemm = 3 * dev.gemm(tokens, vocab / lay.tp, s.hidden, fp8=False)
    passes = (3 if fused else 8) * 4 * tokens * vocab / lay.tp  # fp32 logits read and written
    return gemm + dev.cal.elementwise * passes / dev.hbm


def _optimizer_and_dp(spec: ExperimentSpec, lay: Layout, f: Features, dev: _Device, vocab: int,
                      windows: tuple[float, float], within_node: bool) -> tuple[float, float]:
    """(optimizer seconds, exposed data-parallel seconds) of one step on the last stage's GPU. Dense parameters
    reduce over DP x CP, experts over the expert-data-parallel group; ``windows`` are a micro-batch's forward
    and backward on the stage, which hide the parameter all-gather and the gradient reduce-scatter."""
    counts = count_params(spec.model, vocab, lay.tp)
    local = stage_params(counts, spec.model, tp=lay.tp, pp=lay.pp, ep=lay.ep, first=lay.pp == 1, last=True)
    groups = ((local.dense, lay.dp * lay.cp), (local.experts, lay.world_size // (lay.pp * lay.ep * lay.tp)))
    optimizer = reduce = gather = 0.0
    for params, size in groups:
        if not params:
            continue
        shards = size if lay.distributed_optimizer else 1
        # Adam reads grad, master, m, v and writes master, m, v and the bf16 weight; the grad buffer is zeroed
        optimizer += (30 * params / shards + 4 * params) / dev.hbm
        if size == 1:
            continue
        ring = (size - 1) / size * params / dev.link(within_node)
        grad = ring * (BF16 if spec.train.grad_reduce_in_bf16 else 4)
        if lay.distributed_optimizer:
            reduce += grad
            gather += ring * (FP8 if f.fp8_param_gather else BF16)
        else:  # an all-reduce in the backward: twice a reduce-scatter
            reduce += 2 * grad
    p = spec.parallel
    exposed = 0.0
    for seconds, overlapped, window in ((gather, p.overlap_param_gather, windows[0]),
                                        (reduce, p.overlap_grad_reduce, windows[1])):
        exposed += max(seconds * dev.cal.dp_tail, seconds - window) if overlapped else seconds
    return optimizer, exposed


# The calibration's shortest step is 1.27 s. Under a quarter second the host's work and the kernel launches
# set a step, which the model does not price: measured 5x its prediction (docs/steptime.md, "Small models").
SHORT_STEP_S = 0.25


def step_seconds(s: float) -> str:
    """A step's seconds as the plan shows them: milliseconds under a second."""
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:,.2f} s"


def short_step_note(predicted_s: float) -> str | None:
    """What to read into the model's error where the step is too short for it; None where it is not."""
    if predicted_s >= SHORT_STEP_S:
        return None
    return ("a step this short is set by the host and kernel launches, priced by a floor fitted on one machine's "
            "host or measured by this project's runs; another host can be far off it (docs/steptime.md, "
            '"Small models")')


@frozen(kw_only=True)
class PredictionCheck:
    """The model's step beside a finished stage's measured one, priced on the GPU that ran it."""

    gpu: str  # the hardware table's key for the GPU the stage ran on
    predicted_s: float
    measured_s: float  # the median training step (evaluations and checkpoints left out: the model prices neither)
    host_layer_s: float | None = None  # where the host set the step: its time a layer and micro-batch (hostfloor)

    @property
    def error(self) -> float:
        """predicted / measured - 1: above zero the model was slower than the hardware."""
        return self.predicted_s / self.measured_s - 1

    def to_dict(self) -> dict[str, float | str]:
        out: dict[str, float | str] = {"gpu": self.gpu, "predicted_s": self.predicted_s,
                                       "measured_s": self.measured_s, "error": self.error}
        if self.host_layer_s is not None:
            out["host_layer_s"] = self.host_layer_s
        return out


def predict_worker(spec: ExperimentSpec, layout: Layout, *, padded_vocab: int, impl: str,
                   host_layer_s: float | None = None) -> StepTime | None:
    """The model's step for what mcx's worker runs: ``impl``'s layers, grouped GEMMs as the spec says, no TP
    communication overlap or FP8 parameter all-gather."""
    return predict(spec, layout, padded_vocab=padded_vocab, host_layer_s=host_layer_s,
                   features=Features(impl=impl, grouped_gemm=spec.model.moe_grouped_gemm,
                                     cuda_graphs=spec.train.cuda_graphs))


HOST_SET = 1.25  # a measured step at least this far above the model's GPU step was set by the host


def host_layer_seconds(st: StepTime, measured_s: float, host_step_s: float) -> float | None:
    """The host's time a layer and micro-batch that a measured step says, where the host set it: an eager step
    at least HOST_SET times the model's GPU step; None for a graphed step or one the GPU set."""
    gpu_step = st.step_s - st.host_wait_s
    if st.host_layers <= 0 or measured_s < HOST_SET * gpu_step:
        return None
    return max(0.0, measured_s - host_step_s) / st.host_layers


def check_prediction(spec: ExperimentSpec, layout: Layout, *, padded_vocab: int, impl: str, gpu: GpuModel | None,
                     measured_s: float, host_layer_s: float | None = None) -> PredictionCheck | None:
    """None where the GPU that ran is not in the table or nothing was measured. ``host_layer_s``: the host floor
    the run's plan used (learned, mcx.plan.hostfloor); the check also says what this run's host took, where it
    set the step of a dense model."""
    if gpu is None or measured_s <= 0:
        return None
    ran = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu=gpu))
    st = predict_worker(ran, layout, padded_vocab=padded_vocab, impl=impl, host_layer_s=host_layer_s)
    dev = device_for(ran)
    if st is None or dev is None:
        return None
    host = None if spec.model.num_experts else host_layer_seconds(st, measured_s, dev.cal.host_step_s)
    return PredictionCheck(gpu=gpu, predicted_s=st.step_s, measured_s=measured_s, host_layer_s=host)
