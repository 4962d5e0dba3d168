"""Training FLOPs per iteration, as Megatron-LM counts them.

The same accounting as ``num_floating_point_operations`` in Megatron-LM's
``megatron/training/training.py`` (Megatron-Core 0.19), for the models mcx builds (GPT with
MHA/GQA, dense or MoE MLPs, no MTP, no MLA), unpacked sequences (BSHD):

* every GEMM counts 2 x m x n x k FLOPs and runs 3 times (forward, data grad, weight grad);
* attention projections: Q, K and V (K and V are ``num_query_groups x kv_channels`` wide) and the
  output projection;
* core attention: ``QK^T`` and ``softmax(QK^T) V``, counted **half** for the causal mask
  (upstream: ``/ 2  # causal mask`` then ``* 2  # QK^T and (QK^T)V``);
* MLP: ``h -> ffn`` (x2 with SwiGLU: gate and up) and ``ffn -> h``; an MoE layer runs the top-k
  experts of width ``moe_ffn_hidden_size`` per token, every layer an MoE layer;
* logits: ``h x padded_vocab``.

Recomputation is not counted (Megatron reports model FLOPs, not hardware FLOPs), so MFU stays
comparable across recompute settings.
"""

from __future__ import annotations

from mcx.plan.params import Shapes
from mcx.spec.schema import ModelSpec

_FWD_BWD = 3  # forward, backward data grad, backward weight grad
_FMA = 2  # a multiply-add is two FLOPs


def flops_per_iteration(model: ModelSpec, *, padded_vocab: int, global_batch_size: int,
                        seq_length: int | None = None) -> int:
    """Model FLOPs of one optimizer step over ``global_batch_size`` sequences of ``seq_length``."""
    s = Shapes.of(model)
    seq = seq_length or model.seq_length
    h = s.hidden
    tokens = global_batch_size * seq
    layers = model.num_layers
    if s.num_experts:
        mlp = h * s.moe_ffn * s.topk * (s.moe_fc1_out // s.moe_ffn + 1)
    else:
        mlp = h * s.ffn * (s.fc1_out // s.ffn + 1)  # 3 x h x ffn with SwiGLU, 2 x with GeLU
    attn_linear = h * (s.query_proj + 2 * s.kv_proj) + s.query_proj * h
    per_token = _FWD_BWD * _FMA * (layers * (mlp + attn_linear) + h * padded_vocab)
    # Core attention per layer: sum over sequences of L^2 (batch x seq^2 unpacked) x 6 x q_proj,
    # i.e. upstream's 3 x 2 x q_proj x 1/2 (causal mask) x 2 (QK^T and (QK^T)V).
    core = global_batch_size * seq * seq * layers * _FWD_BWD * _FMA * s.query_proj
    return tokens * per_token + core


def flops_per_token(model: ModelSpec, *, padded_vocab: int, seq_length: int | None = None) -> float:
    """Model FLOPs per trained token (depends on the sequence length through attention)."""
    seq = seq_length or model.seq_length
    return flops_per_iteration(model, padded_vocab=padded_vocab, global_batch_size=1, seq_length=seq) / seq
