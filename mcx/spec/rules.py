"""Cross-field rules that need only the spec itself (layout rules live in mcx.plan.layout_rules).

Each rule returns (toml.path, message with the fix); ``check_spec`` collects them all.
"""

from __future__ import annotations

import math
import re

from mcx.spec.container import container_problems
from mcx.spec.schema import ExperimentSpec

Problems = list[tuple[str, str]]

_POSITIVE = {
    "model": ["num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "kv_channels", "vocab_size", "seq_length", "max_position_embeddings", "rotary_base",
              "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "make_vocab_size_divisible_by"],
    "parallel": ["tensor", "pipeline", "virtual_pipeline", "context", "expert"],
    "train": ["micro_batch_size", "global_batch_size", "train_iters", "eval_interval", "log_interval",
              "fp8_amax_history_len", "recompute_num_layers", "loss_spike_window"],
    "smoke": ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length",
              "num_experts", "train_iters", "global_batch_size", "resume_check_iters", "loss_window",
              "nodes", "gpus_per_node", "tensor", "pipeline", "context", "expert"],
    "hardware": ["nodes", "gpus_per_node"],
    "checkpoint": ["keep"],
    "data.tokenizer": ["vocab_size"],
}
_NON_NEGATIVE = {
    "train": ["lr", "min_lr", "lr_warmup_iters", "weight_decay", "clip_grad", "eval_iters", "seed", "adam_eps"],
    "model": ["init_method_std", "moe_aux_loss_coeff", "norm_epsilon"],
    "checkpoint": ["interval"],
    "budget": ["max_gpu_hours", "gpu_hour_price"],
}


def _get(spec: ExperimentSpec, dotted: str):
    obj = spec
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# Counts the planner enumerates divisors (and layouts) of; far above any real model or cluster.
MAX_COUNT = 1 << 20
_COUNTS = ["model.num_layers", "model.num_attention_heads", "model.num_query_groups", "model.num_experts",
           "hardware.nodes", "hardware.gpus_per_node", "smoke.num_layers", "smoke.num_attention_heads",
           "smoke.num_experts", "smoke.nodes", "smoke.gpus_per_node", "parallel.tensor", "parallel.pipeline",
           "parallel.virtual_pipeline", "parallel.context", "parallel.expert"]


# NumPy seeds are 32-bit and Megatron adds 100 per pipeline stage: keep the seed in 31 bits.
MAX_SEED = (1 << 31) - 1


def _range_rules(spec: ExperimentSpec) -> Problems:
    out: Problems = []
    if spec.train.seed > MAX_SEED:
        out.append(("train.seed", f"{spec.train.seed} is above {MAX_SEED} (NumPy seeds are 32-bit); use a smaller seed"))
    for dotted in _COUNTS:
        v = _get(spec, dotted)
        if v is not None and v > MAX_COUNT:
            out.append((dotted, f"{v} is above {MAX_COUNT}; use a realistic count"))
    for section, names in _POSITIVE.items():
        obj = _get(spec, section)
        for name in names:
            v = getattr(obj, name)
            if v is not None and v <= 0:
                out.append((f"{section}.{name}", f"must be positive, got {v}"))
    for section, names in _NON_NEGATIVE.items():
        obj = _get(spec, section)
        for name in names:
            v = getattr(obj, name)
            if v is not None and v < 0:
                out.append((f"{section}.{name}", f"must not be negative, got {v}"))
    for path, v in [("model.hidden_dropout", spec.model.hidden_dropout),
                    ("model.attention_dropout", spec.model.attention_dropout),
                    ("smoke.data_fraction", spec.smoke.data_fraction),
                    ("budget.assumed_mfu", spec.budget.assumed_mfu)]:
        if v is not None and (not 0.0 <= v <= 1.0 or (path.startswith(("smoke", "budget")) and v == 0.0)):
            out.append((path, f"must be in (0, 1] for fractions and [0, 1] for dropouts, got {v}"))
    for path, v in [("train.adam_beta1", spec.train.adam_beta1), ("train.adam_beta2", spec.train.adam_beta2)]:
        if not 0.0 <= v < 1.0:
            out.append((path, f"must be in [0, 1), got {v}"))
    if spec.train.loss_spike_factor <= 1.0:
        out.append(("train.loss_spike_factor", f"must be above 1.0 (a multiple of the recent mean loss), got {spec.train.loss_spike_factor}"))
    if not 0.0 < spec.model.rotary_percent <= 1.0:
        out.append(("model.rotary_percent", f"must be in (0, 1], got {spec.model.rotary_percent}"))
    if spec.model.rope_scaling and spec.model.rope_scaling_factor < 1.0:
        out.append(("model.rope_scaling_factor", f"must be at least 1 (a factor the low frequencies are divided by), "
                                                 f"got {spec.model.rope_scaling_factor}"))
    if spec.model.rope_scaling and spec.model.position_embedding_type != "rope":
        out.append(("model.rope_scaling", f"scales RoPE, and model.position_embedding_type is "
                                          f"\"{spec.model.position_embedding_type}\"; set it to false"))
    every = spec.tracking.system_metrics_interval_s
    if every != 0 and not 1.0 <= every <= 86400.0:
        out.append(("tracking.system_metrics_interval_s", f"must be 0 (off) or 1 to 86400 seconds, got {every}"))
    return out


