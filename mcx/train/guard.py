"""The divergence guard: stop on a NaN/Inf loss or gradient norm, or on a loss spike.

A spike is a loss above ``train.loss_spike_factor`` x the mean of the last ``train.loss_spike_window``
losses (fewer at the start of a run). The history survives a resume: the loop seeds the guard from
metrics.jsonl. When the guard trips, the stage stops without saving, so the last checkpoint is the
last good state, and the result carries the advice from Megatron-LM's troubleshooting notes that
fits the spec (warmup, learning rate, clipping, init std, dropout, precision).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from mcx.spec.schema import ExperimentSpec


class DivergenceGuard:
    def __init__(self, factor: float, window: int, history: Iterable[float | None] = ()) -> None:
        self.factor = factor
        self.recent: deque[float] = deque((x for x in history if x is not None and math.isfinite(x)), maxlen=window)

    def check(self, step: int, loss: float, grad_norm: float | None, skipped: bool = False) -> str | None:
        """None while training is healthy, else the reason to stop. A step that fp16 loss scaling
        skipped (inf/nan gradients, the update not applied) is checked on its loss only."""
        if not math.isfinite(loss):
            return f"the loss is {loss} at step {step}"
        if not skipped and (grad_norm is None or not math.isfinite(grad_norm)):
            return f"the gradient norm is {grad_norm} at step {step} (loss {loss:.4f})"
        if self.recent:
            mean = sum(self.recent) / len(self.recent)
            if loss > self.factor * mean:
                return (f"the loss spiked to {loss:.4f} at step {step}, above {self.factor:g} x the mean "
                        f"{mean:.4f} of the previous {len(self.recent)} steps")
        self.recent.append(loss)
        return None


def advice(spec: ExperimentSpec) -> str:
    """Fixes to try, most likely first, phrased as spec keys."""
    t, m = spec.train, spec.model
    tips = [f"lower train.lr (now {t.lr:g}; try {t.lr / 3:.3g})"]
    if t.lr_warmup_iters < max(1, t.train_iters // 100):
        tips.append(f"warm up longer (train.lr_warmup_iters = {t.lr_warmup_iters}; try {max(10, t.train_iters // 50)})")
    if t.clip_grad == 0 or t.clip_grad > 1.0:
        tips.append(f"clip gradients (train.clip_grad = {t.clip_grad:g}; use 1.0)")
    if m.init_method_std > 0.02 or m.hidden_size >= 4096:
        tips.append(f"use a smaller init (model.init_method_std = {m.init_method_std:g}; try "
                    f"{min(0.02, 1 / math.sqrt(3 * m.hidden_size)):.3g})")
    if m.hidden_dropout > 0 or m.attention_dropout > 0:
        tips.append("turn dropout off (model.hidden_dropout = model.attention_dropout = 0.0)")
    if t.precision == "fp16":
        tips.append("train in bf16 (train.precision = \"bf16\"): fp16's range overflows more easily")
    if t.adam_beta2 > 0.95:
        tips.append(f"lower train.adam_beta2 (now {t.adam_beta2:g}; 0.95 is Megatron's LLaMA setting)")
    return "Try: " + "; ".join(tips) + ". The last checkpoint (before the divergence) is kept."
