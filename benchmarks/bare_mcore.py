"""A bare, tuned Megatron-Core training loop: the speed that mcx's runner must match.

This is the independent reference for ``benchmarks/throughput.py``. It never imports ``mcx.train``:
it reads the same mcx spec with the same overrides (``throughput.spec_overrides`` /
``load_benchmark_spec``: pure ``mcx.spec`` and ``mcx.plan``), builds the same model with
Megatron-Core 0.19.2 directly, wired the way Megatron-LM's ``pretrain_gpt.py`` / ``training.py``
wire it, and is scored by the same function as mcx's run (``throughput.score``):

* GPTModel, LLaMA style from the spec: RMSNorm, SwiGLU (gated linear unit + SiLU), RoPE with the
  spec's ``rotary_base``, grouped-query attention, untied embeddings, no biases, bf16 parameters;
* ``--impl te``: Transformer Engine's layer spec; ``--impl local``: MCore's local spec with its core
  attention replaced by :class:`SDPACoreAttention` (torch ``scaled_dot_product_attention``);
* ``Float16Module``, MCore ``DistributedDataParallel`` (fp32 gradient buffers, overlapped
  reduce-scatter and param all-gather, distributed optimizer), ``get_megatron_optimizer`` (Adam,
  fp32 main params, clipping), ``get_forward_backward_func`` with the masked LM loss, and the sync
  hooks Megatron-LM sets on the config (``no_sync_func``, ``grad_sync_func``,
  ``finalize_model_grads_func``, ``grad_scale_func``); the forward pre-hooks of the overlapped
  param all-gather are off for the first step, as in Megatron-LM;
* FP8 (``--fp8 hybrid``, delayed scaling) with the Transformer Engine spec;
* ``--compile`` (a lever under measurement, issue 7): ``rope`` torch.compiles MCore's unfused RoPE
  (the local spec's; Transformer Engine's is fused already), ``layers`` torch.compiles every
  transformer layer (``nn.Module.compile``; MCore's layers graph-break at each linear and around the
  output projection, so the fused regions are the norms, RoPE, SwiGLU and residual adds between them).
  The local spec's RMSNorm is torch's, which runs one fused kernel on CUDA (``aten._fused_rms_norm``).

Data: random token ids from a fixed ``torch.Generator`` (same shapes as real data, which is all
that speed depends on), pinned on the host and copied per micro-batch like Megatron-LM's
``get_batch``. Each step is one optimizer step over the spec's global batch
(``global_batch_size / (micro_batch_size x DP)`` micro-batches per rank). ``--warmup`` steps run
first, then ``--steps`` steps are timed: each step ends with ``torch.cuda.synchronize``, and a
step's time is the ``perf_counter`` interval from the end of the previous step to its own end (the
whole loop iteration). Reported, as one JSON line on stdout (rank 0) and in ``--out``:

    tokens_per_s_per_gpu   global batch tokens x steps / summed step times / GPUs
    tflops_per_gpu, mfu    Megatron's FLOPs (mcx.plan.flops) over the same time; MFU against the
                           bf16 dense peak of the GPU (mcx.plan.gpus), null if unknown
    *_median               the same from the median step time
    mem_peak_bytes         torch.cuda.max_memory_allocated() over the whole run (rank 0, as mcx's
                           metrics; *_max_rank: the largest over ranks)

    python benchmarks/bare_mcore.py --spec experiments/h200_1gpu.toml --impl local --mbs 2
    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bare_mcore.py \
        --spec experiments/h200_2gpu.toml
    python benchmarks/bare_mcore.py --spec experiments/h200_1gpu.toml --layers 1 --seq 256 --cpu-check

``--profile N --profile-dir DIR``: after the timed steps, N more steps run under torch.profiler (not timed:
the profiler's own cost stays out of the figures above), and DIR gets their Chrome trace
(``trace-bare.json.gz``, each step a ``bare.step N`` range) and the table of their ops by self CPU time
(``ops-bare.txt``), made with the settings of mcx's ``mcx run --profile`` (``mcx/train/profiler.py``: CPU and
CUDA activities, stacks on, shapes off, ``key_averages`` sorted by ``self_cpu_time_total``, 40 rows), so
the two loops' tables read side by side (``throughput.py --profile``).

``--cpu-check`` needs no GPU: it builds the model on CPU (gloo, world size 1), checks the SDPA core
attention against an explicit softmax(QK^T)V with the causal mask and repeated key/value heads,
checks the parameter count against ``mcx.plan.params``, and runs one forward and backward pass.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import sys
import time
import types
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

with warnings.catch_warnings():  # Megatron-Core warns at import about optional packages (apex, ...)
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.module import Float16Module, MegatronModule
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.utils import divide

from mcx.errors import McxError
from mcx.plan.gpus import gpu_from_name, mfu_peak_flops
from mcx.plan.layout_rules import Layout
from mcx.plan.params import count_params, padded_vocab_size
from mcx.spec import ExperimentSpec
from throughput import FP8, IMPLS, load_benchmark_spec, score, spec_overrides  # the benchmark's definition

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8-hybrid": torch.bfloat16, "fp8-e4m3": torch.bfloat16}
# What Megatron-LM sets for --deterministic-mode runs; read when CUDA, cuBLAS and NCCL start.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
DATA_SEED = 1234


# -- the model (Megatron-Core) ----------------------------------------------------------------------

class SDPACoreAttention(MegatronModule):
    """Causal core attention on ``torch.nn.functional.scaled_dot_product_attention``.

    A drop-in for the local spec's ``DotProductAttention`` (same constructor and ``forward``
    contract in MCore 0.19.2): query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` (this
    rank's heads) in, context ``[sq, b, np * hn]`` out. SDPA wants ``[b, heads, s, hn]``; grouped
    query heads go in as they are (``enable_gqa``), without repeating key/value heads.
    """

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: ProcessGroupCollection | None = None) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism needs Transformer Engine's attention (--impl te)")
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPACoreAttention is causal self-attention only, got {attn_mask_type}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPACoreAttention takes neither packed sequences nor an attention bias")
        sq, b, heads, hn = query.shape
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
        # Megatron's masks are True where attention is forbidden; None means plain causal.
        mask = None if attention_mask is None else ~attention_mask
        dropout = self.dropout if self.training else 0.0
        # Dropout draws from MCore's tensor-parallel RNG stream (as DotProductAttention does).
        rng = tensor_parallel.get_cuda_rng_tracker().fork() if dropout > 0 and query.is_cuda else nullcontext()
        with rng:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None,
                                                 scale=self.scale, enable_gqa=self.groups != self.heads)
        return out.permute(2, 0, 1, 3).reshape(sq, b, heads * hn)  # [b, h, s, d] -> [s, b, h * d]


def transformer_config(spec: ExperimentSpec, layout: Layout, *, te: bool, cpu: bool = False) -> TransformerConfig:
    """Megatron-LM's TransformerConfig for the spec's model (its defaults where the spec is silent)."""
    m, t = spec.model, spec.train
    dtype = DTYPES[t.precision]
    fp8 = t.precision.startswith("fp8")
    recompute = None if t.recompute_granularity == "none" else t.recompute_granularity
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="full scope is deprecated")  # MCore's own default
        return TransformerConfig(
            num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
            num_query_groups=m.num_query_groups, ffn_hidden_size=m.ffn_hidden_size, kv_channels=m.kv_channels,
            normalization=m.normalization, layernorm_epsilon=m.norm_epsilon,
            gated_linear_unit=m.swiglu, activation_func=F.silu if m.swiglu else F.gelu,
            add_bias_linear=m.add_bias_linear, add_qkv_bias=m.add_qkv_bias,
            hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout, init_method_std=m.init_method_std,
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            context_parallel_size=layout.cp, sequence_parallel=layout.sequence_parallel,
            bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype, pipeline_dtype=dtype,
            fp8=t.precision.removeprefix("fp8-") if fp8 else None, fp8_recipe=t.fp8_recipe,
            fp8_amax_history_len=t.fp8_amax_history_len, fp8_amax_compute_algo=t.fp8_amax_compute_algo,
            # Megatron-LM's fusion defaults; the torch.compile'd ones are CUDA paths (off for the CPU check).
            bias_activation_fusion=m.swiglu and not cpu, bias_dropout_fusion=not cpu,
            masked_softmax_fusion=False, apply_rope_fusion=te, persist_layer_norm=False,
            # apex's fused wgrad kernel (Megatron-LM turns the flag off without it).
            gradient_accumulation_fusion=not cpu and _have_apex_wgrad(),
            cross_entropy_loss_fusion=False,
            recompute_granularity=recompute,
            recompute_method=t.recompute_method if recompute == "full" else None,
            recompute_num_layers=t.recompute_num_layers if recompute == "full" else None,
            deterministic_mode=t.deterministic, use_cpu_initialization=cpu,
        )


def _have_apex_wgrad() -> bool:
    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def layer_spec(spec: ExperimentSpec, te: bool) -> ModuleSpec:
    if te:
        return get_gpt_layer_with_transformer_engine_spec()
    local = get_gpt_layer_local_spec(normalization=spec.model.normalization)
    local.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return local


def gpt_model(spec: ExperimentSpec, config: TransformerConfig, te: bool, padded_vocab: int) -> GPTModel:
    m = spec.model
    return GPTModel(
        config=config, transformer_layer_spec=layer_spec(spec, te), vocab_size=padded_vocab,
        max_sequence_length=m.max_position_embeddings or m.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True, share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type, rotary_percent=m.rotary_percent, rotary_base=m.rotary_base,
    )


def compile_lever(model: torch.nn.Module, what: str) -> None:
    """``--compile``: torch.compile MCore's unfused RoPE, or each whole transformer layer."""
    if what == "rope":
        from megatron.core.models.common.embeddings import rope_utils

        rope_utils._apply_rotary_pos_emb_bshd = torch.compile(rope_utils._apply_rotary_pos_emb_bshd)
    elif what == "layers":
        torch._dynamo.config.recompile_limit = 64  # a compile per distinct layer at most
        for layer in model.decoder.layers:
            layer.compile()


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """pretrain_gpt.py's loss: (masked token loss sum, token count, report); the schedule divides."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.cat([loss.detach().view(1), tokens.view(1).float()])}


# -- the training loop (CUDA) ---------------------------------------------------------------------

def _init_distributed(layout: Layout, cuda: bool) -> tuple[int, int]:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != layout.world_size:
        raise SystemExit(f"bare_mcore: started {world} process(es) but the spec's layout needs {layout.world_size} "
                         f"(tp={layout.tp} pp={layout.pp} cp={layout.cp} dp={layout.dp}); "
                         f"run it with torchrun --nproc-per-node {layout.world_size}")
    backend = "nccl" if cuda else "gloo"
    kwargs = {"device_id": torch.device("cuda", torch.cuda.current_device())} if cuda else {}
    timeout = datetime.timedelta(minutes=30)
    if world == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout, **kwargs)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=layout.tp,
                                             pipeline_model_parallel_size=layout.pp,
                                             context_parallel_size=layout.cp)
    return rank, world


def _check_supported(spec: ExperimentSpec, layout: Layout) -> None:
    problems = []
    if spec.model.num_experts is not None:
        problems.append("mixture-of-experts models")
    if layout.vpp:
        problems.append("the interleaved pipeline schedule (parallel.virtual_pipeline)")
    if layout.cp > 1:
        problems.append("context parallelism")
    if problems:
        raise SystemExit(f"bare_mcore: this reference loop does not implement {', '.join(problems)}")


def _synthetic_tokens(steps: int, microbatches: int, mbs: int, seq: int, vocab: int) -> torch.Tensor:
    """[steps, microbatches, mbs, seq + 1] token ids, fixed by the seed and the data-parallel rank."""
    g = torch.Generator().manual_seed(DATA_SEED + parallel_state.get_data_parallel_rank() * 7919)
    x = torch.randint(0, vocab, (steps, microbatches, mbs, seq + 1), generator=g, dtype=torch.int64)
    return x.pin_memory() if torch.cuda.is_available() else x


def train(args: argparse.Namespace) -> dict[str, Any]:
    project = Path(args.project).resolve()
    overrides = spec_overrides(impl=args.impl, fp8=args.fp8, mbs=args.mbs, seq=args.seq, layers=args.layers,
                               gpus=args.gpus, deterministic=args.deterministic, extra=args.set)
    spec, overrides, layout, vocab = load_benchmark_spec(args.spec, overrides, impl=args.impl, fp8=args.fp8,
                                                         project=project)
    _check_supported(spec, layout)
    t, m = spec.train, spec.model
    te = args.impl == "te"
    if t.deterministic:
        os.environ.update(DETERMINISTIC_ENV)  # before CUDA, cuBLAS and NCCL start
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if t.deterministic:
        torch.use_deterministic_algorithms(True)
    rank, world = _init_distributed(layout, cuda=True)
    seed = t.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()  # Megatron's _set_random_seed
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)

    # Model: GPTModel -> Float16Module -> DDP, as Megatron-LM's get_model.
    config = transformer_config(spec, layout, te=te)
    padded = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, layout.tp)
    model = gpt_model(spec, config, te, padded)
    for p in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
    model.cuda(torch.cuda.current_device())
    compile_lever(model, args.compile)
    if config.bf16 or config.fp16:
        model = Float16Module(config, model)
    par = spec.parallel
    overlap_param_gather = par.overlap_param_gather and par.distributed_optimizer
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=not t.grad_reduce_in_bf16, overlap_grad_reduce=par.overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather, use_distributed_optimizer=par.distributed_optimizer,
        check_for_nan_in_grad=False)
    model = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2, adam_eps=t.adam_eps, clip_grad=t.clip_grad, bf16=config.bf16, fp16=config.fp16,
        params_dtype=config.params_dtype, use_distributed_optimizer=par.distributed_optimizer,
        overlap_param_gather=overlap_param_gather, fp8_recipe=t.fp8_recipe if config.fp8 else None), [model])
    # What Megatron-LM's train() sets on the config before its loop.
    config.grad_scale_func = optimizer.scale_loss
    if par.overlap_grad_reduce:
        config.no_sync_func = model.no_sync
        config.grad_sync_func = model.start_grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    if overlap_param_gather:
        model.disable_forward_pre_hook(param_sync=False)  # back on after the first step
    forward_backward = get_forward_backward_func()

    # Data: this rank's micro-batches of every step, pinned; constant mask and positions on the GPU.
    micro = t.global_batch_size // (t.micro_batch_size * layout.dp)
    seq, steps = m.seq_length, args.warmup + args.steps
    tokens = _synthetic_tokens(steps, micro, t.micro_batch_size, seq, vocab)
    loss_mask = torch.ones(t.micro_batch_size, seq, device="cuda")
    position_ids = torch.arange(seq, device="cuda").unsqueeze(0).expand(t.micro_batch_size, -1)

    def forward_step(data_iterator, model):
        x = next(data_iterator).cuda(non_blocking=True)
        output = model(x[:, :-1], position_ids, None, labels=x[:, 1:])
        return output, partial(loss_func, loss_mask)

    last_stage = parallel_state.is_pipeline_last_stage()
    hooks_on = False
    ends, own_times, losses = [], [], []
    profiler = StepsProfiled(args.profile, args.profile_dir, first=steps + 1)
    for step in range(steps + args.profile):
        if step == steps:  # the profiled steps: after the timed ones (whose data stays as it was), data of their own
            tokens = _synthetic_tokens(args.profile, micro, t.micro_batch_size, seq, vocab)
        profiler.begin(step + 1)
        start = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        batch = tokens[step if step < steps else step - steps]
        reports = forward_backward(forward_step_func=forward_step, data_iterator=iter(batch), model=[model],
                                   num_microbatches=micro, seq_length=seq, micro_batch_size=t.micro_batch_size,
                                   decoder_seq_length=seq, forward_only=False)
        ok, grad_norm, _ = optimizer.step()
        if ok and overlap_param_gather and not hooks_on:
            model.enable_forward_pre_hook()
            hooks_on = True
        # The step's loss over the global batch (summed over data-parallel ranks, as Megatron logs it).
        loss = torch.stack([r["lm loss"] for r in reports]).sum(0) if last_stage and reports else \
            torch.zeros(2, device="cuda")
        if world > 1:
            dist.all_reduce(loss)
        torch.cuda.synchronize()
        if step >= steps:  # a profiled step: not timed
            profiler.end(step + 1, rank)
            continue
        ends.append(time.perf_counter())
        own_times.append(ends[-1] - start)
        loss_sum, loss_tokens = loss.tolist()
        losses.append(loss_sum / max(loss_tokens, 1.0))
        if rank == 0:
            sys.stderr.write(f"bare_mcore step {step + 1}/{steps}{' (warm-up)' if step < args.warmup else ''}: "
                             f"{own_times[-1]:.3f} s, loss {losses[-1]:.4f}, grad norm {grad_norm}\n")
    # Timed: the wall time from the end of one step to the end of the next, for the steps after the
    # warm-up (everything the loop does between them is included).
    step_times = [ends[i] - ends[i - 1] for i in range(args.warmup, steps)]

    name = torch.cuda.get_device_name()
    gpu = gpu_from_name(name)
    peak = mfu_peak_flops(gpu) if gpu else None
    mem = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]
    mem_max = torch.tensor(mem, device="cuda")
    if world > 1:
        dist.all_reduce(mem_max, op=dist.ReduceOp.MAX)
    result = {
        "runner": "bare_mcore", "spec": args.spec, "overrides": overrides,
        "layer_spec": IMPLS[args.impl], "core_attention": "TEDotProductAttention" if te else "torch_sdpa",
        "precision": t.precision, "deterministic": t.deterministic,
        "layout": layout.job_dict(), "world_size": world, "micro_batch_size": t.micro_batch_size,
        "global_batch_size": t.global_batch_size, "num_microbatches": micro, "seq_length": seq,
        "vocab_size": vocab, "padded_vocab_size": padded, "warmup_steps": args.warmup,
        **score(spec, world, padded, step_times, peak),
        "step_times_s": step_times, "self_timed_step_times_s": own_times[args.warmup:],
        "loss_first": losses[0], "loss_last": losses[-1],
        # Rank 0's, as mcx's metrics record it; and the largest over ranks.
        "mem_peak_bytes": mem[0], "mem_reserved_peak_bytes": mem[1],
        "mem_peak_bytes_max_rank": int(mem_max[0].item()), "mem_reserved_peak_bytes_max_rank": int(mem_max[1].item()),
        "gpu_name": name, "gpu": gpu, "peak_flops": peak,
        "gradient_accumulation_fusion": config.gradient_accumulation_fusion, "compile": args.compile,
        "versions": _versions(), "profile": profiler.written,
    }
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return result if rank == 0 else {}


class StepsProfiled:
    """torch.profiler over steps ``first`` to ``first + count - 1`` (1-based), as mcx's StepProfiler runs it."""

    def __init__(self, count: int, out_dir: str | None, *, first: int) -> None:
        self.count, self.first = count, first
        self.out_dir = Path(out_dir) if out_dir else None
        self.prof: Any = None
        self.range: Any = None
        self.written: dict[str, str] | None = None

    def begin(self, step: int) -> None:
        if not self.count or step < self.first:
            return
        if self.prof is None:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA],
                                               record_shapes=False, with_stack=True)
            self.prof.start()
            self.wall = time.perf_counter()
        self.range = torch.profiler.record_function(f"bare.step {step}")
        self.range.__enter__()

    def end(self, step: int, rank: int) -> None:
        if self.range is None:
            return
        self.range.__exit__(None, None, None)
        self.range = None
        if step < self.first + self.count - 1:
            return
        self.prof.stop()
        wall = time.perf_counter() - self.wall
        if rank != 0 or self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace, ops = self.out_dir / "trace-bare.json.gz", self.out_dir / "ops-bare.txt"
        self.prof.export_chrome_trace(str(trace))
        head = (f"# bare_mcore, rank 0, cuda: steps {self.first}-{step} ({self.count} profiled, {wall:.3f} s wall with "
                f"the profiler on)\n# ops by self CPU time (torch.profiler key_averages, sorted by self_cpu_time_total);"
                f" the trace: {trace.name}\n")
        ops.write_text(head + self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n",
                       encoding="utf-8")
        self.written = {"trace": str(trace), "ops": str(ops)}


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for dist_name in ("megatron-core", "transformer-engine", "transformer-engine-cu13"):
        try:
            out[dist_name] = version(dist_name)
        except PackageNotFoundError:
            out[dist_name] = None
    return out


# -- the CPU check ----------------------------------------------------------------------------------

def _rope_get_emb_on_cpu(self: RotaryEmbedding, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """RotaryEmbedding.get_emb minus its unconditional move to CUDA (CPU check only)."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :]


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + causal mask) v with repeated key/value heads, [s, b, h, d] -> [s, b, h*d]."""
    sq, b, heads, hn = q.shape
    rep = heads // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q.float(), k.float()) * scale
    scores = scores.masked_fill(torch.ones(sq, sq, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v.float())
    return out.reshape(sq, b, heads * hn)


def cpu_check(args: argparse.Namespace) -> dict[str, Any]:
    """Model construction and one forward/backward pass on CPU (no DDP, optimizer or CUDA)."""
    project = Path(args.project).resolve()
    overrides = spec_overrides(impl=args.impl, fp8=args.fp8, mbs=args.mbs, seq=args.seq, layers=args.layers,
                               gpus=args.gpus, deterministic=args.deterministic, extra=args.set)
    spec, overrides, layout, vocab = load_benchmark_spec(args.spec, overrides, impl=args.impl, fp8=args.fp8,
                                                         project=project)
    if args.impl == "te":
        raise SystemExit("bare_mcore --cpu-check: Transformer Engine needs a GPU; check with --impl local")
    if layout.world_size != 1:
        overrides = [*overrides, "hardware.nodes=1", "hardware.gpus_per_node=1"]
        spec, overrides, layout, vocab = load_benchmark_spec(args.spec, overrides, impl=args.impl, fp8=args.fp8,
                                                             project=project)
    _check_supported(spec, layout)
    os.environ.pop("RANK", None)
    os.environ["WORLD_SIZE"] = "1"
    _init_distributed(layout, cuda=False)
    torch.manual_seed(spec.train.seed)
    m, t = spec.model, spec.train
    try:
        config = transformer_config(spec, layout, te=False, cpu=True)
        out: dict[str, Any] = {"runner": "bare_mcore --cpu-check", "spec": args.spec, "overrides": overrides}

        # 1. The core attention against the explicit formula (fp32, grouped heads, causal).
        attn = SDPACoreAttention(config, 1, AttnMaskType.causal, "self")
        hn, s, b = config.kv_channels, min(m.seq_length, 64), 2
        q = torch.randn(s, b, config.num_attention_heads, hn)
        k, v = (torch.randn(s, b, config.num_query_groups, hn) for _ in range(2))
        got, want = attn(q, k, v, None), _reference_attention(q, k, v, attn.scale)
        masked = attn(q, k, v, torch.ones(s, s, dtype=torch.bool).triu(1)[None, None])
        out["attention_max_abs_err"] = float((got - want).abs().max())
        out["attention_masked_max_abs_err"] = float((masked - want).abs().max())
        assert got.shape == (s, b, config.num_attention_heads * hn), got.shape
        assert out["attention_max_abs_err"] < 1e-4 and out["attention_masked_max_abs_err"] < 1e-4, out

        # 2. The model: parameter count against mcx's planner, then one forward and backward pass.
        padded = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, layout.tp)
        model = gpt_model(spec, config, False, padded)
        for module in model.modules():
            if isinstance(module, RotaryEmbedding):
                module.get_emb = types.MethodType(_rope_get_emb_on_cpu, module)
        n_params = sum(p.numel() for p in model.parameters())
        planned = count_params(m, vocab, layout.tp).total
        out.update(parameters=n_params, parameters_planned=planned, padded_vocab_size=padded,
                   core_attention=[type(layer.self_attention.core_attention).__name__
                                   for layer in model.decoder.layers][:1],
                   param_dtype=str(next(model.parameters()).dtype))
        assert n_params == planned, (n_params, planned)
        compile_lever(model, args.compile)
        if config.bf16 or config.fp16:
            model = Float16Module(config, model)
        seq = m.seq_length
        x = _synthetic_tokens(1, 1, t.micro_batch_size, seq, vocab)[0, 0]
        position_ids = torch.arange(seq).unsqueeze(0).expand(t.micro_batch_size, -1)
        start = time.perf_counter()
        per_token = model(x[:, :-1], position_ids, None, labels=x[:, 1:])
        loss, tokens, _ = loss_func(torch.ones(t.micro_batch_size, seq), per_token)
        (loss / tokens).backward()
        out.update(loss=float(loss.detach() / tokens), log_padded_vocab=math.log(padded),
                   loss_shape=list(per_token.shape), forward_backward_s=time.perf_counter() - start)
        no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()
                   or not p.grad.abs().sum() > 0]
        out["params_without_finite_nonzero_grad"] = no_grad
        assert per_token.shape == (t.micro_batch_size, seq), per_token.shape
        assert math.isfinite(out["loss"]) and not no_grad, out
        out["ok"] = True
        return out
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


# -- command line -----------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Bare Megatron-Core training loop on an mcx spec: tokens/s, TFLOP/s, "
                                "MFU and peak memory per GPU (the reference for benchmarks/throughput.py).")
    p.add_argument("--spec", default="experiments/h200_1gpu.toml", help="mcx spec (TOML)")
    p.add_argument("--impl", choices=sorted(IMPLS), default="local",
                   help="layer spec: MCore local + torch SDPA core attention, or Transformer Engine")
    p.add_argument("--fp8", choices=["none", *FP8], default=None,
                   help="FP8 with Transformer Engine (delayed scaling); none: bf16; default: the spec's precision")
    p.add_argument("--mbs", type=int, help="micro batch size (default: the spec's)")
    p.add_argument("--seq", type=int, help="sequence length (default: the spec's)")
    p.add_argument("--layers", type=int, help="number of layers (default: the spec's)")
    p.add_argument("--gpus", type=int, help="GPUs on the node (default: the spec's hardware.gpus_per_node)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other spec override")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed optimizer steps first")
    p.add_argument("--deterministic", action="store_true", help="Megatron's deterministic mode (train.deterministic)")
    p.add_argument("--compile", choices=["none", "rope", "layers"], default="none",
                   help="torch.compile MCore's unfused RoPE, or every transformer layer (a lever under measurement)")
    p.add_argument("--project", default=".", help="project root (data paths in the spec are relative to it)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--cpu-check", action="store_true", help="check model construction on CPU instead of training")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, N more under torch.profiler (trace and op table in --profile-dir)")
    p.add_argument("--profile-dir", help="where --profile writes trace-bare.json.gz and ops-bare.txt")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("bare_mcore: --steps and --warmup must be >= 1 (a timed step starts where the previous ended)")
    if args.cpu_check:
        result = cpu_check(args)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bare_mcore: no CUDA device; use --cpu-check to check the model on CPU")
        result = train(args)
    if result:
        line = json.dumps(result, sort_keys=True)
        print(line, flush=True)
        if args.out:
            Path(args.out).write_text(line + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except McxError as exc:  # a bad spec or override: the message names the key and the fix
        raise SystemExit(f"bare_mcore: {exc}") from None
