"""What each row of the flag table does on import: plain rows, Megatron-LM's defaults, named rules.

Rows are taken in the table's order, so a rule can read values that earlier rows set (the virtual
pipeline reads the pipeline degree, sample counts read the global batch, the derived FFN size reads
``swiglu``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable

from mcx.interop import flags as F
from mcx.interop.data_blend import import_data
from mcx.spec.keys import spec_keys
from mcx.interop.pretrain_args import Ctx, Mapped
from mcx.spec.convert import toml_value
from mcx.interop.script import Unknown

_UNMATCHED_MESSAGES = {
    "train.eval_interval": "without --eval-interval Megatron-LM validates only after training; "
                           "train.eval_interval keeps mcx's default {default}",
    "train.recompute_method": "--recompute-granularity full without --recompute-method is refused by Megatron-LM; "
                              "train.recompute_method keeps mcx's default {default}",
    "train.recompute_num_layers": "--recompute-granularity full without --recompute-num-layers is refused by "
                                  "Megatron-LM; train.recompute_num_layers keeps mcx's default {default}",
}


def _megatron_split(text: str) -> str:
    """--split as Megatron-LM reads it: the numbers in it (re ``[.0-9]+``), zeros for missing ones."""
    numbers = re.findall(r"[.0-9]+", text)
    return ",".join(numbers + ["0"] * (3 - len(numbers))) if 1 <= len(numbers) <= 3 else text


# Arguments whose text Megatron-LM reads more loosely than the spec's type: the text as it reads it.
_AS_READ: dict[str, Callable[[str], str]] = {"data.split": _megatron_split}


def plain(ctx: Ctx, row: F.Row) -> None:
    """A value, switch or negated row: the argument's value, or what its absence means."""
    flag = row.args[0]
    if flag in ctx.given:
        if row.kind == "value":
            text = ctx.one(flag)
            if text is not None and row.key in _AS_READ:
                text = _AS_READ[row.key](text)
            value = None if text is None else ctx.typed(row.key, flag, text)
            if value is not None:
                ctx.set(row.key, value, flag)
        else:
            ctx.switch(flag)
            ctx.set(row.key, row.kind == "switch", flag)
    else:
        absent(ctx, row)


def absent(ctx: Ctx, row: F.Row) -> None:
    """Megatron-LM's meaning of a missing argument, where the key matters (and `mcx import --set` left it)."""
    if row.key in ctx.pinned or not F.matters(row, ctx.view_all()):
        return
    key, flag, a = row.key, row.args[0], row.absent
    k = spec_keys()[key]
    if a is F.REQUIRED:
        if k.required:
            ctx.problem(f"{flag} is missing; Megatron-LM and mcx both need it: set {key}")
        else:
            ctx.problem(f"{flag} is missing (Megatron-LM needs it); {key} keeps mcx's default {toml_value(k.default)}")
    elif a is F.DERIVED:
        _DERIVED[key](ctx, row)
    elif a is F.UNMATCHED:
        msg = _UNMATCHED_MESSAGES.get(key, "{flag} is absent; {key} keeps mcx's default {default}")
        ctx.problem(msg.format(flag=flag, key=key, default=toml_value(k.default)))
    elif a is not None and (type(a) is not type(k.default) or a != k.default):
        ctx.set(key, a, flag, "Megatron-LM default")


def _ffn_derived(ctx: Ctx, row: F.Row) -> None:
    hidden = ctx.view("model.hidden_size")
    if ctx.view("model.swiglu") and isinstance(hidden, int):
        ctx.set(row.key, int((4 * hidden * 2 / 3) / 64) * 64, row.args[0],
                "derived: Megatron-LM's size for --swiglu without --ffn-hidden-size")


def data_parallel(ctx: Ctx) -> int | None:
    world = ctx.view("hardware.nodes") * ctx.view("hardware.gpus_per_node")
    model = 1
    for key in ("parallel.tensor", "parallel.pipeline", "parallel.context"):
        model *= ctx.view(key) or 1
    return world // model if world % model == 0 else None


