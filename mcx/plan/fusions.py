"""Which of Megatron's optional fused kernels run, from the spec and the device; the CUDA graphs' warm-up.

Pure (no torch): the planner's memory model and the worker's TransformerConfig read the same rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcx.spec.schema import TrainSpec

BF16_PARAMS = ("bf16", "fp8-hybrid", "fp8-e4m3")  # precisions whose parameters (and logits) are bf16
# train.cuda_graphs (D75): the worker's eager steps before the one it captures (Megatron-LM's
# --cuda-graph-warmup-steps default); `mcx tune` leaves them and the capture out of a trial's figures.
GRAPH_WARMUP_STEPS = 3


def unmeasured_steps(train: TrainSpec) -> int:
    """Steps a short measurement leaves out before its own warm-up step: the graphs' eager steps and capture."""
    return GRAPH_WARMUP_STEPS + 1 if train.cuda_graphs else 0


def cross_entropy_fusion(train: TrainSpec, on_gpu: bool) -> bool:
    """``train.cross_entropy_fusion`` where it applies: Megatron's native fused cross entropy runs on
    GPUs only (it is torch.compile'd), its backward casts the logits' gradient to bf16 (so bf16
    parameters only), and Megatron-LM's deterministic mode turns it off."""
    return on_gpu and train.cross_entropy_fusion and not train.deterministic and train.precision in BF16_PARAMS
