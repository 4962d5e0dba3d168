"""Megatron-LM launch script -> mcx spec: ``import_script`` and ``import_file``.

The imported spec describes the experiment the script runs: arguments the script leaves out take
Megatron-LM's defaults (``absent`` in mcx/interop/flags.py), which often differ from mcx's. Every
argument lands in exactly one place: ``mapped`` (with the spec key), ``unsupported`` (with the
reason), or ``problems`` (what could not be carried over exactly: unknown values, undecidable
branches, values mcx cannot express). Nothing in the script is ever run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w
from attrs import field, frozen

from mcx.errors import InputError, SpecError
from mcx.interop import carried
from mcx.interop import flags as F
from mcx.interop.corrections import apply_corrections
from mcx.interop.expand import Unknown
from mcx.interop.flag_rules import RULES, plain
from mcx.interop.launcher import launcher_values
from mcx.interop.notes import family_notes
from mcx.interop.options import check_options
from mcx.interop.overrides import check_required, pin_overrides, plan_notes
from mcx.interop.pretrain_args import Ctx, Mapped, split_args
from mcx.interop.script import Launch, read_script
from mcx.plan.memory import ALLOCATOR_ENV, ALLOCATOR_VALUE, allocator_items, other_allocator_items
from mcx.spec import convert
from mcx.spec.keys import nest, spec_keys
from mcx.spec.load import apply_preset, read_regular_text
from mcx.spec.presets import PRESETS
from mcx.spec.rules import check_spec
from mcx.spec.schema import ExperimentSpec


@frozen
class ImportResult:
    spec_dict: dict[str, Any]  # the spec as TOML tables; loads with mcx.spec
    spec: ExperimentSpec  # the same, structured and checked
    mapped: list[Mapped]  # argument -> spec key, value, and where the value came from
    unsupported: list[tuple[str, str]]  # (argument, reason) for arguments with no spec key
    problems: list[str]  # what could not be carried over exactly
    notes: list[str] = field(factory=list)  # carried over exactly, but maybe not what the script's author meant


def _entry_check(launch: Launch, name: str, problems: list[str]) -> None:
    entry = launch.entry
    if isinstance(entry, str):
        base = entry.rsplit("/", 1)[-1]
        if base != "pretrain_gpt.py":
            raise InputError(f"{name} launches {base} (line {launch.line});",
                             "mcx imports GPT pretraining scripts, which run pretrain_gpt.py.")
    else:
        problems.append(f"line {launch.line}: the training script is unknown ({entry.reason}); "
                        "read as pretrain_gpt.py")


def _infer_preset(flat: dict[str, Any]) -> str | None:
    keys = spec_keys()
    resolved = {k.removeprefix("model."): flat.get(k, keys[k].default) for k in keys if k.startswith("model.")}
    for preset in sorted(PRESETS):
        values = PRESETS[preset]
        if all(type(resolved.get(k)) is type(v) and resolved.get(k) == v for k, v in values.items()):
            return preset
    return None


def import_script(text: str, *, name: str, description: str | None = None, env: Mapping[str, str] | None = None,
                  args: Sequence[str] = (), overrides: Sequence[str] = (), source: str | None = None) -> ImportResult:
    """Import a Megatron-LM launch script (bash) as an mcx spec.

    ``name`` becomes the spec's name; ``env`` and ``args`` give what the script would take from its
    environment and command line; ``overrides`` are ``KEY=VALUE`` items as `mcx plan --set` takes
    them, which win over the script; ``source`` names the script in messages (default: ``name``).
    Raises InputError when the script has no pretrain_gpt.py launch, is not valid bash, passes an
    argument Megatron-LM does not know, or lacks a required value (such as --lr) that no override
    gives; SpecError (with every problem) when the result is not a valid spec.
    """
    script = read_script(text, env=env, args=args)
    problems = list(script.problems)
    launch = script.launch
    if launch is None:
        raise InputError(f"no pretrain_gpt.py launch found in {name};",
                         "mcx import reads the torchrun/srun/python command that starts pretrain_gpt.py; "
                         "if it sits in another script, import that one.")
    _entry_check(launch, name, problems)
    check_options(launch, source or name)
    unsupported: list[tuple[str, str]] = []
    given = split_args(launch, unsupported, problems)
    ctx = Ctx(given=given, problems=problems, line=launch.line, unsupported=unsupported)
    pin_overrides(ctx, overrides)
    launcher_values(ctx, launch, script.sbatch, unsupported)
    _allocator(ctx, launch)
    ctx.flat.setdefault("name", name)
    ctx.flat.setdefault("description", description or "Imported from a Megatron-LM launch script by mcx import.")
    for row in F.FLAGS:
        if row.kind in ("launcher", "mcx"):
            continue
        if row.kind == "rule":
            RULES[row.key](ctx, row)
        else:
            plain(ctx, row)
    _complete(ctx, name, source or name)
    preset = None if "model.preset" in ctx.pinned else _infer_preset(ctx.flat)
    flat = dict(ctx.flat)
    if preset is not None:
        flat = {k: v for k, v in flat.items()
                if not (k.startswith("model.") and k.removeprefix("model.") in PRESETS[preset]
                        and PRESETS[preset][k.removeprefix("model.")] == v)}
        flat["model.preset"] = preset
        ctx.mapped.append(Mapped("", "model.preset", preset, "derived: every key of the preset matches"))
    flat = carried.apply(text, flat, script, ctx)  # the `# mcx:` lines of a script mcx export wrote
    spec_dict = nest(flat)
    spec = _structure(spec_dict, name, problems)
    return ImportResult(spec_dict=spec_dict, spec=spec, mapped=ctx.mapped, unsupported=unsupported, problems=problems,
                        notes=ctx.notes)


def _complete(ctx: Ctx, name: str, source: str) -> None:
    """After the rows: every required value present, Megatron-LM's own overrides applied, notes added."""
    check_required(ctx, source)
    apply_corrections(ctx)
    ctx.notes.extend(family_notes(ctx, name) + plan_notes(ctx))


