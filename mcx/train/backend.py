"""What the training loop needs from a backend (cpu.py, gpu.py), and the pieces both share.

Shared on purpose, so the two backends cannot drift apart:

* the learning-rate / weight-decay schedule: Megatron-Core's ``OptimizerParamScheduler`` (pure
  Python over ``optimizer.param_groups``), stepped once per iteration;
* the loss: Megatron's ``loss_func`` of pretrain_gpt.py (masked token sum and token count per
  micro-batch; the schedule divides by tokens and by the number of micro-batches);
* the reported loss: sum of losses over the global batch / number of loss tokens (all DP ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import torch
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from mcx.errors import SpecError
from mcx.spec.schema import ExperimentSpec
from mcx.contract.job import InitFrom
from mcx.train.routing import Routing


class Batch(TypedDict):
    """One micro-batch (datasets.iterate_batches), each tensor [micro_batch_size, seq_length]."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None  # None: causal, the attention kernel masks


# WSD: the spec has no keys for the annealing phase yet; Megatron-LM's --lr-wsd-decay-style default
# ("exponential") over the last tenth of the decay iterations.
WSD_DECAY_FRACTION = 0.1
WSD_DECAY_STYLE = "exponential"


@dataclass
class StepOutput:
    loss: float  # mean LM loss per token over the global batch
    grad_norm: float | None  # before clipping, as Megatron reports it (None: update skipped)
    lr: float  # the learning rate this step applied
    tokens: int  # loss tokens in the global batch
    skipped: bool = False  # fp16 loss scaling found inf/nan gradients and skipped the update
    routing: Routing | None = None  # a mixture of experts' routing this step (mcx.train.routing)


class Backend(Protocol):
    """One model replica (or model-parallel shard) with its optimizer and schedule."""

    device: str  # "cpu" | "cuda"
    layer_spec: str  # "local" | "transformer_engine"
    details: dict[str, Any]  # what ran (for result.json)
    model: Any  # the model: a module (CPU) or a list of wrapped chunks (GPU); hooks reach it (mcx.train.trace)
    optimizer: Any  # its optimizer (torch's on CPU, Megatron-Core's on the GPU)

    def train_step(self, microbatches: list[Batch]) -> StepOutput: ...
    def evaluate(self, microbatches: list[Batch]) -> tuple[float, int]: ...  # (loss sum, tokens), global
    def save(self, directory: Path, on_done) -> None: ...  # on_done() runs when every rank's files are written
    def load(self, directory: Path) -> None: ...
    def start_from(self, init: InitFrom, step: int) -> None: ...  # a fresh stage's weights from [init] (warmstart.py)
    def finalize_saves(self, blocking: bool) -> None: ...
    def prepare_saves(self, scratch: Path) -> None: ...  # once, after the first step of a stage that saves
    def state_tensors(self) -> dict[str, torch.Tensor]: ...
    def peak_memory_bytes(self) -> int: ...
    def close(self) -> None: ...


def schedule_steps(spec: ExperimentSpec) -> tuple[int, int, int | None]:
    """(warmup, decay, wsd_decay) in iterations; Megatron's lr_decay_iters defaults to train_iters."""
    t = spec.train
    decay = t.lr_decay_iters or t.train_iters
    if t.lr_warmup_iters >= decay:
        raise SpecError([("train.lr_warmup_iters", f"{t.lr_warmup_iters} must be below the decay length {decay} "
                          "(train.lr_decay_iters, else train.train_iters); shorten the warmup")])
    wsd = max(1, round(WSD_DECAY_FRACTION * decay)) if t.lr_decay_style == "WSD" else None
    return t.lr_warmup_iters, decay, wsd


def make_scheduler(optimizer: Any, spec: ExperimentSpec) -> OptimizerParamScheduler:
    """MCore's scheduler in iteration units (Megatron-LM counts samples; the curve is the same)."""
    t = spec.train
    warmup, decay, wsd = schedule_steps(spec)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,  # Megatron's --lr-warmup-init default
        max_lr=t.lr,
        min_lr=t.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        lr_decay_style=t.lr_decay_style,
        start_wd=t.weight_decay,
        end_wd=t.weight_decay,
        wd_incr_steps=t.train_iters,
        wd_incr_style="constant",
        # A checkpoint from a different schedule is an error, not silently adopted.
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False,
        wsd_decay_steps=wsd,
        lr_wsd_decay_style=WSD_DECAY_STYLE if wsd else None,
    )


def current_lr(optimizer: Any) -> float:
    """The lr of the first default group (MCore's get_canonical_lr_for_logging)."""
    for group in optimizer.param_groups:
        if group.get("default_config", True):
            lr = group["lr"]
            return float(lr.item() if isinstance(lr, torch.Tensor) else lr)
    return float("nan")


def masked_loss(output_tensor: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pretrain_gpt.py's loss_func: (sum of per-token losses under the mask, number of tokens)."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    return torch.sum(losses * mask), mask.sum().to(torch.int)
