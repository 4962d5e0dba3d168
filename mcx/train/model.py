"""Megatron-Core GPTModel from an mcx spec: LLaMA-style dense or Mixtral-style mixture of experts.

One function per decision, each a literal mapping from spec keys to MCore arguments, so the mapping
can be read top to bottom against Megatron-LM's flags (docs/spec.md lists them):

* ``choose_layer_spec``: Transformer Engine's layer spec or MCore's local spec (with the core
  attention on torch SDPA, see attention.py). The choice changes numerics and speed, so it is
  recorded in result.json as ``layer_spec``.
* ``transformer_config``: the TransformerConfig (shapes, norms, activation, init, dropout, MoE,
  precision, FP8, recompute, parallel degrees).
* ``gpt_layer_spec`` and ``build_model_chunk``: the layer spec and one GPTModel (one virtual
  pipeline chunk).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from megatron.core.extensions.transformer_engine import HAVE_TE
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from mcx.errors import EnvironmentProblem, SpecError
from mcx.plan import fusions
from mcx.plan.params import padded_vocab_size
from mcx.spec.schema import ExperimentSpec
from mcx.train import wgrad
from mcx.train.attention import SDPAttention
from mcx.plan.layout import Layout

LayerSpecName = Literal["local", "transformer_engine"]

_PARAMS_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                 "fp8-hybrid": torch.bfloat16, "fp8-e4m3": torch.bfloat16}
_FP8_FORMAT = {"fp8-hybrid": "hybrid", "fp8-e4m3": "e4m3"}
_ROPE_COMPILED = False  # compiled_rope() patched MCore's RoPE in this process


def te_available() -> bool:
    """Whether Megatron-Core found a working Transformer Engine (its own import check)."""
    return bool(HAVE_TE)


def choose_layer_spec(spec: ExperimentSpec, layout: Layout, device: str) -> LayerSpecName:
    """``auto`` -> Transformer Engine when it is importable on a GPU, else the local spec.

    Features only Transformer Engine implements (FP8, context parallelism, sequence parallelism with
    MCore's torch norms) are errors on the local spec, named by key, rather than silent downgrades.
    """
    impl = spec.model.transformer_impl
    if impl == "transformer_engine" and (device != "cuda" or not te_available()):
        where = "on CPU" if device != "cuda" else "in this environment (transformer_engine is not importable)"
        raise EnvironmentProblem(f"model.transformer_impl = \"transformer_engine\" cannot run {where};",
                                 "install Transformer Engine on the GPU machine, or set model.transformer_impl = \"local\".")
    chosen: LayerSpecName = "transformer_engine" if impl == "transformer_engine" or (
        impl == "auto" and device == "cuda" and te_available()) else "local"
    if chosen == "local":
        problems = []
        if spec.train.precision.startswith("fp8"):
            problems.append(("train.precision", f"\"{spec.train.precision}\" needs Transformer Engine; use \"bf16\" "
                             "or run where transformer_engine is installed"))
        if layout.cp > 1:
            problems.append(("parallel.context", f"{layout.cp} needs Transformer Engine's attention; use 1"))
        if layout.sequence_parallel:
            problems.append(("parallel.sequence_parallel", "needs Transformer Engine's norms; set it to false"))
        if spec.train.te_op_fuser:
            problems.append(("train.te_op_fuser", "needs Transformer Engine; set it to false "
                             "or run where transformer_engine is installed"))
        if problems:
            raise SpecError(problems)
    return chosen


def transformer_config(spec: ExperimentSpec, layout: Layout, device: str, layer_spec: LayerSpecName) -> TransformerConfig:
    m, t = spec.model, spec.train
    cpu = device != "cuda"
    te = layer_spec == "transformer_engine"
    dtype = _PARAMS_DTYPE[t.precision]
    moe = m.num_experts is not None
    recompute = None if t.recompute_granularity == "none" else t.recompute_granularity
    with warnings.catch_warnings():
        # MCore 0.19.2 warns about its own default cuda_graph_modules; nothing mcx sets.
        warnings.filterwarnings("ignore", message="full scope is deprecated")
        return _config(spec, layout, cpu=cpu, te=te, dtype=dtype, moe=moe, recompute=recompute, device=device)


def _config(spec: ExperimentSpec, layout: Layout, *, cpu: bool, te: bool, dtype, moe: bool, recompute, device: str):
    m, t = spec.model, spec.train
    return TransformerConfig(
        # Shapes.
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        ffn_hidden_size=m.ffn_hidden_size,
        kv_channels=m.kv_channels,
        # LLaMA block: pre-norm, RMSNorm, SwiGLU (gated linear unit + SiLU), no biases.
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=m.swiglu,
        activation_func=F.silu if m.swiglu else F.gelu,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        init_method_std=m.init_method_std,
        attention_softmax_in_fp32=True,
        # Parallelism.
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.virtual_stages,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        sequence_parallel=layout.sequence_parallel,
        # Megatron-LM's defaults: overlapped (unbatched) p2p for the interleaved schedule only.
        overlap_p2p_comm=layout.virtual_stages is not None,
        batch_p2p_comm=layout.virtual_stages is None,
        # Precision (Megatron: params in bf16/fp16, fp32 main params in the optimizer).
        fp16=t.precision == "fp16",
        bf16=t.precision not in ("fp32", "fp16"),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        fp8=_FP8_FORMAT.get(t.precision),
        fp8_recipe=t.fp8_recipe if t.precision.startswith("fp8") else "delayed",
        fp8_amax_history_len=t.fp8_amax_history_len,
        fp8_amax_compute_algo=t.fp8_amax_compute_algo,
        fp8_dot_product_attention=te and t.fp8_attention,  # the spec rule ties it to an fp8 precision
        # Fusions: Megatron's defaults on GPU; off on CPU (they are torch.compile'd CUDA paths).
        bias_activation_fusion=not cpu and m.swiglu,
        bias_dropout_fusion=not cpu,
        masked_softmax_fusion=False,  # unused by SDPA and TE attention
        apply_rope_fusion=te and t.rope_fusion,  # the local spec's RoPE: compiled_rope() below
        # Weight gradients accumulated into fp32 main_grad by the GEMM itself (apex's kernel, or
        # cuBLAS through torch when apex is absent: wgrad.py); Megatron-LM's default where it can.
        gradient_accumulation_fusion=not cpu and t.gradient_accumulation_fusion and wgrad.enable(device_of(device)) != "unavailable",
        persist_layer_norm=False,
        # Megatron-LM's native (torch.compile'd) fused cross entropy; its backward casts to bf16, and
        # Megatron-LM's deterministic mode turns it off.
        cross_entropy_loss_fusion=cross_entropy_fusion(spec, device),
        cross_entropy_fusion_impl="native",
        deterministic_mode=t.deterministic,
        # The step's forward and backward as one graph is the worker's (gpu.py, D75); the config says so for
        # what reads it (Transformer Engine's cross entropy).
        cuda_graph_impl="full_iteration" if t.cuda_graphs and not cpu else "none",
        use_cpu_initialization=cpu,
        # Activation recomputation.
        recompute_granularity=recompute,
        recompute_method=t.recompute_method if recompute == "full" else None,
        recompute_num_layers=t.recompute_num_layers if recompute == "full" else None,
        # Mixture of experts.
        num_moe_experts=m.num_experts,
        moe_router_topk=m.moe_router_topk if moe else 2,
        moe_router_load_balancing_type=m.moe_router_load_balancing_type if moe else "aux_loss",
        moe_aux_loss_coeff=m.moe_aux_loss_coeff if moe else 0.0,
        moe_ffn_hidden_size=(m.moe_ffn_hidden_size or m.ffn_hidden_size or 4 * m.hidden_size) if moe else None,
        moe_token_dispatcher_type=moe_dispatcher(spec, device) if moe else "allgather",
        moe_grouped_gemm=moe and m.moe_grouped_gemm and te,
    )


def cross_entropy_fusion(spec: ExperimentSpec, device: str) -> bool:
    """The planner's rule (mcx.plan.fusions), for this device."""
    return fusions.cross_entropy_fusion(spec.train, device == "cuda")


def device_of(device: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)


def moe_dispatcher(spec: ExperimentSpec, device: str) -> str:
    """The token dispatcher that runs. MCore's all-to-all dispatcher creates CUDA streams in its
    constructor; on CPU (one rank, expert parallel 1) the all-gather dispatcher routes the same
    tokens to the same experts."""
    if device != "cuda":
        return "allgather"
    return spec.model.moe_token_dispatcher_type


def gpt_layer_spec(spec: ExperimentSpec, layer_spec: LayerSpecName) -> ModuleSpec:
    m = spec.model
    if layer_spec == "transformer_engine":
        te_spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=m.num_experts, moe_grouped_gemm=m.moe_grouped_gemm, use_te_op_fuser=spec.train.te_op_fuser)
        if spec.train.te_op_fuser:
            from mcx.train.fused_mlp import checkpointed

            te_spec.submodules.mlp = checkpointed(te_spec.submodules.mlp)
        return te_spec
    local = get_gpt_layer_local_spec(num_experts=m.num_experts, moe_grouped_gemm=False,
                                     normalization=m.normalization)
    local.submodules.self_attention.submodules.core_attention = SDPAttention
    return local


