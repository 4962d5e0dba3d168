"""Spec values no Megatron-LM argument carries, as ``# mcx:`` lines in an exported script.

`mcx export` writes one line for each key where importing the exported command alone would give
another value than the spec's, the value as JSON (``null``: unset, e.g. "the planner chooses")::

    # mcx: hardware.gpu = "H200"
    # mcx: parallel.tensor = null
    # mcx: arguments = "sha256:..."

`mcx import` applies them after mapping the command, so the spec (and its run ID) comes back.
``arguments`` is a digest of the launch command and the #SBATCH lines as exported. Lines for keys
the command itself carries (arguments, launcher options, and the preset that names the model
arguments) apply only while that digest matches: once someone edits the command, the edited
arguments decide those keys, and the import says which lines it left out. Lines for mcx-only keys
(``smoke.*``, ``hardware.gpu``, ...) apply either way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mcx.hashing import canonical_json, digest
from mcx.interop import flags as F
from mcx.interop.expand import Partial
from mcx.spec.keys import flatten, spec_keys
from mcx.interop.pretrain_args import Ctx, Mapped
from mcx.interop.script import Script
from mcx.spec.convert import unstructure
from mcx.spec.presets import PRESETS
from mcx.spec.schema import ExperimentSpec

DIGEST = "arguments"
_LABELS = ("name", "description")  # the import's own arguments give these
_NOT_CARRIED = ("sweep",)  # a launch script is one run: a sweep's base point (its trials are `mcx sweep`'s)
_LINE = re.compile(r"#\s*mcx:\s*(\S+)\s*=\s*(.*?)\s*")
HEAD = ["#", "# Spec values no Megatron-LM argument carries, read back by `mcx import` (bash ignores them);",
        "# the ones the command also sets apply only while the command is as exported."]


def _word(w: Any) -> Any:
    # Unknown parts stand as null: their reasons name lines, which these comment lines shift.
    if isinstance(w, str):
        return w
    if isinstance(w, Partial):
        return [p if isinstance(p, str) else None for p in w.pieces]
    return None


def command_digest(script: Script) -> str:
    """The digest of the launch command and #SBATCH options, as the importer reads them."""
    words = [] if script.launch is None else [_word(w) for w in script.launch.words]
    return "sha256:" + digest({"command": words, "sbatch": [list(o) for o in script.sbatch]})


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def lines(spec: ExperimentSpec, plain: ExperimentSpec, command: str) -> list[str]:
    """The ``# mcx:`` lines for ``spec``, whose exported command alone imports as ``plain``."""
    want, got = flatten(spec), flatten(plain)
    keys = [k for k in want if k not in (*_LABELS, *_NOT_CARRIED) and not _same(want[k], got[k])]
    if not keys:
        return []
    # a mixture's tables as plain data (its components' names are the import's guess otherwise)
    return [*HEAD, *[f"# mcx: {k} = {canonical_json(unstructure(want[k]))}" for k in keys],
            f'# mcx: {DIGEST} = "{command}"']


def _from_command(key: str) -> bool:
    """Keys the command sets too: an edited argument must win over their lines."""
    return F.BY_KEY[key].kind != "mcx" or key == "model.preset"


def _read(text: str, problems: list[str]) -> tuple[dict[str, tuple[int, Any]], Any]:
    values: dict[str, tuple[int, Any]] = {}
    command = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _LINE.fullmatch(line.strip())
        if m is None:
            continue
        key, raw = m.groups()
        try:
            value = json.loads(raw)
        except ValueError:
            problems.append(f"line {n}: `# mcx: {key}` holds no JSON value ({raw!r}); ignored")
            continue
        if key == DIGEST:
            command = value
        elif key in spec_keys() and key not in _LABELS:
            values[key] = (n, value)
        else:
            problems.append(f"line {n}: `# mcx: {key}` names no spec key; ignored")
    return values, command


def _preset(flat: dict[str, Any]) -> dict[str, Any]:
    """What ``flat``'s model.preset sets (nothing without one)."""
    name = flat.get("model.preset")
    return PRESETS.get(name, {}) if isinstance(name, str) else {}


def _with_preset(flat: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    """``flat`` with model.preset = ``name`` (None: no preset), the model unchanged; None if it cannot be."""
    keys = spec_keys()
    out = {k: v for k, v in flat.items() if k != "model.preset"}
    for k, v in _preset(flat).items():  # spell out the preset found
        out.setdefault(f"model.{k}", v)
    if name is None:
        return out
    for k, p in PRESETS[name].items():  # leave out what the named preset gives
        key = f"model.{k}"
        v = out.get(key, keys[key].default)
        if _same(v, p):
            out.pop(key, None)
        elif v is None:
            return None  # unset here but set by the preset: TOML cannot say "unset"
        else:
            out[key] = v
    out["model.preset"] = name
    return out


def _view(flat: dict[str, Any]) -> dict[str, Any]:
    """Every key's value in ``flat``: set, given by its preset, or mcx's default."""
    model = {f"model.{k}": v for k, v in _preset(flat).items()}
    return {**{k: key.default for k, key in spec_keys().items()}, **model, **flat}


def apply(text: str, flat: dict[str, Any], script: Script, ctx: Ctx) -> dict[str, Any]:
    """``flat`` (the imported keys) with the script's ``# mcx:`` lines applied; notes go to ``ctx``."""
    values, command = _read(text, ctx.problems)
    if not values:
        return flat
    unchanged = command == command_digest(script)
    out, edited = dict(flat), []
    moot: list[tuple[str, str]] = []  # a key no longer applied, and the condition it needs
    for key, (n, value) in values.items():
        if key in ctx.pinned:  # `mcx import --set` wins over a carried line too
            continue
        if not unchanged and _from_command(key):
            edited.append(key)
            continue
        when = F.BY_KEY[key].when
        if not unchanged and when is not None and not F.WHEN[when][1](_view(out)):  # e.g. fp8_attention, fp8 edited out
            moot.append((key, F.WHEN[when][0]))
            continue
        if key == "model.preset":
            if value is not None and value not in PRESETS:
                ctx.problems.append(f"line {n}: `# mcx: model.preset` names no preset ({value!r}); ignored")
                continue
            preset = _with_preset(out, value)
            if preset is None:
                ctx.problems.append(f"line {n}: model.preset = {value!r} would set model keys the command leaves "
                                    "unset; ignored")
                continue
            out = preset
        elif value is None:
            out.pop(key, None)  # every optional key's default is None: unset
        else:
            out[key] = value
        ctx.mapped.append(Mapped(f"# mcx: {key}", key, value, f"line {n}: written by mcx export"))
    if edited:
        ctx.problems.append("the launch command is not the one `mcx export` wrote (edited?), so its arguments decide "
                            f"{', '.join(edited)}; their `# mcx:` lines are not applied")
    for key, condition in moot:
        ctx.problems.append(f"the `# mcx: {key}` line is not applied: the key matters only when "
                            f"{condition}, which the edited command no longer says")
    return out
