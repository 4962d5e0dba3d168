"""Core attention on torch's scaled_dot_product_attention, for Megatron-Core's local layer spec.

MCore's own local ``DotProductAttention`` materialises the [b, np, sq, sk] score matrix
(baddbmm + softmax + bmm) and measured 2-4x slower than this module on an H200 (docs/gpu.md,
"Reference figures"). This module keeps MCore's core-attention contract exactly (constructor
and ``forward`` signature of ``megatron.core.transformer.dot_product_attention.DotProductAttention``
in 0.19.2; tensors in Megatron's [s, b, heads, head_dim] layout, output [s, b, heads * head_dim])
and lets torch pick the fused kernel (flash / cuDNN / memory-efficient on CUDA, the C++ math
kernel on CPU). Grouped-query attention uses SDPA's ``enable_gqa`` instead of materialising
repeated key/value heads.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Causal self-attention core: softmax(q k^T * scale + causal mask) v via torch SDPA."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism needs Transformer Engine's attention; "
                             "set model.transformer_impl = \"transformer_engine\" or parallel.context = 1")
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"SDPAttention implements causal attention only, got {attn_mask_type}")
        if config.softmax_type != "vanilla":
            raise ValueError(f"SDPAttention implements the vanilla softmax only, got {config.softmax_type!r}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.heads = divide(config.num_attention_heads, tp_size)
        self.groups = divide(config.num_query_groups, tp_size)
        head_dim = config.kv_channels
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """query [sq, b, np, hn], key/value [sk, b, ng, hn] -> context [sq, b, np * hn]."""
        if packed_seq_params is not None:
            raise ValueError("packed sequences need Transformer Engine's attention")
        if attention_bias is not None:
            raise ValueError("attention bias is not supported by SDPAttention")
        sq, b, np_, hn = query.shape
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)
        if attention_mask is None:
            mask, causal = None, True
        else:
            # Megatron's masks are True where attention is *forbidden* (and already causal).
            mask, causal = ~attention_mask, False
        p = self.dropout_p if self.training else 0.0
        # Dropout inside attention must differ across tensor-parallel ranks: MCore draws it from the
        # tensor-parallel RNG stream (CUDA only; on CPU there is one rank and the default stream).
        fork = p > 0.0 and query.is_cuda and not self.config.sequence_parallel
        with tensor_parallel.get_cuda_rng_tracker().fork() if fork else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                scale=self.softmax_scale, enable_gqa=self.groups != np_,
            )
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)
