"""A Hugging Face model's config.json <-> the spec's [model] table, for the architectures mcx converts.

Pure (no torch): the planner reads a ``hf:`` source's shapes here before anything runs, `mcx import-hf`
writes a spec's [model] table from it, and `mcx export-hf` writes config.json from a run's spec.

LlamaForCausalLM and MistralForCausalLM are Megatron-Core's LLaMA block (RMSNorm, SwiGLU, RoPE in the
rotate-half convention, grouped-query attention, no biases); MixtralForCausalLM adds experts with top-k
softmax routing, which Megatron-Core's router computes the same way (softmax over the top-k logits equals
Mixtral's softmax over all experts renormalised over the top k). Anything that would change the function
(biases, other activations, RoPE variants Megatron-Core does not implement) is refused by key, never
approximated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import InputError
from mcx.spec.schema import ModelSpec

CONFIG = "config.json"
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral"}
# Megatron-Core's llama3 RoPE scaling has these three fixed (rotary_pos_embedding._apply_scaling); LLaMA 3.1,
# 3.2 and 3.3 use them, with factor 8 (3.1, 3.3) or 32 (3.2).
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# config.json keys that size the weights: named when absent, never filled with transformers' LLaMA 7B defaults.
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


@frozen(kw_only=True)
class HfModel:
    """What mcx reads of a config.json (``path``: the file)."""

    path: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rotary_base: int
    rope_scaling_factor: float | None  # None: no scaling; else LLaMA 3's with this factor
    tied: bool
    init_method_std: float
    sliding_window: int | None
    num_experts: int | None
    moe_router_topk: int
    moe_aux_loss_coeff: float
    dtype: str | None
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    defaulted: tuple[tuple[str, int], ...] = ()  # (key, value) config.json left out, read as transformers does


def read_config(directory: Path) -> HfModel:
    """The model ``directory/config.json`` describes; InputError naming every key mcx cannot convert."""
    path = Path(directory) / CONFIG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{directory} has no {CONFIG}, so it is not a Hugging Face model directory;",
                         "point at the directory holding config.json and the *.safetensors files.") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} cannot be read as JSON ({exc});", "restore the file from the model's source.") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path} is not a JSON object;", "restore the file from the model's source.")
    return _from_dict(raw, str(path))


def _from_dict(raw: dict[str, Any], where: str) -> HfModel:
    problems: list[str] = []
    arch = (raw.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise InputError(f"{where}: architecture {arch!r} is not one mcx converts;",
                         f"mcx reads and writes {', '.join(sorted(ARCHITECTURES))}.")
    sizes = _sizes(raw, where)
    layers, hidden, heads, ffn, vocab = (sizes[k] for k in REQUIRED)
    # absent, these are what transformers' LlamaConfig, MistralConfig and MixtralConfig make of them: a
    # key/value head per query head, hidden_size / num_attention_heads a head (the tensor check says so)
    defaulted = tuple((k, v) for k, v in (("num_key_value_heads", heads), ("head_dim", hidden // heads))
                      if raw.get(k) is None)
    groups = raw.get("num_key_value_heads") or heads
    head_dim = raw.get("head_dim") or hidden // heads
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act = {raw.get('hidden_act')!r} (mcx's LLaMA block is SwiGLU: \"silu\")")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            problems.append(f"{key} = true (mcx converts bias-free LLaMA, Mistral and Mixtral models)")
    base, factor = _rope(raw, problems)
    experts = raw.get("num_local_experts") if arch == "MixtralForCausalLM" else None
    if problems:
        raise InputError(f"{where}: mcx cannot convert this model: " + "; ".join(problems) + ";",
                         "these keys have no Megatron-Core equivalent in mcx's model (docs/huggingface.md).")
    eps = raw.get("rms_norm_eps", 1e-6)
    return HfModel(
        path=where, architecture=arch, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=int(groups), head_dim=int(head_dim), ffn_hidden_size=ffn,
        vocab_size=vocab, max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
        norm_epsilon=float(eps), rotary_base=base, rope_scaling_factor=factor,
        tied=bool(raw.get("tie_word_embeddings", False)), init_method_std=float(raw.get("initializer_range", 0.02)),
        sliding_window=raw.get("sliding_window") if isinstance(raw.get("sliding_window"), int) else None,
        num_experts=int(experts) if experts else None, moe_router_topk=int(raw.get("num_experts_per_tok", 2)),
        moe_aux_loss_coeff=float(raw.get("router_aux_loss_coef", 0.0)),
        dtype=raw.get("torch_dtype") or raw.get("dtype"), bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"), defaulted=defaulted)


def _sizes(raw: dict[str, Any], where: str) -> dict[str, int]:
    """The REQUIRED keys' values; InputError naming every one that is absent or not a positive integer
    (transformers would fill an absent one with LLaMA 7B's size, which the weights then contradict)."""
    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    bad = [f"{k} {'is missing' if k not in raw else f'= {raw[k]!r}'}" for k in REQUIRED if not positive(raw.get(k))]
    bad += [f"{k} = {raw[k]!r}" for k in ("num_key_value_heads", "head_dim") if raw.get(k) is not None
            and not positive(raw[k])]
    if bad:
        raise InputError(f"{where}: " + "; ".join(bad) + f" (mcx reads {', '.join(REQUIRED)} from config.json, "
                         "and num_key_value_heads and head_dim where given, each a positive integer);",
                         "restore config.json from the model's source: transformers' save_pretrained writes every "
                         "one of them.")
    return {k: raw[k] for k in REQUIRED}


def _rope(raw: dict[str, Any], problems: list[str]) -> tuple[int, float | None]:
    """(rotary base, LLaMA 3 scaling factor or None), from transformers 5's ``rope_parameters`` or the
    older ``rope_theta`` + ``rope_scaling``."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or params
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or float(theta) != int(theta):
        problems.append(f"rope_theta = {theta!r} (model.rotary_base is an integer)")
        theta = 10000
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind == "default":
        return int(theta), None
    if kind == "llama3" and all(float(scaling.get(k, -1)) == v for k, v in LLAMA3_ROPE.items()):
        return int(theta), float(scaling.get("factor", 8.0))
    problems.append(f"rope scaling {scaling!r} (Megatron-Core implements LLaMA 3's, with "
                    + ", ".join(f"{k} = {v:g}" for k, v in LLAMA3_ROPE.items()) + ")")
    return int(theta), None


def model_table(hf: HfModel, seq_length: int) -> dict[str, Any]:
    """The spec's [model] table for ``hf`` (every key that shapes the weights written out)."""
    table: dict[str, Any] = {
        "num_layers": hf.num_layers, "hidden_size": hf.hidden_size, "num_attention_heads": hf.num_attention_heads,
        "num_query_groups": hf.num_query_groups, "ffn_hidden_size": hf.ffn_hidden_size,
        "kv_channels": hf.head_dim, "vocab_size": hf.vocab_size, "seq_length": seq_length,
        "max_position_embeddings": hf.max_position_embeddings, "normalization": "RMSNorm",
        "norm_epsilon": hf.norm_epsilon, "swiglu": True, "position_embedding_type": "rope",
        "rotary_base": hf.rotary_base, "untie_embeddings_and_output_weights": not hf.tied,
        "add_bias_linear": False, "add_qkv_bias": False, "init_method_std": hf.init_method_std,
    }
    if hf.rope_scaling_factor is not None:
        table |= {"rope_scaling": True, "rope_scaling_factor": hf.rope_scaling_factor}
    if hf.num_experts:
        table |= {"num_experts": hf.num_experts, "moe_router_topk": hf.moe_router_topk,
                  "moe_ffn_hidden_size": hf.ffn_hidden_size, "moe_aux_loss_coeff": hf.moe_aux_loss_coeff,
                  "moe_router_load_balancing_type": "aux_loss"}
    return table


def as_model_spec(hf: HfModel, seq_length: int) -> ModelSpec:
    return ModelSpec(**model_table(hf, seq_length))


def export_problems(model: ModelSpec) -> list[tuple[str, str]]:
    """(key, problem) for every [model] value a Hugging Face LLaMA/Mixtral config cannot express."""
    wanted = {"normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope", "rotary_percent": 1.0,
              "add_bias_linear": False, "add_qkv_bias": False}
    return [(f"model.{k}", f"{getattr(model, k)!r}: LlamaForCausalLM and MixtralForCausalLM need {v!r}")
            for k, v in wanted.items() if getattr(model, k) != v]


def config_json(model: ModelSpec, vocab_size: int, dtype: str, special: dict[str, int | None]) -> dict[str, Any]:
    """config.json for a run's model: LlamaForCausalLM, or MixtralForCausalLM when it has experts.
    ``vocab_size``: the true vocabulary (Megatron's padding rows are cut); ``special``: bos/eos/pad ids.
    RoPE is written the way transformers 4 and 5 and vLLM all read it (rope_theta, rope_scaling)."""
    heads = model.num_attention_heads
    head_dim = model.kv_channels or model.hidden_size // heads
    moe = model.num_experts is not None
    out: dict[str, Any] = {
        "architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
        "model_type": "mixtral" if moe else "llama",
        "vocab_size": vocab_size, "hidden_size": model.hidden_size,
        "intermediate_size": (model.moe_ffn_hidden_size or model.ffn_hidden_size) if moe else model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers, "num_attention_heads": heads,
        "num_key_value_heads": model.num_query_groups or heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": model.max_position_embeddings or model.seq_length,
        "rms_norm_eps": model.norm_epsilon, "rope_theta": float(model.rotary_base),
        "rope_scaling": ({"rope_type": "llama3", "factor": model.rope_scaling_factor, **LLAMA3_ROPE}
                         if model.rope_scaling else None),
        "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
        "initializer_range": model.init_method_std, "attention_dropout": 0.0, "torch_dtype": dtype,
        "bos_token_id": special.get("bos"), "eos_token_id": special.get("eos"), "pad_token_id": special.get("pad"),
        "use_cache": True,
    }
    if moe:
        out |= {"num_local_experts": model.num_experts, "num_experts_per_tok": model.moe_router_topk,
                "router_aux_loss_coef": model.moe_aux_loss_coeff, "sliding_window": None, "output_router_logits": False}
    else:
        out |= {"attention_bias": False, "mlp_bias": False}
    return out