def _model_rules(spec: ExperimentSpec) -> Problems:
    m = spec.model
    out: Problems = []
    if not spec.name.strip() or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", spec.name):
        out.append(("name", f"{spec.name!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"))
    if m.num_attention_heads > 0 and m.hidden_size % m.num_attention_heads and m.kv_channels is None:
        out.append(("model.hidden_size", f"{m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}; "
                    "change one, or set model.kv_channels"))
    groups = m.num_query_groups
    if groups and m.num_attention_heads % groups:
        out.append(("model.num_query_groups", f"{groups} does not divide model.num_attention_heads={m.num_attention_heads}; "
                    f"use {_divisors(m.num_attention_heads)}"))
    max_pos = m.max_position_embeddings or m.seq_length
    if m.seq_length > max_pos:
        out.append(("model.seq_length", f"{m.seq_length} exceeds model.max_position_embeddings={max_pos}; "
                    "raise max_position_embeddings or shorten the sequence"))
    if m.num_experts is not None and m.moe_router_topk > m.num_experts:
        out.append(("model.moe_router_topk", f"{m.moe_router_topk} exceeds model.num_experts={m.num_experts}; use at most {m.num_experts}"))
    if m.num_experts is None and spec.parallel.expert not in (None, 1):
        out.append(("parallel.expert", f"{spec.parallel.expert} needs a mixture-of-experts model; set model.num_experts or use 1"))
    if m.preset is not None and m.preset.strip() == "":
        out.append(("model.preset", "is empty; remove it or name a preset"))
    return out