def build_model_chunk(spec: ExperimentSpec, config: TransformerConfig, layer_spec: ModuleSpec, vocab_size: int,
                      *, pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None) -> GPTModel:
    """One GPTModel: the whole model, or one (virtual) pipeline stage of it."""
    m = spec.model
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=vocab_size,
        max_sequence_length=m.max_position_embeddings or m.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type,
        rotary_percent=m.rotary_percent,
        rotary_base=m.rotary_base,
        rope_scaling=m.rope_scaling,
        rope_scaling_factor=m.rope_scaling_factor,
        vp_stage=vp_stage,
    )


def compiled_rope(spec: ExperimentSpec, layer_spec: LayerSpecName) -> bool:
    """``train.rope_fusion`` on the local spec (GPU workers only): MCore fuses RoPE with Transformer
    Engine's kernel alone, so its unfused RoPE (about ten elementwise kernels a call) is torch.compile'd
    into one, process-wide: +2.3% tokens/s on the one-H200 spec (D21)."""
    global _ROPE_COMPILED
    if layer_spec != "local" or not spec.train.rope_fusion or spec.model.position_embedding_type != "rope":
        return False
    if not _ROPE_COMPILED:
        from megatron.core.models.common.embeddings import rope_utils

        rope_utils._apply_rotary_pos_emb_bshd = torch.compile(rope_utils._apply_rotary_pos_emb_bshd)
        _ROPE_COMPILED = True
    return True


def describe(config: TransformerConfig, layer_spec: LayerSpecName, vocab_size: int) -> dict:
    """What actually ran, for result.json (some spec values are substituted per device)."""
    return {
        "layer_spec": layer_spec,
        "gradient_accumulation_fusion": wgrad.current() if config.gradient_accumulation_fusion else "off",
        "cross_entropy_fusion": bool(config.cross_entropy_loss_fusion),
        "rope_fusion": "transformer_engine" if config.apply_rope_fusion else "torch.compile" if _ROPE_COMPILED else "off",
        "core_attention": ("TEDotProductAttention" + (" (fp8)" if config.fp8_dot_product_attention else "")
                           if layer_spec == "transformer_engine" else "torch_sdpa"),
        "padded_vocab_size": vocab_size,
        "moe_token_dispatcher_type": config.moe_token_dispatcher_type if config.num_moe_experts else None,
        "moe_grouped_gemm": bool(config.moe_grouped_gemm) if config.num_moe_experts else None,
    }
