"""pretrain_gpt.py arguments as the importer reads them: split by flag, typed, and recorded.

``split_args`` sorts a launch's arguments into the flags the table knows (last occurrence wins, as
argparse) and the others (reported with their reason). ``Ctx`` reads typed values from the known
ones and collects the spec values, the mapping record and the problems; mcx/interop/flag_rules.py holds
what each row of the flag table does with them.
"""

from __future__ import annotations

import math
from typing import Any

from attrs import define, field, frozen

from mcx.interop import flags as F
from mcx.spec.convert import toml_value
from mcx.spec.keys import spec_keys
from mcx.interop.script import Field, Launch, Unknown
from mcx.interop.unmapped import DROPPED, HANDLED


@frozen
class Mapped:
    flag: str  # the argument or launcher option ("" when derived from several)
    key: str  # the spec key
    value: Any
    origin: str  # "script", "Megatron-LM default", "torchrun", "#SBATCH", "derived: ..."


_UNKNOWN_FLAG = ("not in mcx's flag table (docs/spec.md): mcx has no equivalent, "
                 "so the imported experiment runs without it")


def split_args(launch: Launch, unsupported: list[tuple[str, str]], problems: list[str]) -> dict[str, list[Field]]:
    """{flag: values} for the flags the table knows; the others go to ``unsupported`` with their reason."""
    known = set(F.BY_ARG)
    given: dict[str, list[Field]] = {}
    others: dict[str, list[Field]] = {}
    current: list[Field] | None = None
    for f in launch.args:
        if isinstance(f, str) and f.startswith("--"):
            flag, eq, val = f.partition("=")
            current = [val] if eq else []
            (given if flag in known else others)[flag] = current
        elif current is not None:
            current.append(f)
        elif isinstance(f, Unknown):
            problems.append(f"line {launch.line}: an argument of pretrain_gpt.py is unknown ({f.reason}); "
                            "flags it may hold are not imported")
        else:
            problems.append(f"line {launch.line}: stray argument {f!r} before the first flag is ignored")
    for flag, values in others.items():
        if flag == "--optimizer" and values and values[0] != "adam":
            unsupported.append((flag, f"{values[0]!s}: mcx trains with Adam (decoupled weight decay) only"))
        else:
            unsupported.append((flag, HANDLED.get(flag) or DROPPED.get(flag) or _UNKNOWN_FLAG))
    return given


@define
class Ctx:
    given: dict[str, list[Field]]
    problems: list[str]
    line: int
    flat: dict[str, Any] = field(factory=dict)
    mapped: list[Mapped] = field(factory=list)
    unsupported: list[tuple[str, str]] = field(factory=list)
    pinned: set[str] = field(factory=set)  # keys given by `mcx import --set`: the script does not change them
    unread: dict[str, str] = field(factory=dict)  # flag -> why its value could not be read
    notes: list[str] = field(factory=list)  # what the script trains that a reader may not expect

    def view(self, key: str) -> Any:
        """The value so far: set by the import, else mcx's default (None for required keys)."""
        if key in self.flat:
            return self.flat[key]
        default = spec_keys()[key].default
        return None if spec_keys()[key].required else default

    def view_all(self) -> dict[str, Any]:
        return {k: self.view(k) for k in spec_keys()}

    def set(self, key: str, value: Any, flag: str, origin: str = "script") -> None:
        if key in self.pinned:
            if origin.startswith("script") and value != self.flat[key]:
                self.notes.append(f"--set {key}={toml_value(self.flat[key])} replaces the script's {flag} "
                                  f"({toml_value(value)})")
            return
        self.flat[key] = value
        self.mapped.append(Mapped(flag, key, value, origin))

    def pin(self, key: str, value: Any) -> None:
        """A value from ``mcx import --set``: it wins over the script and Megatron-LM's defaults."""
        self.flat[key] = value
        self.pinned.add(key)
        self.mapped.append(Mapped("--set", key, value, "--set"))

    def problem(self, msg: str) -> None:
        self.problems.append(f"line {self.line}: {msg}")

    def has(self, flag: str) -> bool:
        return flag in self.given

    def one(self, flag: str) -> str | None:
        values = self.given.get(flag)
        if values is None:
            return None
        if len(values) != 1:
            self.problem(f"{flag} takes one value, got {len(values)}; ignored")
            self.unread[flag] = f"it takes one value, got {len(values)}"
            return None
        v = values[0]
        if isinstance(v, Unknown):
            self.problem(f"{flag}: {v.reason}; set its key in the spec")
            self.unread[flag] = v.reason
            return None
        return v

    def switch(self, flag: str) -> bool:
        values = self.given.get(flag)
        if values is None:
            return False
        if values:
            self.problem(f"{flag} takes no value; the words after it ({len(values)}) are ignored")
        return True

    def typed(self, key: str, flag: str, text: str) -> Any:
        k = spec_keys()[key]
        if k.choices is not None:
            if text in k.choices:
                return text
            self.problem(f"{flag} {text}: mcx supports {', '.join(map(str, k.choices))}; "
                         f"{key} keeps {toml_value(self.view(key))}")
            self.unread[flag] = f"{text} is not one of {', '.join(map(str, k.choices))}"
            return None
        try:
            if k.base is int:
                return int(text)
            if k.base is float:
                v = float(text)
                if not math.isfinite(v):
                    raise ValueError(text)
                return v
        except ValueError:
            self.problem(f"{flag} {text!r} is not {'an integer' if k.base is int else 'a number'}; ignored")
            self.unread[flag] = f"{text!r} is not {'an integer' if k.base is int else 'a number'}"
            return None
        return text

    def float_of(self, flag: str) -> float | None:
        text = self.one(flag)
        if text is None:
            return None
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            self.problem(f"{flag} {text!r} is not a number; ignored")
            self.unread[flag] = f"{text!r} is not a number"
            return None
        return v

    def int_of(self, flag: str) -> int | None:
        text = self.one(flag)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            self.problem(f"{flag} {text!r} is not an integer; ignored")
            self.unread[flag] = f"{text!r} is not an integer"
            return None
