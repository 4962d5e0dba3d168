"""The one strict cattrs converter for specs, and its error flattening.

Strict means: unknown keys are errors (with a did-you-mean), no silent coercion ("3e-4" is not a
float, 2.5 is not an int, 1 is not a bool), and every problem is reported at once with its path.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
import cattrs.gen
from cattrs.errors import (AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError, IterableValidationError,
                           IterableValidationNote)

from mcx.errors import SpecError
from mcx.spec.schema import DataSpec, SweepRange, SweepValue

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a table",
               tuple: "an array"}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# Megatron-LM's names (and common spellings) for keys mcx names differently: for did-you-mean.
ALIASES = {
    "learning_rate": "lr", "min_learning_rate": "min_lr", "tensor_model_parallel_size": "tensor",
    "pipeline_model_parallel_size": "pipeline", "context_parallel_size": "context",
    "expert_model_parallel_size": "expert", "virtual_pipeline_model_parallel_size": "virtual_pipeline",
    "use_distributed_optimizer": "distributed_optimizer", "warmup_iters": "lr_warmup_iters",
    "save_interval": "interval", "save": "dir", "load": "dir", "num_gpus": "gpus_per_node",
    "nproc_per_node": "gpus_per_node", "nnodes": "nodes", "data_path": "path", "ffn_hidden": "ffn_hidden_size",
}


def toml_value(v: Any) -> str:
    """A scalar as a spec writes it: true, "full", 4."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


class _WrongType(TypeError):
    def __init__(self, value: Any, want: type) -> None:
        got = type(value).__name__
        super().__init__(f"expected {_TYPE_NAMES[want]}, got {got} {toml_value(value)}")


INT64 = (-(1 << 63), (1 << 63) - 1)  # TOML's integers (tomllib and --set read larger ones)


def _strict_int(v: Any, _: type) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _WrongType(v, int)
    if not INT64[0] <= v <= INT64[1]:
        raise ValueError(f"{v} does not fit in 64 bits (TOML integers are 64-bit); use a realistic value")
    return v


def _strict_float(v: Any, _: type) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _WrongType(v, float)
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {toml_value(v)}")
    return float(v)


def _strict_bool(v: Any, _: type) -> bool:
    if not isinstance(v, bool):
        raise _WrongType(v, bool)
    return v


def _strict_str(v: Any, _: type) -> str:
    if not isinstance(v, str):
        raise _WrongType(v, str)
    return v


def _renames(cl: type) -> dict[str, Any]:
    """Fields whose TOML key is not a Python name (``[init] from``): ``field(metadata={"key": "from"})``."""
    return {f.name: cattrs.gen.override(rename=f.metadata["key"]) for f in attrs.fields(cl) if "key" in f.metadata}


def _table_hook_factory(c: cattrs.Converter):
    def factory(cl: type):
        inner: Callable[[Any, Any], Any] = cattrs.gen.make_dict_structure_fn(cl, c, _cattrs_forbid_extra_keys=True,
                                                  _cattrs_detailed_validation=True, **_renames(cl))

        def hook(v: Any, t: type) -> Any:
            if not isinstance(v, dict):
                raise _WrongType(v, dict)
            if cl is DataSpec and "path" not in v and "mix" not in v:  # one of the two: said with the others
                missing = KeyError("path")
                missing.__notes__ = [AttributeValidationNote("required: path or mix", "path", str)]
                try:
                    inner(v, t)
                except ClassValidationError as exc:
                    raise ClassValidationError(exc.message, [*exc.exceptions, missing], cl) from None
                raise ClassValidationError(f"while structuring {cl.__name__}", [missing], cl)
            return inner(v, t)

        return hook

    return factory


def _is_tuple(t: Any) -> bool:
    return get_origin(t) is tuple


def _tuple_hook_factory(c: cattrs.Converter):
    def factory(t: Any):
        item = get_args(t)[0]

        def hook(v: Any, _: Any) -> tuple:
            if not isinstance(v, list):
                raise _WrongType(v, tuple)
            return _each(v, lambda x: c.structure(x, item), t, item)

        return hook

    return factory


def _each(values: list, structure_one: Any, t: Any, item: Any) -> tuple:
    """Each value structured; every failure collected with its index, like cattrs' own iterables."""
    problems, out = [], []
    for i, x in enumerate(values):
        try:
            out.append(structure_one(x))
        except Exception as exc:
            exc.__notes__ = [*getattr(exc, "__notes__", []), IterableValidationNote(f"@ index {i}", i, item)]
            problems.append(exc)
    if problems:
        raise IterableValidationError(f"while structuring {t}", problems, t)
    return tuple(out)


def _is_literal(t: Any) -> bool:
    return get_origin(t) is Literal


