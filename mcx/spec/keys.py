"""Every spec key as a dotted path, with its type and default, read from the attrs schema itself."""

from __future__ import annotations

import types
import typing
from functools import cache
from typing import Any, Literal, get_args, get_origin

import attrs

from mcx.spec.convert import field_types
from mcx.spec.schema import ExperimentSpec


@attrs.frozen
class Key:
    path: str  # "model.num_layers", "data.tokenizer.kind"
    type: Any  # the resolved annotation
    default: Any  # attrs.NOTHING when the key is required

    @property
    def required(self) -> bool:
        return self.default is attrs.NOTHING

    @property
    def base(self) -> Any:
        """The annotation without ``| None``."""
        args = get_args(self.type)
        if get_origin(self.type) in (typing.Union, types.UnionType) and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        return self.type

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return get_args(self.base) if get_origin(self.base) is Literal else None


def _default(a: attrs.Attribute) -> Any:
    if isinstance(a.default, attrs.Factory):  # type: ignore[arg-type]
        return a.default.factory()  # type: ignore[union-attr]
    return a.default


@cache
def spec_keys() -> dict[str, Key]:
    """Leaf keys of ExperimentSpec in schema order (nested attrs classes are walked, not listed)."""
    out: dict[str, Key] = {}

    def walk(cl: type, prefix: str) -> None:
        hints = field_types(cl)
        for a in attrs.fields(cl):
            t = hints[a.name]
            path = f"{prefix}{a.metadata.get('key', a.name)}"  # the TOML key ([init] from)
            if isinstance(t, type) and attrs.has(t):
                walk(t, path + ".")
            else:
                out[path] = Key(path, t, _default(a))

    walk(ExperimentSpec, "")
    return out


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A spec (or any attrs instance) as {dotted.key: value}, values as the classes hold them, with the keys
    of spec_keys (an optional table such as ``sweep`` is one key, its value the table or None)."""
    out: dict[str, Any] = {}
    hints = field_types(type(obj))
    for a in attrs.fields(type(obj)):
        v, name, t = getattr(obj, a.name), a.metadata.get("key", a.name), hints[a.name]
        if isinstance(t, type) and attrs.has(t):
            out.update(flatten(v, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = v
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{dotted.key: value} -> nested tables, in the order of the schema."""
    order = {k: i for i, k in enumerate(spec_keys())}
    out: dict[str, Any] = {}
    for key in sorted(flat, key=lambda k: order.get(k, len(order))):
        node = out
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = flat[key]
    return out
