"""Time and money: step time, wall time, GPU-hours, cost, and the budget gate.

The step time is, first to last: one at a measured MFU when the caller has it; one at
``budget.assumed_mfu`` when the spec sets it (model FLOPs per step / (GPUs x bf16 dense peak x MFU));
else the step-time model's (mcx.plan.steptime), which prices the layout's compute, communication and
pipeline bubble. Evaluation adds ``eval_iters`` forward-only steps (a third of a training step) every
``eval_interval``. Without a known GPU (``hardware.gpu = "any"`` or ``"cpu"``) there is no time, no
GPU-hours and no budget check: "unknown" rather than a guess.
"""

from __future__ import annotations

from typing import Protocol

from attrs import frozen

from mcx.errors import BudgetError
from mcx.plan.gpus import mfu_peak_flops
from mcx.plan.steptime import StepTime
from mcx.spec.schema import ExperimentSpec

SOURCES = {"measured": "a measured MFU", "assumed": "budget.assumed_mfu", "model": "the step-time model"}


@frozen(kw_only=True)
class CostEstimate:
    mfu: float | None
    mfu_source: str  # "measured", "assumed" (budget.assumed_mfu) or "model" (mcx.plan.steptime)
    predicted: StepTime | None  # the model's step, shown beside an override too
    peak_flops_per_gpu: float | None  # bf16 dense
    step_time_s: float | None
    train_time_s: float | None
    eval_time_s: float | None
    wall_time_h: float | None
    gpu_hours: float | None
    cost: float | None  # gpu_hours x budget.gpu_hour_price
    max_gpu_hours: float | None

    @property
    def over_budget(self) -> bool | None:
        if self.max_gpu_hours is None or self.gpu_hours is None:
            return None
        return self.gpu_hours > self.max_gpu_hours


def estimate_cost(spec: ExperimentSpec, *, flops_per_step: int, world_size: int, mfu: float | None = None,
                  predicted: StepTime | None = None) -> CostEstimate:
    t, b = spec.train, spec.budget
    peak = mfu_peak_flops(spec.hardware.gpu)
    if mfu is not None or b.assumed_mfu is not None:  # an MFU given: the step from the FLOPs at it
        source, used_mfu = ("measured", mfu) if mfu is not None else ("assumed", b.assumed_mfu)
        step = flops_per_step / (world_size * peak * used_mfu) if peak is not None and used_mfu else None
    else:
        source, used_mfu = "model", predicted.mfu if predicted is not None else None
        step = predicted.step_s if predicted is not None and peak is not None and used_mfu else None
    if step is None:
        return CostEstimate(mfu=used_mfu, mfu_source=source, predicted=predicted, peak_flops_per_gpu=peak,
                            step_time_s=None, train_time_s=None, eval_time_s=None, wall_time_h=None, gpu_hours=None,
                            cost=None, max_gpu_hours=b.max_gpu_hours)
    train = step * t.train_iters
    evaluations = t.train_iters // t.eval_interval if t.eval_interval else 0
    evaluate = evaluations * t.eval_iters * step / 3
    wall_h = (train + evaluate) / 3600
    gpu_hours = wall_h * world_size
    return CostEstimate(mfu=used_mfu, mfu_source=source, predicted=predicted, peak_flops_per_gpu=peak,
                        step_time_s=step, train_time_s=train, eval_time_s=evaluate, wall_time_h=wall_h,
                        gpu_hours=gpu_hours, cost=gpu_hours * b.gpu_hour_price if b.gpu_hour_price is not None else None,
                        max_gpu_hours=b.max_gpu_hours)


class Costed(Protocol):
    """What the budget gate reads of a plan (mcx.plan.planner.Plan): the full stage's cost."""

    @property
    def cost(self) -> CostEstimate: ...


def check_budget(plan: Costed, confirmed: bool) -> None:
    """Raise BudgetError (exit 2) when the full stage needs more GPU-hours than budget.max_gpu_hours
    allows and the user has not confirmed."""
    c = plan.cost
    if confirmed or not c.over_budget:
        return
    price = f" (about {c.cost:,.0f} at budget.gpu_hour_price)" if c.cost is not None else ""
    raise BudgetError(
        f"the full stage needs about {c.gpu_hours:,.0f} GPU-hours{price} at {c.step_time_s:.3g} s a step "
        f"({c.mfu:.0%} MFU, from {SOURCES[c.mfu_source]}), above budget.max_gpu_hours = {c.max_gpu_hours:,.0f};",
        "pass --yes to run it anyway, or raise budget.max_gpu_hours in the spec.")