def _literal_hook(t: Any):
    allowed = get_args(t)

    def hook(v: Any, _: Any) -> Any:
        if v in allowed and type(v) is type(allowed[0]):
            return v
        choices = ", ".join(toml_value(a) for a in allowed)
        near = difflib.get_close_matches(str(v), [str(a) for a in allowed], n=1)
        extra = f"; did you mean {toml_value(near[0])}?" if near else ""
        raise ValueError(f"{toml_value(v)} is not allowed; use one of {choices}{extra}")

    return hook


def _is_sweep_values(t: Any) -> bool:
    return t == (tuple[SweepValue, ...] | SweepRange)


def _sweep_values_hook(c: cattrs.Converter):
    """A sweep parameter: an array of values (a grid's axis, choices) or a table (a range)."""
    def scalar(x: Any) -> Any:
        if isinstance(x, (bool, int, str)) or (isinstance(x, float) and math.isfinite(x)):
            return x
        raise ValueError(f"{toml_value(x)} is not a value a spec key takes (a string, number or true/false)")

    def hook(v: Any, t: Any) -> Any:
        if isinstance(v, dict):
            return c.structure(v, SweepRange)
        if not isinstance(v, list):
            raise ValueError(f"expected an array of values or a range table {{low = ..., high = ...}}, got "
                             f"{type(v).__name__} {toml_value(v)}")
        return _each(v, scalar, t, Any)

    return hook


@cache
def converter() -> cattrs.Converter:
    c = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True, omit_if_default=False)
    c.register_structure_hook(int, _strict_int)
    c.register_structure_hook(float, _strict_float)
    c.register_structure_hook(bool, _strict_bool)
    c.register_structure_hook(str, _strict_str)
    c.register_structure_hook_factory(_is_literal, _literal_hook)
    c.register_structure_hook_func(_is_sweep_values, _sweep_values_hook(c))
    c.register_structure_hook_factory(_is_tuple, _tuple_hook_factory(c))
    c.register_structure_hook_factory(attrs.has, _table_hook_factory(c))
    c.register_unstructure_hook(tuple, list)
    c.register_unstructure_hook_factory(
        lambda t: attrs.has(t) and bool(_renames(t)),
        lambda cl: cattrs.gen.make_dict_unstructure_fn(cl, c, _cattrs_omit_if_default=False, **_renames(cl)))
    return c


def _field_names(cl: type) -> list[str]:
    return [a.metadata.get("key", a.name) for a in attrs.fields(cl)]


def _join(path: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    if not _BARE_KEY.match(name):
        name = json.dumps(name, ensure_ascii=False)
    return f"{path}.{name}" if path else name


def flatten_errors(exc: BaseException, path: str = "") -> list[tuple[str, str]]:
    """Walk a cattrs validation error tree into (toml.path, message) pairs."""
    out: list[tuple[str, str]] = []
    if isinstance(exc, ClassValidationError):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            sub_path = _join(path, note.name)
            if isinstance(sub, KeyError):
                out.append((sub_path, "required key is missing; add it"))
            else:
                out.extend(flatten_errors(sub, sub_path))
        for sub in without:
            out.extend(flatten_errors(sub, path))
    elif isinstance(exc, IterableValidationError):
        indexed, unindexed = exc.group_exceptions()
        for item, at in indexed:
            out.extend(flatten_errors(item, _join(path, at.index)))
        for item in unindexed:
            out.extend(flatten_errors(item, path))
    elif isinstance(exc, ForbiddenExtraKeysError):
        known = _field_names(exc.cl)
        for key in sorted(exc.extra_fields):
            alias = ALIASES.get(key)
            near = [alias] if alias in known else difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean '{near[0]}'?" if near else f"known keys: {', '.join(known)}"
            out.append((_join(path, key), f"unknown key; {hint}"))
    elif isinstance(exc, BaseExceptionGroup):
        for member in exc.exceptions:
            out.extend(flatten_errors(member, path))
    elif isinstance(exc, (_WrongType, ValueError)):
        out.append((path, str(exc)))
    elif isinstance(exc, (TypeError, AttributeError)):
        out.append((path, f"wrong shape ({exc}); check the value's type"))
    else:
        out.append((path, str(exc)))
    return out


def structure(data: dict[str, Any], cl: type, source: str | None = None) -> Any:
    """Structure ``data`` into ``cl``; every problem becomes one line of a SpecError."""
    if not isinstance(data, dict):
        raise SpecError([("", "the spec must be a TOML table")], source)
    try:
        return converter().structure(data, cl)
    except (ClassValidationError, IterableValidationError, ForbiddenExtraKeysError) as exc:
        raise SpecError(flatten_errors(exc), source) from None


def unstructure(obj: Any) -> Any:
    return converter().unstructure(obj)


def field_types(cl: type) -> dict[str, Any]:
    """Resolved annotations of an attrs class (used by docs and fuzz tests)."""
    return typing.get_type_hints(cl)
