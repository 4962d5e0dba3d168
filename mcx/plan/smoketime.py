"""The smoke stage's time limit (its sbatch ``--time``): ``smoke.time_limit``, else an estimate.

The smoke stage trains a model of seconds; what makes a job long is starting it. The estimate:

    STARTUP_S + SAFETY x steps x step time, rounded up to whole minutes, at least FLOOR_S

* ``STARTUP_S``: imports from a shared filesystem, rendezvous and NCCL set-up across the node, the
  dataset index build, the checkpoint writer's start (24-31 s after the stage started on
  one H200 machine, D31) and the smoke checks' two model rebuilds and loads;
* steps: ``smoke.train_iters``, the ``smoke.resume_check_iters`` steps the resume check replays,
  and the final evaluation's forward-only steps at a third of a training step each;
* step time: the planner's (:mod:`mcx.plan.cost`) for the smoke model on the smoke stage's GPUs, but
  at least ``MIN_STEP_S``: a model this small is bound by kernel
  launches and communication, not FLOPs (about 18 ms a step on one H200,
  docs/results/mcx_run_h200_1gpu.json). Without a known peak (``smoke.gpu = "cpu"``, ``"any"``)
  each step is allowed ``UNKNOWN_STEP_S``: an allowance, not a measurement.

Only a Slurm job is held to the limit. With ``launch.slurm.requeue`` Slurm warns
``launch.slurm.signal_grace_seconds`` before it and the workers stop to checkpoint: the grace is
added, so the warning falls after the expected end. The smoke stage never asks for more than
``launch.slurm.time``. A ``smoke.time_limit`` is used as written; it must be longer than that grace
(else the warning would stop the stage before it ran): an error naming both keys.
"""

from __future__ import annotations

import math

from attrs import frozen

from mcx.errors import InputError, SpecError
from mcx.plan.cost import SOURCES, estimate_cost
from mcx.plan.layout import Layout
from mcx.plan.flops import flops_per_iteration
from mcx.plan.params import padded_vocab_size
from mcx.plan.steptime import predict_worker
from mcx.spec.schema import ExperimentSpec
from mcx.spec.slurmtime import slurm_time, time_limit_seconds

STARTUP_S = 300.0  # 15x a stage's 15-20 s from start to its first step on one H200 machine
SAFETY = 2.0  # on the steps: deterministic mode, a slow node, the resume check's extra loads
MIN_STEP_S = 1.0
UNKNOWN_STEP_S = 10.0
FLOOR_S = 600  # a job killed at its limit costs its whole queue wait: minutes are cheap


@frozen(kw_only=True)
class SmokeTime:
    seconds: int
    slurm: str  # ``seconds`` as a Slurm time limit, e.g. "00:12:00"
    source: str  # "smoke.time_limit" | "estimate" | "launch.slurm.time" (the estimate was longer)
    detail: str  # how it was reached, one line


def _grace(spec: ExperimentSpec) -> int:
    """Seconds before the limit at which the smoke job is warned (0: no warning)."""
    slurm = spec.launch.slurm
    warned = spec.launch.kind == "slurm" and slurm.requeue and slurm.signal_grace_seconds > 0
    return slurm.signal_grace_seconds if warned else 0


def time_limit_problems(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """What is wrong with ``smoke.time_limit`` (its format, the grace it must exceed)."""
    value = spec.smoke.time_limit
    if value is None:
        return []
    try:
        seconds = time_limit_seconds(value, "smoke.time_limit")
    except InputError:
        return [("smoke.time_limit", f"{value!r} is not a Slurm time limit longer than zero; use minutes, "
                 "'HH:MM:SS' or 'D-HH:MM:SS', e.g. '00:30:00'")]
    if seconds is None:
        return [("smoke.time_limit", f"{value!r}: the smoke stage needs a limit; unset it for the plan's estimate")]
    grace = _grace(spec)
    if grace >= seconds:
        return [("smoke.time_limit", f"{value!r} is not longer than launch.slurm.signal_grace_seconds = {grace}: "
                 "the time-limit warning would stop the smoke stage before it ran; raise smoke.time_limit, or "
                 "unset it (the estimate adds the grace)")]
    return []


def smoke_time_limit(spec: ExperimentSpec, smoke: ExperimentSpec, layout: Layout, vocab_size: int, *,
                     impl: str) -> SmokeTime:
    """The smoke stage's limit: ``spec`` as written, ``smoke`` and ``layout`` its smoke stage, ``vocab_size``
    the tokenizer's, ``impl`` its layer implementation. SpecError naming smoke.time_limit when that is set and wrong."""
    problems = time_limit_problems(spec)
    if problems:
        raise SpecError(problems)
    if spec.smoke.time_limit is not None:
        seconds = time_limit_seconds(spec.smoke.time_limit, "smoke.time_limit")
        assert seconds is not None
        return SmokeTime(seconds=seconds, slurm=slurm_time(seconds), source="smoke.time_limit",
                         detail=f"smoke.time_limit = {spec.smoke.time_limit!r}")
    t = smoke.train
    evaluations = t.train_iters // t.eval_interval if t.eval_interval else 0
    steps = t.train_iters + spec.smoke.resume_check_iters + evaluations * t.eval_iters / 3
    padded = padded_vocab_size(vocab_size, smoke.model.make_vocab_size_divisible_by, layout.tp)
    flops = flops_per_iteration(smoke.model, padded_vocab=padded, global_batch_size=t.global_batch_size)
    model = predict_worker(smoke, layout, padded_vocab=padded, impl=impl)
    cost = estimate_cost(smoke, flops_per_step=flops, world_size=layout.world_size, predicted=model)
    predicted = cost.step_time_s
    step = UNKNOWN_STEP_S if predicted is None else max(predicted, MIN_STEP_S)
    estimate = STARTUP_S + SAFETY * steps * step
    base = max(FLOOR_S, 60 * math.ceil(estimate / 60))
    grace = _grace(spec)
    seconds, source = base + grace, "estimate"
    why = ("no known peak" if predicted is None
           else f"the planner's {predicted * 1e3:.3g} ms, raised to the minimum" if predicted < MIN_STEP_S
           else f"the planner's, from {SOURCES[cost.mfu_source]}")
    detail = (f"estimate: {STARTUP_S / 60:g} min start-up + {SAFETY:g} x {steps:.1f} steps x {step:.3g} s "
              f"({why}) = {estimate / 60:.1f} min, at least {FLOOR_S // 60} min"
              + (f", + {grace} s signal grace" if grace else ""))
    full = time_limit_seconds(spec.launch.slurm.time)
    if full is not None and full < seconds:
        seconds, source = full, "launch.slurm.time"
        detail += f"; capped at launch.slurm.time = {spec.launch.slurm.time!r}"
    return SmokeTime(seconds=seconds, slurm=slurm_time(seconds), source=source, detail=detail)