def _gbs_derived(ctx: Ctx, row: F.Row) -> None:
    mbs, dp = ctx.view("train.micro_batch_size"), data_parallel(ctx)
    if dp is None:
        ctx.problem("--global-batch-size is missing and the GPUs do not divide into data-parallel replicas; "
                    "set train.global_batch_size")
        ctx.unread[row.args[0]] = "the GPUs do not divide into data-parallel replicas to derive it from"
        return
    ctx.set(row.key, mbs * dp, row.args[0], f"derived: micro_batch_size {mbs} x data-parallel size {dp}")


_DERIVED: dict[str, Callable[[Ctx, F.Row], None]] = {
    "model.ffn_hidden_size": _ffn_derived,
    "train.global_batch_size": _gbs_derived,
}


# ---- rules (one per rule row, by key)


def _query_groups(ctx: Ctx, row: F.Row) -> None:
    gqa = ctx.switch("--group-query-attention")
    if ctx.has("--num-query-groups"):
        n = ctx.int_of("--num-query-groups")
        if n is None:
            return
        if gqa:
            ctx.set(row.key, n, "--num-query-groups")
        else:
            ctx.problem(f"--num-query-groups {n} without --group-query-attention is ignored by Megatron-LM "
                        "(multi-head attention); model.num_query_groups stays unset")
    elif gqa:
        ctx.set(row.key, 1, "--group-query-attention", "Megatron-LM default: --num-query-groups 1")


def _position(ctx: Ctx, row: F.Row) -> None:
    value = None
    if ctx.has("--use-rotary-position-embeddings"):
        ctx.switch("--use-rotary-position-embeddings")
        value, flag = "rope", "--use-rotary-position-embeddings"
    elif ctx.has("--position-embedding-type"):
        text = ctx.one("--position-embedding-type")
        value, flag = (None if text is None else ctx.typed(row.key, "--position-embedding-type", text)), \
            "--position-embedding-type"
    if value is not None:
        ctx.set(row.key, value, flag)
    elif not ctx.has("--position-embedding-type"):
        ctx.set(row.key, row.absent, "--position-embedding-type", "Megatron-LM default")
    if ctx.switch("--no-position-embedding"):
        if ctx.view(row.key) == "rope":
            ctx.unsupported.append(("--no-position-embedding", "no effect with rotary embeddings"))
        else:
            ctx.problem("--no-position-embedding without rope is refused by Megatron-LM; ignored")


def _transformer_impl(ctx: Ctx, row: F.Row) -> None:
    text = ctx.one("--transformer-impl")
    if text is None:
        if not ctx.has("--transformer-impl"):
            ctx.mapped.append(Mapped("--transformer-impl", row.key, "auto",
                                     "absent: auto is Transformer Engine wherever it is installed"))
        return
    value = ctx.typed(row.key, "--transformer-impl", text)
    if value is not None:
        ctx.set(row.key, value, "--transformer-impl")


