"""Megatron-LM's data blends <-> a spec's [data] (D60): ``--data-path`` (one prefix, or weighted ``W1 P1 W2 P2``),
``--data-args-path`` (a file of the same words), ``--train/--valid/--test-data-path`` and
``--per-split-data-args-path`` (a JSON file ``{"train": ..., "valid": ..., "test": ...}``), as Megatron-LM's
``get_blend_and_blend_per_split`` reads them.

One unweighted prefix is ``data.path`` and ``data.prefix``, as before mixtures; anything else is a mixture
whose components are named after their prefix (``web_text_document``), or after the prefix's directory
where the prefix is mcx's ``corpus`` (``datasets/web/corpus`` -> ``web``). An unweighted list of several
prefixes is weighted by Megatron-LM by the datasets' sizes, which a script does not say: refused.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any

from mcx.interop.pretrain_args import Ctx
from mcx.interop.script import Unknown

SPLITS = ("train", "valid", "test")
PER_SPLIT_FLAGS = {"train": "--train-data-path", "valid": "--valid-data-path", "test": "--test-data-path"}
TABLES = {"train": "data.mix", "valid": "data.valid", "test": "data.test"}
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
DEFAULT_SPLIT = "969,30,1"  # mcx's data.split default, which a per-split mixture leaves as it is
FIX = "set data.path and data.prefix, or [data.mix.NAME] tables"


def _weighted(words: list[str]) -> bool:
    """Megatron's get_blend_from_list: an even count whose every other word is a number holds weights."""
    try:
        return len(words) % 2 == 0 and all(float(w) >= 0 for w in words[::2])
    except ValueError:
        return False


def _split_prefix(prefix: str) -> tuple[str, str]:
    head, tail = posixpath.split(prefix.rstrip("/"))
    return head or ".", tail


def _name(path: str, prefix: str, taken: set[str]) -> str:
    base = posixpath.basename(path.rstrip("/")) if prefix == "corpus" and path not in (".", "") else prefix
    name = _NAME_CHARS.sub("_", base).lstrip("_-")[:60] or "component"
    unique, n = name, 2
    while unique in taken:
        unique, n = f"{name}-{n}", n + 1
    taken.add(unique)
    return unique


def components(words: list[str]) -> dict[str, dict[str, Any]] | None:
    """``W1 P1 W2 P2 ...`` as mixture tables; None where the words are not a weighted blend."""
    if not _weighted(words):
        return None
    taken: set[str] = set()
    out: dict[str, dict[str, Any]] = {}
    for weight, prefix in zip(words[::2], words[1::2], strict=True):
        path, tail = _split_prefix(prefix)
        out[_name(path, tail, taken)] = {"path": path, "prefix": tail, "weight": float(weight)}
    return out


def _words(ctx: Ctx, flag: str) -> list[str] | None:
    values = ctx.given.get(flag)
    if not values:
        return None
    unknown = [v for v in values if isinstance(v, Unknown)]
    if unknown:
        ctx.problem(f"{flag}: {unknown[0].reason}; {FIX}")
        ctx.unread[flag] = unknown[0].reason
        return None
    return [str(v) for v in values]


def _read_file(ctx: Ctx, flag: str) -> str | None:
    """The file a data-args flag names, read where `mcx import` runs (Megatron-LM reads it where it starts)."""
    name = ctx.one(flag)
    if name is None:
        return None
    try:
        return Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        ctx.problem(f"{flag} {name}: cannot read it here ({exc.__class__.__name__}); run `mcx import` where the "
                    f"file is, or {FIX}")
        ctx.unread[flag] = f"{name} is not readable here"
        return None


