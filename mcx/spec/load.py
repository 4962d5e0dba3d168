"""Reading specs: TOML -> extends chain -> model preset -> --set overrides -> frozen ExperimentSpec."""

from __future__ import annotations

import copy
import difflib
import errno
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from mcx.errors import SpecError
from mcx.spec import convert
from mcx.spec.presets import PRESETS
from mcx.spec.rules import check_spec
from mcx.spec.schema import ContainerSpec, DebugSpec, EvalSpec, ExperimentSpec, WatchdogSpec

MIXTURE_TABLES = ("mix", "valid", "test")


TEXT_BYTES_LIMIT = 4 * 1024 * 1024  # a spec or launch script is kilobytes; more is the wrong file


def parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``; nesting too deep for its recursive parser is malformed TOML too."""
    try:
        return tomllib.loads(text)
    except RecursionError:  # an array or inline table nested thousands deep
        raise tomllib.TOMLDecodeError("arrays or tables nested too deep (end of document)") from None


def read_regular_bytes(path: Path, limit: int | None = TEXT_BYTES_LIMIT) -> bytes:
    """A regular file's bytes, at most ``limit`` (None: any size). A device, FIFO or socket, a file under /proc
    or /sys (/dev/zero and /proc/self/... never end; a FIFO with no writer never answers), or a larger file
    is an OSError saying so."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer would block the open
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(st.st_mode) or str(Path(path).resolve()).startswith(("/proc/", "/sys/")):
            raise OSError(errno.EINVAL, "not a regular file: a device, FIFO or kernel file", str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", str(path))
    return data


def read_regular_text(path: Path, limit: int = TEXT_BYTES_LIMIT) -> str:
    """``read_regular_bytes`` as UTF-8 text (UnicodeDecodeError where it is not)."""
    return read_regular_bytes(path, limit).decode("utf-8")


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = read_regular_text(path)
    except FileNotFoundError:
        raise SpecError([("", f"file not found: {path}; check the path")]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError([("", f"cannot read {path}: {exc.__class__.__name__}; give a UTF-8 TOML file")]) from None
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EIO, ...
        raise SpecError([("", f"cannot read {path}: {exc.strerror}; check the path")]) from None
    try:
        return parse_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([("", f"malformed TOML: {exc}; fix the syntax there")], str(path)) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins; tables merge key by key, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve_extends(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise SpecError([("extends", f"cycle: {cycle}; remove one of these extends")], str(chain[0]))
    data = read_toml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise SpecError([("extends", "expected a string path to another spec")], str(path))
    parent_path = (path.parent / parent)
    try:
        found = parent_path.exists()
    except OSError as exc:
        raise SpecError([("extends", f"{parent!r}: {exc.strerror}; fix the path")], str(path)) from None
    if not found:
        raise SpecError([("extends", f"{parent!r} not found (looked at {parent_path}); fix the path")], str(path))
    return deep_merge(_resolve_extends(parent_path, (*chain, path)), data)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``section.key=value``; value is read as a TOML value, else taken as a bare string."""
    if "=" not in item:
        raise SpecError([("--set", f"{item!r} is not KEY=VALUE; write e.g. --set train.lr=3e-4")])
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(p and p.replace("_", "").replace("-", "").isalnum() for p in parts):
        raise SpecError([("--set", f"{key!r} is not a dotted key; write e.g. --set parallel.tensor=2")])
    value = raw.strip()
    try:
        parsed = parse_toml(f"v = {value}")
    except tomllib.TOMLDecodeError:
        parsed = {"v": value}
    # one --set sets one key: 'train.lr=1\nname="x"' parses as two, and a bare value spanning lines hides one
    if set(parsed) != {"v"} or (parsed["v"] == value and any(c in value for c in "\r\n")):
        raise SpecError([("--set", f"{item!r} spans lines; give one KEY=VALUE per --set")])
    return parts, parsed["v"]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for item in overrides:
        parts, value = parse_override(item)
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise SpecError([(".".join(parts), f"{p!r} is not a table; cannot set a key inside it")])
            node = nxt
        node[parts[-1]] = value
    return out


def apply_preset(data: dict[str, Any]) -> dict[str, Any]:
    model = data.get("model")
    if not isinstance(model, dict) or "preset" not in model:
        return data
    name = model["preset"]
    if not isinstance(name, str) or name not in PRESETS:
        near = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"did you mean '{near[0]}'?" if near else f"use one of {', '.join(sorted(PRESETS))}"
        raise SpecError([("model.preset", f"unknown preset {name!r}; {hint}")])
    return {**data, "model": {**PRESETS[name], **model}}


def resolve_dict(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The raw, merged spec table (before structuring)."""
    data = _resolve_extends(Path(path), ())
    data = apply_overrides(data, list(overrides))
    return apply_preset(data)


def load_spec(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> ExperimentSpec:
    """Load, merge, override, structure and check a spec; raise one SpecError with every problem."""
    data = resolve_dict(path, overrides)
    spec = convert.structure(data, ExperimentSpec, str(path))
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems, str(path))
    return spec


def loads_spec(text: str, source: str = "<string>") -> ExperimentSpec:
    """Structure a spec from TOML text (used for resolved specs written into run directories)."""
    try:
        data = parse_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([("", f"malformed TOML: {exc}; fix the syntax there")], source) from None
    spec = convert.structure(apply_preset(data), ExperimentSpec, source)
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def with_debug(spec: ExperimentSpec, overrides: list[str] | tuple[str, ...], source: str) -> ExperimentSpec:
    """``spec`` with ``--set debug.KEY=VALUE`` items applied (`mcx reproduce`: the recorded run with a
    fault injected). Any other key is refused: it would rerun another experiment, not this one."""
    others = [item for item in overrides if parse_override(item)[0][0] != "debug"]
    if others:
        raise SpecError([("--set", f"{item!r}: only debug.* keys (fault injection) can be set on a rerun of a "
                                   "recorded spec; run the changed spec with `mcx run` instead") for item in others])
    spec = convert.structure(apply_overrides(_drop_none(spec_to_dict(spec)), list(overrides)), ExperimentSpec, source)
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


def spec_to_dict(spec: ExperimentSpec) -> dict[str, Any]:
    """The resolved spec as plain data (None kept: it means "let mcx decide"). A [debug] table that
    injects nothing is left out, so a spec without one hashes, records and dumps as before it existed (and an unset
debug.swap_micro_batches_at_step, as before that key existed); so are
    empty mixture tables ([data.mix], [data.valid], [data.test]), a [launch.container] that names no image, a
    [launch.watchdog] table at its defaults, an [eval] table that evaluates nothing and train.cuda_graphs off."""
    tree: dict[str, Any] = convert.unstructure(spec)
    if spec.debug == DebugSpec():
        del tree["debug"]
    else:  # keys newer than the table: unset, a [debug] table hashes as it did before them (D69, D70)
        for key in ("perturb_output", "swap_micro_batches_at_step"):
            if getattr(spec.debug, key) is None:
                del tree["debug"][key]
    if spec.launch.container == ContainerSpec():
        del tree["launch"]["container"]
    if spec.launch.watchdog == WatchdogSpec():  # at its defaults: recorded and hashed as before it existed
        del tree["launch"]["watchdog"]
    if spec.eval == EvalSpec():  # likewise no [eval]: a spec without one records as before it existed (D68)
        del tree["eval"]
    else:  # an [eval] without `every` (D71), on the default model interface (D72), records as before those keys
        for key, default in (("every", None), ("model", EvalSpec().model)):
            if getattr(spec.eval, key) == default:
                del tree["eval"][key]
    if not spec.train.cuda_graphs:  # off, train hashes as it did before the key existed (D75)
        del tree["train"]["cuda_graphs"]
    for table in MIXTURE_TABLES:  # likewise a single dataset's spec: no empty mixture tables (D60)
        if not tree["data"][table]:
            del tree["data"][table]
    return tree


def dump_spec(spec: ExperimentSpec) -> str:
    """The resolved spec as TOML (None values left out, which reads back to the same spec)."""
    return tomli_w.dumps(_drop_none(spec_to_dict(spec)))
