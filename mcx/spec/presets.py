"""Model presets as data: published shapes, in Megatron-LM's argument names.

A preset fills ``[model]`` keys the spec leaves out; keys the spec sets win. The resolved spec
(and so the run ID) holds every value, so editing a preset here changes the IDs of specs using it.
"""

from __future__ import annotations

_LLAMA3 = {
    "normalization": "RMSNorm",
    "norm_epsilon": 1e-5,
    "swiglu": True,
    "position_embedding_type": "rope",
    "rotary_base": 500000,
    "untie_embeddings_and_output_weights": True,
    "add_bias_linear": False,
    "vocab_size": 128256,
    "seq_length": 8192,
    "max_position_embeddings": 8192,
    "init_method_std": 0.02,
}
_LLAMA2 = {**_LLAMA3, "rotary_base": 10000, "vocab_size": 32000, "seq_length": 4096, "max_position_embeddings": 4096}

PRESETS: dict[str, dict] = {
    "llama3-8b": {**_LLAMA3, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_query_groups": 8, "ffn_hidden_size": 14336},
    "llama3-70b": {**_LLAMA3, "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                   "num_query_groups": 8, "ffn_hidden_size": 28672, "init_method_std": 0.008},
    "llama3.1-405b": {**_LLAMA3, "num_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
                      "num_query_groups": 8, "ffn_hidden_size": 53248, "init_method_std": 0.02,
                      "max_position_embeddings": 131072},
    "llama2-7b": {**_LLAMA2, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                  "ffn_hidden_size": 11008},
    "llama2-13b": {**_LLAMA2, "num_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
                   "ffn_hidden_size": 13824},
    "llama2-70b": {**_LLAMA2, "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                   "num_query_groups": 8, "ffn_hidden_size": 28672},
    "mixtral-8x7b": {**_LLAMA2, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_query_groups": 8, "ffn_hidden_size": 14336, "rotary_base": 1000000,
                     "max_position_embeddings": 32768, "num_experts": 8, "moe_router_topk": 2,
                     "moe_ffn_hidden_size": 14336, "moe_router_load_balancing_type": "aux_loss",
                     "moe_aux_loss_coeff": 0.01, "moe_token_dispatcher_type": "alltoall"},
}