def _set_blend(ctx: Ctx, words: list[str], flag: str, table: str, allow_single: bool) -> bool:
    """One split's blend into ``table`` (or data.path/prefix for a single prefix where ``allow_single``)."""
    if len(words) == 1 and allow_single:
        path, tail = _split_prefix(words[0])
        ctx.set("data.path", path, flag, "script: the directory of the prefix")
        ctx.set("data.prefix", tail, flag, "script: the file prefix")
        return True
    if len(words) == 1:  # a split's single dataset: a mixture of one
        words = ["1.0", words[0]]
    parts = components(words)
    if parts is None:
        ctx.problem(f"{flag} lists {len(words)} prefixes without weights, which Megatron-LM weights by the datasets' "
                    f"sizes; mcx needs the weights: write {flag} W1 P1 W2 P2 ..., or {FIX}")
        ctx.unread[flag] = "prefixes without weights, which Megatron-LM weights by the datasets' sizes"
        return False
    ctx.set(table, parts, flag, "script: components named after their prefixes")
    return True


def import_data(ctx: Ctx) -> None:
    """data.path / data.prefix or data.mix (data.valid, data.test) from whichever form the script uses."""
    if "data.path" in ctx.pinned or "data.mix" in ctx.pinned:
        return
    if ctx.has("--data-path") or ctx.has("--data-args-path"):
        flag = "--data-path" if ctx.has("--data-path") else "--data-args-path"
        if ctx.has("--data-path") and ctx.has("--data-args-path"):
            ctx.problem("--data-path and --data-args-path are both given, which Megatron-LM refuses; imported "
                        "--data-path")
        text = _read_file(ctx, flag) if flag == "--data-args-path" else None
        words = _words(ctx, flag) if flag == "--data-path" else (text.split() if text is not None else None)
        if words:
            _set_blend(ctx, words, flag, "data.mix", allow_single=True)
        elif text is not None:
            ctx.problem(f"{flag}: the file lists no dataset; {FIX}")
        return
    per_split = {split: _words(ctx, flag) for split, flag in PER_SPLIT_FLAGS.items()}
    if ctx.has("--per-split-data-args-path"):
        text = _read_file(ctx, "--per-split-data-args-path")
        try:
            doc = json.loads(text) if text is not None else None
            per_split = {split: (v.split() if isinstance(v, str) else [str(w) for w in v] if v else None)
                         for split in SPLITS for v in [doc[split]]} if doc is not None else per_split
        except (ValueError, KeyError, TypeError):
            ctx.problem(f"--per-split-data-args-path: not a JSON object with train, valid and test lists; {FIX}")
            return
    if not any(per_split.values()):
        ctx.problem(f"--data-path is missing: mcx trains on a prepared dataset; {FIX}")
        return
    if not per_split["train"]:
        ctx.problem(f"--train-data-path is missing beside the validation or test paths; {FIX}")
        return
    if ctx.has("--split"):
        ctx.problem("--split is given with per-split data paths, which Megatron-Core refuses (split and "
                    "blend_per_split are incompatible); data.split keeps its default, which mcx does not use here")
        ctx.set("data.split", DEFAULT_SPLIT, "--split", "derived: not used with per-split paths")
    for split, words in per_split.items():
        if words:
            _set_blend(ctx, words, "--per-split-data-args-path" if ctx.has("--per-split-data-args-path")
                       else PER_SPLIT_FLAGS[split], TABLES[split], allow_single=False)


def _blend_words(mixture: dict[str, Any]) -> list[str]:
    return [w for part in mixture.values()
            for w in (repr(float(part.weight)), posixpath.join(part.path, part.prefix)
                      if part.path not in ("", ".") else part.prefix)]


def export_data(flat: dict[str, Any]) -> list[str]:
    """The spec's data as Megatron-LM arguments: --data-path (one prefix, or weighted), or the per-split paths."""
    if flat["data.path"] is not None:
        path = flat["data.path"]
        return ["--data-path", posixpath.join(path, flat["data.prefix"]) if path not in ("", ".") else flat["data.prefix"]]
    if not (flat["data.valid"] or flat["data.test"]):
        return ["--data-path", *_blend_words(flat["data.mix"])]
    out = ["--train-data-path", *_blend_words(flat["data.mix"])]
    for split in ("valid", "test"):
        if flat[f"data.{split}"]:
            out += [PER_SPLIT_FLAGS[split], *_blend_words(flat[f"data.{split}"])]
    return out