def _virtual_pipeline(ctx: Ctx, row: F.Row) -> None:
    per_stage, per_rank = "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"
    pp = ctx.view("parallel.pipeline") or 1
    if ctx.has(per_stage) and ctx.has(per_rank):
        ctx.problem(f"Megatron-LM refuses {per_stage} together with {per_rank}; {per_rank} is used")
    if ctx.has(per_rank):
        flag, value, origin = per_rank, ctx.int_of(per_rank), "script"
    elif ctx.has(per_stage):
        flag, layers, num_layers = per_stage, ctx.int_of(per_stage), ctx.view("model.num_layers")
        if not layers or not isinstance(num_layers, int):
            return
        if num_layers % pp or (num_layers // pp) % layers:
            ctx.problem(f"{per_stage} {layers} does not divide the {num_layers}/{pp} layers of a pipeline stage "
                        "(Megatron-LM refuses it); parallel.virtual_pipeline stays unset")
            return
        value, origin = num_layers // pp // layers, f"derived: {num_layers} layers / {pp} stages / {layers}"
    else:
        if pp > 1:
            ctx.set(row.key, 1, per_stage, "Megatron-LM default: no interleaving")
        return
    if value is None:
        return
    if pp <= 1:
        ctx.problem(f"{flag} needs --pipeline-model-parallel-size above 1; ignored")
        return
    ctx.set(row.key, value, flag, origin)


def _per_batch(ctx: Ctx, flag: str, key: str) -> int | None:
    """A sample count over the global batch, as Megatron-LM steps its sample-based schedules."""
    samples, gbs = ctx.int_of(flag), ctx.view("train.global_batch_size")
    if samples is None or not gbs:
        return None
    if samples % gbs:
        ctx.problem(f"{flag} {samples} is not a multiple of the global batch {gbs}; {key} = {samples // gbs}")
    return samples // gbs


def _train_iters(ctx: Ctx, row: F.Row) -> None:
    if ctx.has("--train-iters"):
        n = ctx.int_of("--train-iters")
        if n is not None:
            ctx.set(row.key, n, "--train-iters")
    elif ctx.has("--train-samples"):
        n = _per_batch(ctx, "--train-samples", row.key)
        if n is not None:
            ctx.set(row.key, n, "--train-samples", "derived: samples / global_batch_size")
    elif row.key not in ctx.pinned:
        ctx.problem("--train-iters (or --train-samples) is missing; set train.train_iters")


def _decay_length(ctx: Ctx) -> int | None:
    if ctx.has("--lr-decay-iters"):
        return ctx.int_of("--lr-decay-iters")
    if ctx.has("--lr-decay-samples"):
        samples, gbs = ctx.int_of("--lr-decay-samples"), ctx.view("train.global_batch_size")
        return samples // gbs if samples is not None and gbs else None
    return ctx.view("train.train_iters")


def _warmup(ctx: Ctx, row: F.Row) -> None:
    if ctx.has("--lr-warmup-iters"):
        n = ctx.int_of("--lr-warmup-iters")
        if ctx.has("--lr-warmup-fraction"):
            ctx.problem("Megatron-LM refuses --lr-warmup-fraction with --lr-warmup-iters; --lr-warmup-iters is used")
        if n is not None:
            ctx.set(row.key, n, "--lr-warmup-iters")
    elif ctx.has("--lr-warmup-fraction"):
        fraction, decay = ctx.float_of("--lr-warmup-fraction"), _decay_length(ctx)
        if fraction is None or decay is None:
            return
        steps = fraction * decay
        n = round(steps)
        if abs(steps - n) > 1e-6 * max(1.0, steps):
            ctx.problem(f"--lr-warmup-fraction {fraction:g} x {decay} decay steps = {steps:g} warmup steps, "
                        f"not whole; train.lr_warmup_iters = {n}")
        ctx.set(row.key, n, "--lr-warmup-fraction", f"derived: {fraction:g} x {decay} decay steps")
    elif ctx.has("--lr-warmup-samples"):
        n = _per_batch(ctx, "--lr-warmup-samples", row.key)
        if n is not None:
            ctx.set(row.key, n, "--lr-warmup-samples", "derived: samples / global_batch_size")


def _decay_iters(ctx: Ctx, row: F.Row) -> None:
    if ctx.has("--lr-decay-iters"):
        n = ctx.int_of("--lr-decay-iters")
        if n is not None:
            ctx.set(row.key, n, "--lr-decay-iters")
    elif ctx.has("--lr-decay-samples"):
        n = _per_batch(ctx, "--lr-decay-samples", row.key)
        if n is not None:
            ctx.set(row.key, n, "--lr-decay-samples", "derived: samples / global_batch_size")


_FP8 = {"hybrid": "fp8-hybrid", "e4m3": "fp8-e4m3"}


def _precision(ctx: Ctx, row: F.Row) -> None:
    bf16, fp16 = ctx.switch("--bf16"), ctx.switch("--fp16")
    if bf16 and fp16:
        ctx.problem("Megatron-LM refuses --bf16 with --fp16; read as --bf16")
        fp16 = False
    value, flag, origin = ("bf16", "--bf16", "script") if bf16 else (
        ("fp16", "--fp16", "script") if fp16 else ("fp32", "--bf16", "Megatron-LM default: neither --bf16 nor --fp16"))
    if ctx.has("--fp8-format"):
        fmt = ctx.one("--fp8-format")
        if fmt in _FP8:
            if not bf16:
                ctx.problem(f"--fp8-format {fmt} with {'fp16' if fp16 else 'fp32'} parameters: mcx's fp8 precisions "
                            "keep bf16 parameters")
            value, flag, origin = _FP8[fmt], "--fp8-format", "script"
        elif fmt is not None:
            ctx.problem(f"--fp8-format {fmt}: mcx supports hybrid and e4m3; train.precision = {toml_value(value)}")
    ctx.set(row.key, value, flag, origin)


def _recompute(ctx: Ctx, row: F.Row) -> None:
    if ctx.has("--recompute-granularity"):
        text = ctx.one("--recompute-granularity")
        value = None if text is None else ctx.typed(row.key, "--recompute-granularity", text)
        if value is not None:
            ctx.set(row.key, value, "--recompute-granularity")
    elif ctx.switch("--recompute-activations"):
        ctx.set(row.key, "selective", "--recompute-activations", "script (deprecated alias of selective)")


def _cuda_graphs(ctx: Ctx, row: F.Row) -> None:
    """--cuda-graph-impl full_iteration is mcx's graphs; the per-layer ones are not run (they do not change the math)."""
    impl = ctx.one("--cuda-graph-impl") if ctx.has("--cuda-graph-impl") else None
    scopes = [v for v in ctx.given.get("--cuda-graph-scope", []) if isinstance(v, str)]
    if impl == "full_iteration" or (impl in (None, "none") and "full_iteration" in scopes):
        ctx.set(row.key, True, "--cuda-graph-impl" if impl else "--cuda-graph-scope")
    elif impl not in (None, "none"):
        ctx.set(row.key, False, "--cuda-graph-impl",
                f"script's {impl} graphs are per layer, which mcx does not run (its graphs are the full iteration's; "
                "either way the math is the same)")


def _data(ctx: Ctx, row: F.Row) -> None:
    """Every data form at once (mcx.interop.data_blend), after data.split, which per-split paths leave unused."""
    import_data(ctx)


_SENTENCEPIECE = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer")


def _tokenizer(ctx: Ctx, row: F.Row) -> None:
    kind_flag = "--tokenizer-type"
    ttype = ctx.one(kind_flag)
    vocab, merges, model = ctx.one("--vocab-file"), ctx.one("--merge-file"), ctx.one("--tokenizer-model")
    used: set[str] = set()
    origin = "script"
    if ttype is None and not ctx.has(kind_flag) and vocab and merges:
        ttype, kind_flag, origin = "GPT2BPETokenizer", "--vocab-file", "derived: GPT-2 vocab and merges files"
    if ttype == "GPT2BPETokenizer":
        if not (vocab and merges):
            ctx.problem("GPT2BPETokenizer needs --vocab-file and --merge-file; set data.tokenizer.path and merges")
        ctx.set(row.key, "gpt2", kind_flag, origin)
        if vocab:
            ctx.set("data.tokenizer.path", vocab, "--vocab-file")
        if merges:
            ctx.set("data.tokenizer.merges", merges, "--merge-file")
        used = {"--vocab-file", "--merge-file"}
    elif ttype == "HuggingFaceTokenizer" or ttype in _SENTENCEPIECE:
        kind = "huggingface" if ttype == "HuggingFaceTokenizer" else "sentencepiece"
        ctx.set(row.key, kind, kind_flag)
        if ttype == "SentencePieceTokenizer":
            ctx.problem("Megatron-LM's SentencePieceTokenizer adds <CLS>/<SEP>/<EOD>/<MASK> to the vocabulary; "
                        "mcx's sentencepiece kind does not (as GPTSentencePieceTokenizer)")
        if model is None:
            ctx.problem(f"{ttype} needs --tokenizer-model; set data.tokenizer.path")
        elif kind == "huggingface" and not model.endswith(".json"):
            ctx.set("data.tokenizer.path", posixpath.join(model, "tokenizer.json"), "--tokenizer-model",
                    "derived: mcx reads the tokenizer.json file of the Hugging Face tokenizer directory")
        else:
            ctx.set("data.tokenizer.path", model, "--tokenizer-model")
        used = {"--tokenizer-model"}
    elif ttype is not None:
        ctx.problem(f"--tokenizer-type {ttype} has no mcx tokenizer kind; data.tokenizer keeps mcx's default "
                    "(kind = \"bpe\", trained on the corpus by mcx data prepare)")
    elif not ctx.has(kind_flag):
        ctx.problem("--tokenizer-type is missing; data.tokenizer keeps mcx's default (kind = \"bpe\")")
    for flag in ("--vocab-file", "--merge-file", "--tokenizer-model"):
        if ctx.has(flag) and flag not in used:
            ctx.unsupported.append((flag, f"not used by --tokenizer-type {ttype}"))


def _checkpoint_dir(ctx: Ctx, row: F.Row) -> None:
    save, load = ctx.one("--save"), ctx.one("--load")
    if save is not None:
        ctx.set(row.key, save, "--save")
        if load is not None and load != save:
            ctx.problem(f"--load {load} differs from --save {save}: mcx resumes from checkpoint.dir only and does "
                        "not initialise from another checkpoint")
    elif load is not None:
        ctx.problem(f"--load {load} without --save: mcx does not initialise from another checkpoint; "
                    "checkpoint.dir stays unset")


def _checkpoint_interval(ctx: Ctx, row: F.Row) -> None:
    n = ctx.int_of("--save-interval") if ctx.has("--save-interval") else None
    iters = ctx.view("train.train_iters")
    if n is None:
        if ctx.view("checkpoint.dir") is not None and not ctx.has("--save-interval"):
            ctx.problem("--save without --save-interval is refused by Megatron-LM; checkpoint.interval = 0 "
                        "(save at the end)")
        return
    if isinstance(iters, int) and n >= iters:
        ctx.set(row.key, 0, "--save-interval", f"derived: {n} >= train_iters, so only the final save")
    else:
        ctx.set(row.key, n, "--save-interval")


def _async_save(ctx: Ctx, row: F.Row) -> None:
    ctx.switch("--use-persistent-ckpt-worker")
    if ctx.switch("--async-save"):
        ctx.set(row.key, True, "--async-save")
    else:
        ctx.set(row.key, False, "--async-save", "Megatron-LM default")


def _nothing(ctx: Ctx, row: F.Row) -> None:
    """Keys a neighbouring rule sets (data.path, data.prefix, data.valid and data.test with data.mix; tokenizer
    files with its kind)."""


RULES: dict[str, Callable[[Ctx, F.Row], None]] = {
    "model.num_query_groups": _query_groups,
    "model.position_embedding_type": _position,
    "model.transformer_impl": _transformer_impl,
    "parallel.virtual_pipeline": _virtual_pipeline,
    "train.train_iters": _train_iters,
    "train.lr_warmup_iters": _warmup,
    "train.lr_decay_iters": _decay_iters,
    "train.precision": _precision,
    "train.recompute_granularity": _recompute,
    "train.cuda_graphs": _cuda_graphs,
    "data.path": _nothing,
    "data.prefix": _nothing,
    "data.tokenizer.kind": _tokenizer,
    "data.tokenizer.path": _nothing,
    "data.tokenizer.merges": _nothing,
    "data.mix": _data,
    "data.valid": _nothing,
    "data.test": _nothing,
    "checkpoint.dir": _checkpoint_dir,
    "checkpoint.interval": _checkpoint_interval,
    "checkpoint.async_save": _async_save,
}