def _train_rules(spec: ExperimentSpec) -> Problems:
    t = spec.train
    out: Problems = []
    if t.min_lr > t.lr:
        out.append(("train.min_lr", f"{t.min_lr} is above train.lr={t.lr}; lower it"))
    if t.micro_batch_size > 0 and t.global_batch_size % t.micro_batch_size:
        out.append(("train.global_batch_size", f"{t.global_batch_size} is not divisible by train.micro_batch_size={t.micro_batch_size}"))
    decay = t.lr_decay_iters or t.train_iters
    if t.lr_warmup_iters and t.lr_warmup_iters >= decay:
        out.append(("train.lr_warmup_iters", f"{t.lr_warmup_iters} must be below the decay length {decay} "
                    "(train.lr_decay_iters, else train.train_iters); shorten the warmup"))
    if t.recompute_granularity == "full" and t.recompute_num_layers > spec.model.num_layers:
        out.append(("train.recompute_num_layers", f"{t.recompute_num_layers} exceeds model.num_layers={spec.model.num_layers}"))
    if t.fp8_attention and not t.precision.startswith("fp8"):
        out.append(("train.fp8_attention", f"true needs an fp8 train.precision (it is \"{t.precision}\"); "
                    "set precision = \"fp8-hybrid\" or fp8_attention = false"))
    if t.te_op_fuser and spec.model.num_experts is not None:
        out.append(("train.te_op_fuser", "true fuses dense MLPs, and a mixture-of-experts model has none; "
                    "set te_op_fuser = false"))
    if not re.fullmatch(r"\d+(\.\d+)?,\d+(\.\d+)?,\d+(\.\d+)?", spec.data.split):
        out.append(("data.split", f"{spec.data.split!r} must be three weights 'train,valid,test' such as \"969,30,1\""))
    elif sum(float(x) for x in spec.data.split.split(",")) <= 0 or float(spec.data.split.split(",")[0]) <= 0:
        out.append(("data.split", "the train weight must be positive"))
    tok = spec.data.tokenizer
    if tok.kind != "bpe" and not tok.path:
        out.append(("data.tokenizer.path", f"kind = \"{tok.kind}\" needs a tokenizer file; set path, or use kind = \"bpe\""))
    if tok.kind == "gpt2" and not tok.merges:
        out.append(("data.tokenizer.merges", "kind = \"gpt2\" needs merges.txt beside vocab.json; set merges"))
    if tok.kind != "gpt2" and tok.merges is not None:  # a file nothing reads would still be hashed into the ID
        out.append(("data.tokenizer.merges", f"only kind = \"gpt2\" reads a merges file (kind is \"{tok.kind}\"); "
                                             "remove it"))
    if spec.smoke.resume_check_iters >= spec.smoke.train_iters:
        out.append(("smoke.resume_check_iters", f"must be below smoke.train_iters={spec.smoke.train_iters}"))
    if 2 * spec.smoke.loss_window > spec.smoke.train_iters:
        out.append(("smoke.loss_window", f"two windows of {spec.smoke.loss_window} do not fit in smoke.train_iters={spec.smoke.train_iters}"))
    if spec.launch.master_port is not None and not 1024 <= spec.launch.master_port <= 65535:
        out.append(("launch.master_port", f"{spec.launch.master_port} must be in 1024..65535"))
    if not re.fullmatch(r"(\d+-)?\d{1,3}:\d{2}(:\d{2})?", spec.launch.slurm.time):
        out.append(("launch.slurm.time", f"{spec.launch.slurm.time!r} is not a Slurm time such as \"04:00:00\" or \"1-00:00:00\""))
    wd = spec.launch.watchdog
    for key, value, least in (("max_restarts", wd.max_restarts, 0), ("min_seconds", wd.min_seconds, 0),
                              ("startup_seconds", wd.startup_seconds, 1)):
        if value < least:
            out.append((f"launch.watchdog.{key}", f"must be {least} or more, got {value}"))
    if not wd.step_factor >= 1:  # NaN too
        out.append(("launch.watchdog.step_factor", f"must be 1 or more (a multiple of the step time), got {wd.step_factor}"))
    for metric, tol in spec.baseline.tolerances.items():
        if tol < 0:
            out.append((f"baseline.tolerances.{metric}", f"must not be negative, got {tol}"))
    return out


def _divisors(n: int) -> str:
    """A count's divisors, listed for a fix; above MAX_COUNT the range rule names the count (no search)."""
    return "one of " + ", ".join(map(str, divisors(n))) if n <= MAX_COUNT else "a divisor of it"


INIT_KINDS = ("run", "hf", "megatron")
_RUN_ID = re.compile(r"^[0-9a-f]{12}$")


