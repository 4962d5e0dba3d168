"""The two stages of a run: the smoke stage (a shrunk copy of the spec) and the full stage.

The smoke stage runs the same code path (launcher, precision, layer implementation, parallel
kinds, data) on a model small enough to train in seconds, so that a broken setup fails in minutes
instead of hours into a job. Its shapes come from ``[smoke]``; what ``[smoke]`` leaves unset is
derived from the full spec:

* model: ``smoke.num_layers`` layers, hidden ``min(hidden, 256)``, head dim near 64, the full
  model's query-group ratio where it divides, FFN scaled with the hidden size, sequence
  ``min(seq, 256)``, ``min(experts, 4)`` experts; the vocabulary stays (it is the tokenizer's);
* placement: ``smoke.nodes`` nodes (default: one) of ``smoke.gpus_per_node`` GPUs (default: the
  full stage's), and the full layout's degrees, each shrunk (largest first, halving) until the
  smaller model and world accept it, so a 16-node TP8 x PP8 x CP2 spec smoke-tests as TP2 x PP2 x
  CP2 on one node; ``smoke.tensor`` / ``pipeline`` / ``context`` / ``expert`` pin a degree;
* device: ``smoke.gpu`` (default ``hardware.gpu``). ``"cpu"`` runs the stage as CPU processes
  (``smoke.gpus_per_node`` of them a node) as the CPU backend trains: data parallel only (the
  degrees default to 1; a pinned degree above 1 is an error naming its key), fp32, the local layer
  spec, no recomputation. It still exercises the launcher, the data, the loss and the resume
  check, e.g. on a Slurm cluster without GPUs; the parallel kinds and precision it cannot;
* training: ``smoke.train_iters`` steps at ``smoke.lr`` (default: the spec's), warmup at most a
  tenth of the steps, the decay over the smoke steps, one evaluation at the end, a checkpoint
  ``smoke.resume_check_iters`` before the end for the resume check, and the smallest global batch
  that fills the pipeline (micro batch x DP x PP) unless ``smoke.global_batch_size`` says otherwise;
* time limit: ``launch.slurm.time`` of the stage spec is ``smoke.time_limit``, else the smoke
  stage's own estimate (:mod:`mcx.plan.smoketime`), not the full job's allocation.

The result passes the spec rules and the layout rules itself; problems name the ``smoke.*`` key.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from attrs import evolve

from mcx.errors import SpecError
from mcx.plan.layout_rules import Layout, resolve_layout, transformer_impl
from mcx.plan.params import require_vocab_size
from mcx.plan.smoketime import smoke_time_limit, time_limit_problems
from mcx.spec.rules import check_spec, divisors
from mcx.spec.schema import ExperimentSpec

Stage = Literal["smoke", "full"]

SMOKE_MAX_HIDDEN = 256
SMOKE_MAX_SEQ = 256
SMOKE_MAX_EXPERTS = 4
SMOKE_HEAD_DIM = 64

# Keys of the stage spec that a [smoke] key (or its default) decides: problems are reported there.
_SMOKE_KEYS = {
    "parallel.tensor": "smoke.tensor", "parallel.pipeline": "smoke.pipeline", "parallel.context": "smoke.context",
    "parallel.expert": "smoke.expert", "model.num_layers": "smoke.num_layers", "model.hidden_size": "smoke.hidden_size",
    "model.ffn_hidden_size": "smoke.ffn_hidden_size", "model.num_attention_heads": "smoke.num_attention_heads",
    "model.seq_length": "smoke.seq_length", "model.num_experts": "smoke.num_experts",
    "train.global_batch_size": "smoke.global_batch_size", "train.lr": "smoke.lr", "hardware.nodes": "smoke.nodes",
    "hardware.gpus_per_node": "smoke.gpus_per_node", "hardware.gpu": "smoke.gpu", "parallel": "smoke",
}


_DOTTED = re.compile("|".join(re.escape(k) for k in sorted(_SMOKE_KEYS, key=len, reverse=True) if "." in k) + r"\b")


def _smoke_words(message: str) -> str:
    """Name the [smoke] keys that decided a value in a message written for the full spec."""
    return _DOTTED.sub(lambda match: _SMOKE_KEYS[match.group(0)], message)


def smoke_spec(spec: ExperimentSpec, layout: Layout, *, te_available: bool | None = None,
               vocab_size: int | None = None) -> tuple[ExperimentSpec, Layout]:
    """The spec and layout the smoke stage trains, from the full spec and its ``layout``. Only
    :func:`mcx.plan.planner.make_plan` calls this: its StagePlan is where every other reader finds them.

    ``te_available`` and ``vocab_size`` as for :func:`mcx.plan.layout_rules.resolve_layout`.
    """
    return _smoke(spec, layout, te_available, vocab_size)


def _nearest(options: list[int], target: float) -> int:
    return min(options, key=lambda v: (abs(v - target), v))


def _scaled_width(width: int, scale: float, tp: int) -> int:
    unit = 64 * tp // math.gcd(64, tp)
    return max(unit, round(width * scale / unit) * unit)


def _smallest_factor(n: int) -> int:
    return next(p for p in range(2, n + 1) if n % p == 0)


def _fit_degrees(world: int, layers: int, seq: int, experts: int | None, hidden: int, heads: int | None,
                 full: dict[str, int], pinned: set[str]) -> dict[str, int]:
    deg = dict(full)
    free = {k for k in deg if k not in pinned}
    if "pp" in free:
        deg["pp"] = math.gcd(deg["pp"], layers)
    if "cp" in free:
        deg["cp"] = max(d for d in divisors(deg["cp"]) if d == 1 or seq % (2 * d) == 0)
    if "ep" in free:
        deg["ep"] = math.gcd(deg["ep"], experts) if experts else 1
    if "tp" in free:
        deg["tp"] = math.gcd(deg["tp"], heads if heads else hidden)
    order = {"tp": 0, "pp": 1, "cp": 2, "ep": 3}  # on ties shrink the later kinds first, keeping TP

    def bad() -> bool:
        mp = deg["tp"] * deg["pp"] * deg["cp"]
        return world % mp != 0 or ((world // mp) * deg["cp"]) % deg["ep"] != 0

    while bad():
        mp_ok = world % (deg["tp"] * deg["pp"] * deg["cp"]) == 0
        shrinkable = [k for k in free if deg[k] > 1 and (k == "ep" or not mp_ok)]
        if not shrinkable:
            break
        k = max(shrinkable, key=lambda k: (deg[k], order[k]))
        deg[k] //= _smallest_factor(deg[k])
    return deg


def _smoke(spec: ExperimentSpec, layout: Layout, te_available: bool | None,
           vocab_size: int | None) -> tuple[ExperimentSpec, Layout]:
    m, t, sm, hw = spec.model, spec.train, spec.smoke, spec.hardware
    nodes = sm.nodes or 1  # one node unless asked: a smoke test needs no more, and queues sooner
    gpn = sm.gpus_per_node or hw.gpus_per_node
    gpu = sm.gpu or hw.gpu
    cpu = gpu == "cpu"  # the CPU backend trains data parallel only: unpinned degrees are 1
    layers = sm.num_layers
    hidden = sm.hidden_size or min(m.hidden_size, SMOKE_MAX_HIDDEN)
    seq = sm.seq_length or min(m.seq_length, SMOKE_MAX_SEQ)
    experts = None if m.num_experts is None else (sm.num_experts or min(m.num_experts, SMOKE_MAX_EXPERTS))
    pinned = {k for k, v in (("tp", sm.tensor), ("pp", sm.pipeline), ("cp", sm.context), ("ep", sm.expert)) if v}
    full = {"tp": sm.tensor or layout.tp, "pp": sm.pipeline or layout.pp, "cp": sm.context or layout.cp,
            "ep": sm.expert or layout.ep}
    if cpu:
        full = {k: v if k in pinned else 1 for k, v in full.items()}
    deg = _fit_degrees(nodes * gpn, layers, seq, experts, hidden, sm.num_attention_heads, full, pinned)
    tp, pp = deg["tp"], deg["pp"]

    heads = sm.num_attention_heads or _nearest([d for d in divisors(hidden) if d % tp == 0] or [tp],
                                               max(1, hidden // SMOKE_HEAD_DIM))
    groups = None
    if m.num_query_groups is not None:
        ratio = max(1, m.num_attention_heads // m.num_query_groups)
        groups = _nearest([g for g in divisors(heads) if g % tp == 0] or [heads], max(1, heads // ratio))
    scale = hidden / m.hidden_size
    ffn = sm.ffn_hidden_size or _scaled_width(m.ffn_hidden_size or 4 * m.hidden_size, scale, tp)
    moe_ffn = None if m.moe_ffn_hidden_size is None else _scaled_width(m.moe_ffn_hidden_size, scale, tp)
    model = evolve(m, preset=None, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                   num_query_groups=groups, ffn_hidden_size=ffn, kv_channels=None, seq_length=seq,
                   max_position_embeddings=max(seq, m.max_position_embeddings or m.seq_length),
                   num_experts=experts, moe_router_topk=min(m.moe_router_topk, experts) if experts else m.moe_router_topk,
                   moe_ffn_hidden_size=moe_ffn, transformer_impl="auto" if cpu else m.transformer_impl)

    world = nodes * gpn
    dp = world // (tp * pp * deg["cp"]) if world % (tp * pp * deg["cp"]) == 0 else 1
    vpp = layout.vpp if (layout.vpp and pp > 1 and layers % (pp * layout.vpp) == 0) else None
    gbs = sm.global_batch_size or t.micro_batch_size * dp * (pp if pp > 1 else 1)
    lr = sm.lr if sm.lr is not None else t.lr
    iters = sm.train_iters
    train = evolve(t, global_batch_size=gbs, train_iters=iters, lr=lr, min_lr=min(t.min_lr, lr),
                   lr_warmup_iters=min(t.lr_warmup_iters, iters // 10), lr_decay_iters=None,
                   eval_interval=iters, eval_iters=min(t.eval_iters, 4), log_interval=1,
                   recompute_num_layers=max(1, min(t.recompute_num_layers, layers // max(pp, 1))),
                   loss_spike_window=min(t.loss_spike_window, iters),
                   # Its resume check compares losses bit for bit: that needs Megatron's deterministic
                   # mode on GPUs (non-deterministic kernels differ in the last bits on replay).
                   deterministic=True)
    if cpu:  # what the CPU backend trains (mcx.train.cpu.check_cpu_job)
        train = evolve(train, precision="fp32", recompute_granularity="none", grad_reduce_in_bf16=False,
                       te_op_fuser=False, cuda_graphs=False)
    moe_tp = experts is not None and tp > 1
    parallel = evolve(spec.parallel, tensor=tp, pipeline=pp, context=deg["cp"],
                      expert=deg["ep"] if experts is not None else None, virtual_pipeline=vpp,
                      sequence_parallel=tp > 1 and (layout.sequence_parallel or moe_tp))
    checkpoint = evolve(spec.checkpoint, dir=None, interval=max(1, iters - sm.resume_check_iters),
                        final=True, track_intermediate=False)
    smoke = evolve(spec, model=model, train=train, parallel=parallel, checkpoint=checkpoint,
                   hardware=evolve(hw, nodes=nodes, gpus_per_node=gpn, gpu=gpu))

    problems = [(p, m_) for p, m_ in check_spec(smoke)]
    if cpu:
        problems += [(f"smoke.{name}", f"{deg[key]} needs GPUs: with smoke.gpu = \"cpu\" the smoke stage trains "
                      "data parallel only; unset it (or use 1)")
                     for key, name in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert"))
                     if deg[key] > 1]
    problems += time_limit_problems(spec)
    smoke_layout = None
    try:
        smoke_layout, _, _ = resolve_layout(smoke, te_available=te_available, vocab_size=vocab_size)
    except SpecError as exc:
        problems += exc.problems
    if problems:
        raise SpecError([(_SMOKE_KEYS.get(p, p), f"smoke stage: {_smoke_words(msg)}") for p, msg in problems])
    assert smoke_layout is not None
    limit = smoke_time_limit(spec, smoke, smoke_layout, require_vocab_size(smoke, vocab_size),
                             impl=transformer_impl(smoke, te_available)[0])
    smoke = evolve(smoke, launch=evolve(spec.launch, slurm=evolve(spec.launch.slurm, time=limit.slurm)))
    return smoke, smoke_layout

