"""Layouts ranked before the job: every parallel layout of the spec's GPUs that fits their memory (the
planner's estimate: "fits" or "tight"), by the step-time model's throughput (`mcx tune --layouts`, docs/steptime.md).

The search runs over tensor, pipeline (and its interleaving), context and expert parallel, the micro-batch
and activation recomputation, with data parallel filling the rest. Sequence parallel is on wherever TP > 1
and the distributed optimizer wherever DP x CP > 1: neither costs time in the model and both save memory.
A recomputation is tried only where the layout does not fit without it (it never makes a step faster). The
spec's own degrees are one candidate among the others (``Ranking.current``). Pure: no files, no devices.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from attrs import evolve, frozen

from mcx.plan.gpus import gpu_info
from mcx.plan.layout import Layout
from mcx.plan.layout_rules import layout_problems, transformer_impl
from mcx.plan.memory import estimate_memory, verdict
from mcx.plan.params import padded_vocab_size, require_vocab_size
from mcx.plan.steptime import StepTime, predict_worker
from mcx.spec.rules import divisors
from mcx.spec.schema import ExperimentSpec

MAX_MICRO_BATCH = 16
MIN_CP_CHUNK = 1024  # context parallel below this many tokens a rank leaves attention kernels too short
RECOMPUTE: tuple[tuple[str, dict[str, Any]], ...] = (("none", {}), ("selective", {}), ("full", {"train.recompute_method": "uniform",
                                                       "train.recompute_num_layers": 1}))


@frozen(kw_only=True)
class Candidate:
    settings: dict[str, Any]  # the spec keys that make this layout, e.g. {"parallel.tensor": 2, ...}
    layout: Layout
    memory_bytes: int
    verdict: str  # the memory verdict: "fits" or "tight" (a trial tells)
    step: StepTime

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(sorted(self.settings.items()))


@frozen(kw_only=True)
class Ranking:
    candidates: tuple[Candidate, ...]  # fastest first
    considered: int  # layouts the rules allowed
    too_big: int  # of those, layouts that did not fit even with full recomputation
    current: Candidate | None  # the spec's own layout, where it fits (None: it does not, or is not valid)
    capacity_bytes: int


def apply(spec: ExperimentSpec, settings: dict[str, Any]) -> ExperimentSpec:
    """``spec`` with ``settings`` ({"parallel.tensor": 2, "train.micro_batch_size": 4, ...}) written in."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in settings.items():
        section, key = dotted.split(".")
        sections.setdefault(section, {})[key] = value
    return evolve(spec, **{s: evolve(getattr(spec, s), **kv) for s, kv in sections.items()})


