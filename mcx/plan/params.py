"""Parameter counts of a Megatron-Core GPTModel, in total and as held by one GPU.

Parameters fall into three kinds by how a GPU holds them (as Megatron's own
``theoretical_memory_usage.py`` splits them): tensor-parallel shards (linear layers, the
vocab-parallel embedding and output layer), replicated (norms, router, row-parallel biases) and
routed experts (sharded over expert-tensor x expert parallel; expert tensor parallel = TP here).
"""

from __future__ import annotations

import math

from attrs import frozen

from mcx.errors import SpecError
from mcx.spec.schema import ExperimentSpec, ModelSpec


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by x TP``."""
    multiple = divisible_by * tp
    return math.ceil(vocab_size / multiple) * multiple


def effective_vocab_size(spec: ExperimentSpec) -> int | None:
    """``model.vocab_size``, else what the tokenizer section fixes (None: only the tokenizer file knows)."""
    if spec.model.vocab_size is not None:
        return spec.model.vocab_size
    tok = spec.data.tokenizer
    if tok.kind == "bpe":
        return tok.vocab_size
    if tok.kind == "gpt2":
        return 50257
    return None


def require_vocab_size(spec: ExperimentSpec, vocab_size: int | None = None) -> int:
    """The vocabulary size to plan with: ``vocab_size`` (read from the tokenizer by the caller), else
    :func:`effective_vocab_size`; never a guess."""
    vocab = vocab_size or effective_vocab_size(spec)
    if vocab is None:
        tok = spec.data.tokenizer
        where = f"data.tokenizer.path = {tok.path!r}" if tok.path else "data.tokenizer.path (unset)"
        raise SpecError([("model.vocab_size", f"unset, and the vocabulary of data.tokenizer.kind = \"{tok.kind}\" is "
                          f"read from the prepared dataset or {where}, neither readable on this machine; set "
                          "model.vocab_size to the tokenizer's size (Megatron pads it further), or plan where the "
                          "tokenizer is")])
    return vocab


@frozen(kw_only=True)
class Shapes:
    """Derived per-layer sizes (Megatron's names: kv_channels, query/kv projection sizes)."""

    hidden: int
    heads: int
    groups: int
    kv_channels: int
    query_proj: int  # kv_channels x heads
    kv_proj: int  # kv_channels x groups (each of K and V)
    ffn: int
    fc1_out: int  # 2 x ffn with SwiGLU (gate and up stacked), else ffn
    num_experts: int | None
    topk: int
    moe_ffn: int
    moe_fc1_out: int

    @classmethod
    def of(cls, m: ModelSpec) -> Shapes:
        kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
        groups = m.num_query_groups or m.num_attention_heads
        ffn = m.ffn_hidden_size or 4 * m.hidden_size
        moe_ffn = m.moe_ffn_hidden_size or ffn
        glu = 2 if m.swiglu else 1
        return cls(hidden=m.hidden_size, heads=m.num_attention_heads, groups=groups, kv_channels=kv_channels,
                   query_proj=kv_channels * m.num_attention_heads, kv_proj=kv_channels * groups, ffn=ffn,
                   fc1_out=glu * ffn, num_experts=m.num_experts, topk=m.moe_router_topk if m.num_experts else 0,
                   moe_ffn=moe_ffn, moe_fc1_out=glu * moe_ffn)


@frozen(kw_only=True)
class LayerParams:
    tp_sharded: int
    replicated: int
    experts: int  # routed experts of the whole layer (all experts)
    active_experts: int  # the top-k experts one token passes through

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.experts


def layer_params(m: ModelSpec) -> LayerParams:
    s = Shapes.of(m)
    h = s.hidden
    norm = h if m.normalization == "RMSNorm" else 2 * h
    bias = m.add_bias_linear
    qkv = h * (s.query_proj + 2 * s.kv_proj) + ((s.query_proj + 2 * s.kv_proj) if (bias or m.add_qkv_bias) else 0)
    proj = s.query_proj * h
    replicated = 2 * norm + (h if bias else 0)  # row-parallel bias is replicated
    if s.num_experts:
        one_expert = h * s.moe_fc1_out + s.moe_ffn * h + ((s.moe_fc1_out + h) if bias else 0)
        router = h * s.num_experts
        return LayerParams(tp_sharded=qkv + proj, replicated=replicated + router,
                           experts=s.num_experts * one_expert, active_experts=s.topk * one_expert)
    mlp = h * s.fc1_out + s.ffn * h + (s.fc1_out if bias else 0)
    return LayerParams(tp_sharded=qkv + proj + mlp, replicated=replicated + (h if bias else 0),
                       experts=0, active_experts=0)


@frozen(kw_only=True)
class ParamCounts:
    total: int
    active: int  # per token (MoE: top-k experts); = total for a dense model
    embedding: int  # word embedding (padded vocab) + learned positions
    output_layer: int  # 0 when tied to the embedding
    per_layer: LayerParams
    final_norm: int
    padded_vocab: int


def count_params(m: ModelSpec, vocab_size: int, tp: int = 1) -> ParamCounts:
    pv = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp)
    h = m.hidden_size
    word = pv * h
    positions = (m.max_position_embeddings or m.seq_length) * h if m.position_embedding_type == "learned_absolute" else 0
    output = word if m.untie_embeddings_and_output_weights else 0
    per_layer = layer_params(m)
    final_norm = h if m.normalization == "RMSNorm" else 2 * h
    total = word + positions + output + m.num_layers * per_layer.total + final_norm
    active = total - m.num_layers * (per_layer.experts - per_layer.active_experts)
    return ParamCounts(total=total, active=active, embedding=word + positions, output_layer=output,
                       per_layer=per_layer, final_norm=final_norm, padded_vocab=pv)


@frozen(kw_only=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by how they are sharded."""

    dense: int  # TP shards + replicated params (optimizer sharded over DP x CP)
    experts: int  # this GPU's routed-expert params (optimizer sharded over expert DP)

    @property
    def total(self) -> int:
        return self.dense + self.experts


def stage_params(counts: ParamCounts, m: ModelSpec, *, tp: int, pp: int, ep: int, first: bool, last: bool) -> StageParams:
    """Params on one GPU of the first and/or last pipeline stage (both for pp = 1)."""
    layers = m.num_layers // pp
    lp = counts.per_layer
    word = counts.padded_vocab * m.hidden_size
    dense = layers * (lp.tp_sharded // tp + lp.replicated)
    if first:
        dense += word // tp + (counts.embedding - word)
    if last:
        # Tied embeddings with pp > 1: the last stage keeps its own copy of the word embedding.
        dense += word // tp if (counts.output_layer or not first) else 0
        dense += counts.final_norm
    experts = layers * lp.experts // (ep * tp)
    return StageParams(dense=dense, experts=experts)
