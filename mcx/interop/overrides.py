"""What `mcx import SCRIPT --set KEY=VALUE` adds to a script, and what a script must give.

``--set`` reads KEY=VALUE exactly as `mcx plan --set` does (mcx/spec/load.py: dotted spec key, the
value as a TOML value, else a bare string; the strict converter types it when the spec is built).
The values win over the script and over Megatron-LM's defaults, and the mapping records them with
the origin "--set". A required value that neither the script nor ``--set`` gives stops the import
with one message naming every missing argument and the ``--set`` that supplies it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from mcx.errors import InputError, SpecError
from mcx.interop import flags as F
from mcx.spec.keys import spec_keys
from mcx.interop.pretrain_args import Ctx
from mcx.spec.load import parse_override
from mcx.spec.presets import PRESETS

# Placeholders in the --set hint where VALUE alone would not say what goes there.
_PLACEHOLDER = {"data.path": "DIR", "data.prefix": "PREFIX"}
# Keys an argument carries together with a required one: --data-path DIR/PREFIX gives both.
_ALONG = {"data.path": ("data.prefix",)}


def pin_overrides(ctx: Ctx, overrides: Sequence[str]) -> None:
    """Put each ``--set`` value into the import before the script is read, so rules read it too."""
    keys = spec_keys()
    for item in overrides:
        parts, value = parse_override(item)
        key = ".".join(parts)
        if not any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1)):  # a key, or inside a table key
            near = difflib.get_close_matches(key, list(keys), n=1)
            raise SpecError([(key, "unknown key" + (f"; did you mean '{near[0]}'?" if near else ""))], "--set")
        ctx.pin(key, value)


def _given_by_preset(ctx: Ctx) -> set[str]:
    preset = ctx.flat.get("model.preset") if "model.preset" in ctx.pinned else None
    return {f"model.{k}" for k in PRESETS.get(preset, {})} if isinstance(preset, str) else set()


def check_required(ctx: Ctx, source: str) -> None:
    """InputError naming every required value neither the script nor --set gives (one paragraph)."""
    have = set(ctx.flat) | _given_by_preset(ctx)
    # data.path is required unless a mixture stands in its place (D60)
    missing = [k for k, key in spec_keys().items()
               if (key.required or k == "data.path") and k not in have and not (k == "data.path" and "data.mix" in have)]
    if not missing:
        return
    items, sets = [], []
    for key in missing:
        row = F.BY_KEY[key]
        flag = row.args[0] + (f" (or {', '.join(row.args[1:])})" if len(row.args) > 1 else "")
        why = next((ctx.unread[a] for a in row.args if a in ctx.unread), None)
        items.append(f"{flag} (its value cannot be read: {why})" if why else flag)
        for k in (key, *_ALONG.get(key, ())):
            if k == key or k not in have:
                sets.append(f"--set {k}={_PLACEHOLDER.get(k, 'VALUE')}")
    listed = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    raise InputError(f"{source} does not give {listed}, which Megatron-LM and mcx both need;",
                     f"add {' '.join(sets)} to the mcx import command.")


def plan_notes(ctx: Ctx) -> list[str]:
    """Values `mcx plan` needs that a Megatron-LM script leaves to files that may not be on the planning machine."""
    kind = ctx.view("data.tokenizer.kind")
    if ctx.view("model.vocab_size") is None and kind in ("huggingface", "sentencepiece"):
        return [f"model.vocab_size is unset: Megatron-LM reads the vocabulary from the {kind} tokenizer file, which "
                "mcx plan reads only where that file is; to plan elsewhere, give the tokenizer's size: "
                "--set model.vocab_size=N"]
    return []