def init_source(text: str) -> tuple[str, str] | None:
    """``init.from`` as (kind, rest): ("run", "<run-id>"), ("hf", "<dir>"), ("megatron", "<dir>"); None if malformed."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in INIT_KINDS or not rest.strip() or (kind == "run" and not _RUN_ID.fullmatch(rest)):
        return None
    return kind, rest


def _init_rules(spec: ExperimentSpec) -> Problems:
    init, out = spec.init, []
    if init.source is None:
        for key, value, default in (("step", init.step, None), ("load_optimizer", init.load_optimizer, False),
                                    ("reset_step", init.reset_step, True)):
            if value != default:
                out.append((f"init.{key}", "needs init.from (the run or model to start from)"))
        return out
    parsed = init_source(init.source)
    if parsed is None:
        return [("init.from", f"{init.source!r} is not a source; write \"run:<run-id>\" (12 hex digits, see `mcx ls`), "
                              "\"hf:<dir>\" (a Hugging Face model directory) or \"megatron:<dir>\"")]
    kind = parsed[0]
    if init.step is not None and kind != "run":
        out.append(("init.step", f"names a step of a run; a {kind}: source has one checkpoint (unset init.step)"))
    if init.step is not None and init.step < 1:
        out.append(("init.step", f"must be a step >= 1, got {init.step}"))
    if kind == "hf" and init.load_optimizer:
        out.append(("init.load_optimizer", "a Hugging Face model has no optimizer state; set it to false"))
    if kind == "hf" and not init.reset_step:
        out.append(("init.reset_step", "a Hugging Face model has no step to continue from; set it to true"))
    return out


def _sweep_rules(spec: ExperimentSpec) -> Problems:
    """The [sweep] table's own shape (mcx.plan.sweep_trials checks its keys and values against the spec)."""
    sw = spec.sweep
    out: Problems = []
    if sw is None:
        return out
    if not sw.parameters:
        out.append(("sweep.parameters", "is empty; name at least one spec key and its values, e.g. "
                                        "\"train.lr\" = [1e-3, 3e-3]"))
    for key, values in sw.parameters.items():
        where = f'sweep.parameters."{key}"'
        if isinstance(values, tuple):
            if not values:
                out.append((where, "has no values; list at least one"))
            elif len(set(map(repr, values))) != len(values):
                out.append((where, "lists a value twice; each trial would be run once anyway"))
            continue
        if sw.method == "grid":
            out.append((where, "is a range, and a grid needs its values listed; list them, or set sweep.method = "
                               "\"random\" or \"tpe\""))
        if not values.low < values.high:
            out.append((where, f"low = {values.low:g} must be below high = {values.high:g}"))
        if values.log and values.low <= 0:
            out.append((where, f"a log range needs low > 0, got {values.low:g}"))
        if values.step is not None and (values.step <= 0 or values.log):
            out.append((where, "step must be positive, and a log range has none"))
    if sw.method != "grid" and sw.max_trials is None:
        out.append(("sweep.max_trials", f"method \"{sw.method}\" needs a number of trials; set it"))
    for key, value, least in (("max_trials", sw.max_trials, 1), ("parallel", sw.parallel, 1),
                              ("prune_startup_trials", sw.prune_startup_trials, 0),
                              ("prune_warmup_evals", sw.prune_warmup_evals, 0)):
        if value is not None and value < least:
            out.append((f"sweep.{key}", f"must be at least {least}, got {value}"))
    if sw.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", sw.name):
        out.append(("sweep.name", f"{sw.name!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a "
                                  "letter or digit"))
    return out


