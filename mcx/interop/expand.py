"""Bash expansion without running anything: parameters, arrays, arithmetic, word splitting.

Values are what bash would hold, except where only running the script could tell (a command
substitution, a variable from the environment): those parts are ``Unknown`` with the reason. A
string may be partly known (``--data-path $DATA --split 99,1,0`` with DATA unknown is ``Partial``),
so splitting it still finds its known words, and only the word that holds the unknown part is unknown.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping, Sequence

from attrs import frozen

from mcx.interop.lexer import Arith, CmdSub, Lit, Param, Word, lex_word


@frozen
class Unknown:
    """A value that only running the script would tell."""

    reason: str


@frozen
class Partial:
    """A string with unknown parts: known text and Unknowns, in order (at least one Unknown)."""

    pieces: tuple[str | Unknown, ...]

    def first_unknown(self) -> Unknown:
        return next(p for p in self.pieces if isinstance(p, Unknown))


Field = str | Unknown  # a word as the launched program would see it
Text = str | Unknown | Partial  # a scalar value
Value = Text | list  # list: a bash array of Text


def settle(value: Text) -> Field:
    """A word for the outside: partly known words are unknown there."""
    return value.first_unknown() if isinstance(value, Partial) else value


def _text(pieces: list[str | Unknown]) -> Text:
    merged: list[str | Unknown] = []
    for p in pieces:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        elif p != "":
            merged.append(p)
    if not any(isinstance(p, Unknown) for p in merged):
        return "".join(merged)  # type: ignore[arg-type]
    return merged[0] if len(merged) == 1 else Partial(tuple(merged))


def join(values: Sequence[Text], sep: str = " ") -> Text:
    pieces: list[str | Unknown] = []
    for k, v in enumerate(values):
        if k:
            pieces.append(sep)
        pieces.extend(v.pieces if isinstance(v, Partial) else (v,))
    return _text(pieces)


_PARAM = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(?:\[(?P<idx>[^\]]*)\])?(?P<rest>.*)", re.S)
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}  # and / %, as C divides (_arith)


def _arith(node: ast.AST, lookup) -> int:
    """Bash integer arithmetic over a tiny syntax tree: numbers, names, + - * / % ** << >> & | ^ ~ and ()."""
    if isinstance(node, ast.Expression):
        return _arith(node.body, lookup)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return lookup(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
        v = _arith(node.operand, lookup)
        return -v if isinstance(node.op, ast.USub) else (~v if isinstance(node.op, ast.Invert) else v)
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINOPS or isinstance(node.op, (ast.Div, ast.Mod))):
        a, b = _arith(node.left, lookup), _arith(node.right, lookup)
        if isinstance(node.op, (ast.Div, ast.Mod)):
            if b == 0:
                raise ValueError("division by zero")
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # C division, as bash
            return q if isinstance(node.op, ast.Div) else a - q * b
        if isinstance(node.op, ast.Pow) and not 0 <= b <= 64:
            raise ValueError("exponent out of range")
        return _BINOPS[type(node.op)](a, b)
    raise ValueError("not simple integer arithmetic")


class Expander:
    """Variables, arrays and positional parameters, and how words expand against them."""

    def __init__(self, env: Mapping[str, str], args: Sequence[str]) -> None:
        self.vars: dict[str, Value] = {}
        self.env = dict(env)
        self.positional: list[Text] = list(args)

    def lookup(self, name: str) -> Value | None:
        """A parameter's value; None when unset."""
        if name.isdigit():
            i = int(name) - 1
            return "script.sh" if i < 0 else (self.positional[i] if i < len(self.positional) else None)
        if name in ("@", "*"):
            return list(self.positional)
        if name == "#":
            return str(len(self.positional))
        if name in ("?", "$", "!", "-"):
            return Unknown(f"${name} is known only at run time")
        if name in self.vars:
            return self.vars[name]
        return self.env.get(name)

    def unset(self, name: str) -> Unknown:
        if name.isdigit():
            return Unknown(f"${name} is the script's argument {name}, and none was given to mcx import")
        return Unknown(f"${name} is not set in the script (it would come from the environment)")

    def param(self, raw: str, quoted: bool, split: bool) -> list[tuple]:
        """Chunks of one ${...}: ("t", text, splittable) | ("b",) a field break | ("u", reason)."""
        splittable = split and not quoted
        if raw.startswith("#") and len(raw) > 1:
            v = self.lookup(raw[1:].removesuffix("[@]").removesuffix("[*]"))
            if isinstance(v, (Unknown, Partial)):
                return [("u", settle(v).reason)]  # type: ignore[union-attr]
            return [("t", str(len(v) if isinstance(v, list) else len(v or "")), False)]
        m = _PARAM.fullmatch(raw)
        if not m or raw.startswith("!"):
            return [("u", f"${{{raw}}} is an expansion mcx import does not evaluate")]
        name, idx, rest = m.group("name"), m.group("idx"), m.group("rest")
        value = self.lookup(name)
        if idx is not None and isinstance(value, list) and idx not in ("@", "*"):
            i = self.arith_value(idx)
            value = (value[i] if 0 <= i < len(value) else None) if isinstance(i, int) else i
        elif idx is None and isinstance(value, list) and name not in ("@", "*"):
            value = value[0] if value else None
        if rest:
            op = re.match(r":?[-=+?]", rest)
            if not op:
                return [("u", f"${{{raw}}} is an expansion mcx import does not evaluate")]
            kind, word = op.group(0)[-1], rest[op.end():]
            empty = value is None or (op.group(0).startswith(":") and value in ("", []))
            if isinstance(value, (Unknown, Partial)) and kind != "?":
                return [("u", settle(value).reason)]  # type: ignore[union-attr]
            if kind in "-=" and empty:
                text = join(self.expand(lex_word(word), split=False))
                if kind == "=":
                    self.vars[name] = text
                return self._chunks(text, splittable)
            if kind == "+":
                return [] if empty else self._chunks(join(self.expand(lex_word(word), split=False)), splittable)
            if kind == "?" and empty:
                return [("u", f"${{{name}}} must be set when the script runs ({word or 'parameter null or not set'})")]
        if value is None:
            return [("u", self.unset(name).reason)]
        if isinstance(value, list):
            if quoted and "*" in (idx, name):
                return self._chunks(join(value), False)
            out: list[tuple] = []
            for k, item in enumerate(value):
                out += ([("b",)] if k else []) + self._chunks(item, splittable)
            return out
        return self._chunks(value, splittable)

    def _chunks(self, value: Text, splittable: bool) -> list[tuple]:
        pieces = value.pieces if isinstance(value, Partial) else (value,)
        return [("u", p.reason) if isinstance(p, Unknown) else ("t", p, splittable) for p in pieces]

    def arith_value(self, expr: str) -> int | Unknown:
        unknown: list[str] = []

        def sub(m: re.Match) -> str:
            v = self.lookup(m.group(1) or m.group(2))
            v = (v[0] if v else None) if isinstance(v, list) else v
            if isinstance(v, (Unknown, Partial)):
                unknown.append(settle(v).reason)  # type: ignore[union-attr]
                return "0"
            return v or "0"

        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)\}|\$([A-Za-z_][A-Za-z0-9_]*|[0-9]+)", sub, expr)
        if unknown:
            return Unknown(unknown[0])

        def name_value(name: str) -> int:
            v = self.lookup(name)
            v = (v[0] if v else None) if isinstance(v, list) else v
            if isinstance(v, (Unknown, Partial)):
                raise LookupError(settle(v).reason)  # type: ignore[union-attr]
            v = (v or "0").strip()
            if not re.fullmatch(r"-?\d+", v):
                raise ValueError(f"{name}={v!r} is not an integer")
            return int(v)

        try:
            return _arith(ast.parse(text.strip(), mode="eval"), name_value)
        except LookupError as exc:
            return Unknown(str(exc.args[0]))
        except (SyntaxError, ValueError, RecursionError) as exc:
            return Unknown(f"$(({expr})) is not simple integer arithmetic ({exc.__class__.__name__})")

    def expand(self, word: Word, *, split: bool = True) -> list[Text]:
        """The fields of a word, as bash's expansion and word splitting make them (no globbing)."""
        chunks: list[tuple] = []
        for part in word.parts:
            if isinstance(part, Lit):
                chunks.append(("t", part.text, False))  # a quoted "" still makes a field
            elif isinstance(part, Param):
                chunks.extend(self.param(part.raw, part.quoted, split))
            elif isinstance(part, Arith):
                v = self.arith_value(part.expr)
                chunks.append(("u", v.reason) if isinstance(v, Unknown) else ("t", str(v), False))
            else:
                assert isinstance(part, CmdSub)
                chunks.append(("u", f"$({part.text.strip()}) is a command substitution; mcx import runs nothing"))
        fields: list[Text] = []
        cur: list[str | Unknown] | None = None

        def push() -> None:
            nonlocal cur
            if cur is not None:
                fields.append(_text(cur))
            cur = None

        for chunk in chunks:
            if chunk[0] == "b":
                push()
            elif chunk[0] == "u":
                cur = (cur or []) + [Unknown(chunk[1])]
            elif chunk[2]:  # unquoted expansion: split on blanks
                for k, piece in enumerate(re.split(r"[ \t\n]+", chunk[1])):
                    if k:
                        push()
                    if piece:
                        cur = (cur or []) + [piece]
            else:
                cur = (cur if cur is not None else []) + [chunk[1]]
        push()
        return fields