def _options(spec: ExperimentSpec) -> dict[str, list[int]]:
    m, hw = spec.model, spec.hardware
    world = hw.nodes * hw.gpus_per_node
    groups = m.num_query_groups or m.num_attention_heads
    out = {
        "tensor": [d for d in divisors(math.gcd(m.num_attention_heads, groups)) if d <= min(world, hw.gpus_per_node)],
        "pipeline": [d for d in divisors(m.num_layers) if d <= world],
        "context": [c for c in (2 ** i for i in range(world.bit_length())) if c <= world
                    and (c == 1 or (m.seq_length % (2 * c) == 0 and m.seq_length // c >= MIN_CP_CHUNK))],
        "expert": [d for d in divisors(m.num_experts) if d <= world] if m.num_experts else [1],
    }
    return out


def _layouts(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """The degrees and micro-batches the rules could allow, as settings (before any rule is checked)."""
    hw, t, par = spec.hardware, spec.train, spec.parallel
    world = hw.nodes * hw.gpus_per_node
    opts = _options(spec)
    out = []
    for tp, pp, cp, ep in itertools.product(opts["tensor"], opts["pipeline"], opts["context"], opts["expert"]):
        if world % (tp * pp * cp) or (world // (tp * pp)) % ep:
            continue
        dp = world // (tp * pp * cp)
        per_stage = spec.model.num_layers // pp
        vpps = [None] + [v for v in divisors(per_stage) if v > 1] if pp > 1 else [None]
        for vpp, mbs in itertools.product(vpps, (2 ** i for i in range(MAX_MICRO_BATCH.bit_length()))):
            if mbs > MAX_MICRO_BATCH or t.global_batch_size % (mbs * dp):
                continue
            settings: dict[str, Any] = {"parallel.tensor": tp, "parallel.pipeline": pp, "parallel.context": cp,
                                        "parallel.virtual_pipeline": vpp, "parallel.sequence_parallel": tp > 1,
                                        "parallel.distributed_optimizer": dp * cp > 1 or par.distributed_optimizer,
                                        "train.micro_batch_size": mbs}
            if spec.model.num_experts:
                settings["parallel.expert"] = ep
            out.append(settings)
    return out


def rank_layouts(spec: ExperimentSpec, *, te_available: bool | None, vocab_size: int | None = None) -> Ranking:
    """Every layout that fits, fastest first by the model. ``spec.hardware.gpu`` must be in the GPU table."""
    info = gpu_info(spec.hardware.gpu)
    if info is None:
        raise ValueError(f"no GPU table row for {spec.hardware.gpu!r}")
    vocab = require_vocab_size(spec, vocab_size)
    capacity = info.memory_bytes
    found: dict[tuple[Any, ...], Candidate] = {}
    considered = too_big = 0
    for settings in _layouts(spec):  # a layout that does not fit tries the recomputations in turn
        for variant in (settings, {**settings, "parallel.sequence_parallel": False}):
            fits = valid = False  # sequence parallel off only where on is against a rule (no TE's RMSNorm, say)
            for name, extra in RECOMPUTE:
                full = {**variant, "train.recompute_granularity": name, **extra}
                cand = _evaluate(apply(spec, full), full, te_available, vocab)
                if cand is None:  # against a rule (recomputation changes none of them)
                    break
                valid = True
                if cand.verdict != "does not fit":
                    found[cand.key], fits = cand, True
                    break
            if valid or not settings["parallel.sequence_parallel"]:
                break
        considered += valid
        too_big += valid and not fits
    ranked = tuple(sorted(found.values(), key=lambda c: (-c.step.tokens_per_s_per_gpu, c.memory_bytes)))
    own = _evaluate(spec, _own_settings(spec), te_available, vocab) if _complete(spec) else None
    if own is not None and own.verdict == "does not fit":
        own = None
    return Ranking(candidates=ranked, considered=considered, too_big=too_big, current=own, capacity_bytes=capacity)


def _complete(spec: ExperimentSpec) -> bool:
    par = spec.parallel
    return all(v is not None for v in (par.tensor, par.pipeline, par.context)) and (
        par.expert is not None or not spec.model.num_experts)


def _own_settings(spec: ExperimentSpec) -> dict[str, Any]:
    par, t = spec.parallel, spec.train
    return {"parallel.tensor": par.tensor, "parallel.pipeline": par.pipeline, "parallel.context": par.context,
            "parallel.virtual_pipeline": par.virtual_pipeline, "parallel.sequence_parallel": par.sequence_parallel,
            "parallel.distributed_optimizer": par.distributed_optimizer, "train.micro_batch_size": t.micro_batch_size,
            "train.recompute_granularity": t.recompute_granularity,
            **({"parallel.expert": par.expert} if spec.model.num_experts else {})}


def _evaluate(spec: ExperimentSpec, settings: dict[str, Any], te_available: bool | None,
              vocab: int) -> Candidate | None:
    par, hw = spec.parallel, spec.hardware
    tp, pp, cp, ep = par.tensor or 1, par.pipeline or 1, par.context or 1, par.expert or 1
    world = hw.nodes * hw.gpus_per_node
    layout = Layout(tp=tp, pp=pp, vpp=par.virtual_pipeline if par.virtual_pipeline != 1 else None, cp=cp, ep=ep,
                    dp=world // (tp * pp * cp), world_size=world, gpus_per_node=hw.gpus_per_node, nodes=hw.nodes,
                    sequence_parallel=par.sequence_parallel, distributed_optimizer=par.distributed_optimizer)
    if layout_problems(spec, layout, te_available):
        return None
    impl = transformer_impl(spec, te_available)[0]
    memory = estimate_memory(spec, layout, vocab_size=vocab, transformer_impl=impl, suggest_fixes=False).total
    padded = padded_vocab_size(vocab, spec.model.make_vocab_size_divisible_by, tp)
    step = predict_worker(spec, layout, padded_vocab=padded, impl=impl)
    assert step is not None  # the GPU is in the table
    return Candidate(settings=settings, layout=layout, memory_bytes=memory, step=step,
                     verdict=verdict(memory, gpu.memory_bytes if (gpu := gpu_info(hw.gpu)) else None,
                                     expandable=spec.train.expandable_segments))