def _debug_rules(spec: ExperimentSpec) -> Problems:
    out: Problems = []
    perturb, nan_at = spec.debug.perturb_params, spec.debug.nan_params_at_step
    if perturb is not None and perturb.step <= 0:
        out.append(("debug.perturb_params.step", f"must be positive (the step the weights change before), got {perturb.step}"))
    if perturb is not None and perturb.amount == 0:
        out.append(("debug.perturb_params.amount", "0 changes nothing; give the amount to add, or remove perturb_params"))
    if nan_at is not None and nan_at <= 0:
        out.append(("debug.nan_params_at_step", f"must be positive (the step the weights become NaN before), got {nan_at}"))
    output = spec.debug.perturb_output
    if output is not None:
        if output.step <= 0:
            out.append(("debug.perturb_output.step", f"must be positive (the step whose output changes), got {output.step}"))
        if output.micro_batch < 0:
            out.append(("debug.perturb_output.micro_batch", f"must be 0 or more (0-based, within the step), got "
                                                            f"{output.micro_batch}"))
        if output.amount == 0:
            out.append(("debug.perturb_output.amount", "0 changes nothing; give the amount to add, or remove perturb_output"))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", output.module):
            out.append(("debug.perturb_output.module", f"{output.module!r} is not a module path; give one like "
                                                       "\"decoder.layers.1.mlp.linear_fc2\""))
    swap_at = spec.debug.swap_micro_batches_at_step
    if swap_at is not None and swap_at <= 0:
        out.append(("debug.swap_micro_batches_at_step", f"must be positive (the step whose micro-batches trade "
                    f"places), got {swap_at}"))
    return out


def _eval_rules(spec: ExperimentSpec) -> Problems:
    ev = spec.eval
    out: Problems = [("eval.tasks", "an empty task name; give a registry name or a task directory")
                     for task in ev.tasks if not task.strip()][:1]
    if len(set(ev.tasks)) != len(ev.tasks):
        out.append(("eval.tasks", "names a task twice"))
    for key, value, least in (("num_fewshot", ev.num_fewshot, 0), ("limit", ev.limit, 1), ("batch_size", ev.batch_size, 1),
                              ("every", ev.every, 0)):
        if value is not None and value < least:
            out.append((f"eval.{key}", f"must be at least {least}, got {value}"))
    return out


def _data_rules(spec: ExperimentSpec) -> Problems:
    """One dataset or a mixture; each component a path and a positive weight (D60)."""
    data, out = spec.data, []
    if data.path is None and not data.mix:
        out.append(("data.path", "required key is missing; name the prepared dataset directory, e.g. "
                                 "\"data/quickstart\", or give a mixture as [data.mix.NAME] tables"))
    elif data.path is not None and data.mix:
        out.append(("data.mix", "and data.path are both set; a spec reads one dataset (path) or a mixture (mix): "
                                "make the dataset one of the mixture's components, or remove [data.mix]"))
    elif data.path is not None and not data.path.strip():
        out.append(("data.path", "is empty; name the prepared dataset directory, e.g. \"data/quickstart\""))
    if data.per_split and not data.mix:
        out.append(("data.mix", "is missing: [data.valid] and [data.test] mixtures need the training mixture "
                                "beside them; add [data.mix.NAME] tables (one component is a mixture too)"))
    if data.per_split and data.split != "969,30,1":
        out.append(("data.split", f"{data.split!r} has no effect with [data.valid] or [data.test]: each split reads "
                                  "its own mixture whole (Megatron's --train/--valid/--test-data-path); remove it"))
    if data.mix and data.prefix != "corpus":
        out.append(("data.prefix", "belongs to data.path; a mixture's components each have their own prefix: "
                                   "set it in [data.mix.NAME]"))
    for table, mixture in (("mix", data.mix), ("valid", data.valid), ("test", data.test)):
        for name, part in mixture.items():
            where = f"data.{table}.{name}"
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
                out.append((where, "a component's name must be 1-64 letters, digits, '_' or '-', starting with a "
                                   "letter or digit; rename the table"))
            if not part.path.strip():
                out.append((f"{where}.path", "is empty; name the prepared dataset directory"))
            if not part.weight > 0:
                out.append((f"{where}.weight", f"must be positive, got {part.weight:g}; a component not to be read "
                                               "is left out of the mixture"))
    return out


def check_spec(spec: ExperimentSpec) -> Problems:
    return (_range_rules(spec) + _model_rules(spec) + _train_rules(spec) + _data_rules(spec) + _init_rules(spec)
            + _sweep_rules(spec) + _eval_rules(spec) + _debug_rules(spec) + container_problems(spec))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(max(n, 0)) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