def _allocator(ctx: Ctx, launch: Launch) -> None:
    """``train.expandable_segments`` from the PYTORCH_CUDA_ALLOC_CONF the launch runs with."""
    conf = launch.allocator
    if conf is None:
        return
    if isinstance(conf, Unknown):
        ctx.problem(f"{ALLOCATOR_ENV} is not known before run time ({conf.reason}); train.expandable_segments "
                    "stays false")
        return
    if ALLOCATOR_VALUE in allocator_items(conf):
        ctx.set("train.expandable_segments", True, f"{ALLOCATOR_ENV}={conf}", "environment")
    others = other_allocator_items(conf)
    if others:
        ctx.problem(f"{ALLOCATOR_ENV} sets {','.join(others)}, which no spec key carries")


def _structure(spec_dict: dict[str, Any], name: str, problems: list[str]) -> ExperimentSpec:
    try:
        spec = convert.structure(apply_preset(spec_dict), ExperimentSpec, name)
    except SpecError as exc:
        raise SpecError([*exc.problems, *[("", p) for p in problems]], f"the spec imported from {name}") from None
    found = check_spec(spec)
    if found:
        raise SpecError([*found, *[("", p) for p in problems]], f"the spec imported from {name}")
    return spec


def to_toml(result: ImportResult, source: str) -> str:
    """The spec as TOML, headed by comments listing what the import could not carry over."""
    lines = [f"# Imported from {source} by `mcx import`.", "# Check the notes below, then `mcx plan` this spec."]
    if result.unsupported:
        lines.append("#")
        lines.append("# Arguments with no spec key:")
        lines.extend(f"#   {flag}: {reason}" for flag, reason in result.unsupported)
    if result.problems:
        lines.append("#")
        lines.append("# Not carried over exactly:")
        lines.extend(f"#   {p}" for p in result.problems)
    if result.notes:
        lines.append("#")
        lines.append("# Notes:")
        lines.extend(f"#   {n}" for n in result.notes)
    return "\n".join(lines) + "\n\n" + tomli_w.dumps(result.spec_dict)


def summary(result: ImportResult) -> str:
    """A short report for the terminal: what was mapped, what has no spec key, what to check."""
    lines = [f"mapped {len({m.key for m in result.mapped})} spec keys"
             + (f" (model.preset = \"{result.spec.model.preset}\")" if result.spec.model.preset else "")]
    if result.unsupported:
        lines.append(f"{len(result.unsupported)} arguments with no spec key:")
        lines.extend(f"  {flag}: {reason}" for flag, reason in result.unsupported)
    if result.problems:
        lines.append(f"{len(result.problems)} things to check:")
        lines.extend(f"  {p}" for p in result.problems)
    if result.notes:
        lines.append(f"{len(result.notes)} note{'s' if len(result.notes) > 1 else ''}:")
        lines.extend(f"  {n}" for n in result.notes)
    return "\n".join(lines)


def spec_name(path: Path) -> str:
    """A valid spec name from a script's file name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).lstrip("._-")[:100]
    return name or "imported"


def import_file(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
                args: Sequence[str] = (), overrides: Sequence[str] = ()) -> tuple[str, ImportResult]:
    """Read and import a launch script: (TOML text to write, the result). InputError if unreadable."""
    p = Path(path)
    try:
        text = read_regular_text(p)
    except FileNotFoundError:
        raise InputError(f"launch script not found: {p};", "check the path.") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {p} ({exc.__class__.__name__});", "give a readable UTF-8 bash script.") from None
    except OSError as exc:  # a device, FIFO or /proc file (they never end), a huge file, a name too long
        raise InputError(f"cannot read {p} ({exc.strerror});", "give a readable UTF-8 bash script.") from None
    result = import_script(text, name=spec_name(p), description=f"Imported from the Megatron-LM script {p.name}.",
                           env=env, args=args, overrides=overrides, source=p.name)
    return to_toml(result, p.name), result
