"""``[ ... ]``, ``test`` and ``[[ ... ]]`` over expanded words, with three-valued logic.

None means the test cannot be decided without running the script: an operand is unknown, or the
test asks the file system (``-f``, ``-d``, ...), which mcx import never looks at.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Sequence

from mcx.interop.expand import Text

_UNARY_DECIDABLE = {"-n", "-z"}
_UNARY_FILE = {"-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w", "-x",
               "-G", "-L", "-N", "-O", "-S", "-v"}
_INT_OPS = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le, "-gt": operator.gt,
            "-ge": operator.ge}
_BINARY = {"=", "==", "!=", "=~", "<", ">", "-nt", "-ot", "-ef", *_INT_OPS}


def evaluate(items: Sequence[Text], *, double: bool) -> bool | None:
    """``[ ... ]`` / ``[[ ... ]]`` with three-valued logic (None: undecidable without running)."""
    pos = 0
    or_ops, and_ops = ({"||"}, {"&&"}) if double else ({"-o"}, {"-a"})

    def primary() -> bool | None:
        nonlocal pos
        if pos >= len(items):
            return False
        tok = items[pos]
        if tok == "!":
            pos += 1
            v = primary()
            return None if v is None else not v
        if tok == "(":
            pos += 1
            v = disjunction()
            pos += 1  # ")"
            return v
        if pos + 2 < len(items) and isinstance(items[pos + 1], str) and items[pos + 1] in _BINARY:
            a, op, b = items[pos], items[pos + 1], items[pos + 2]
            pos += 3
            if not isinstance(a, str) or not isinstance(b, str):
                return None
            if op in ("=", "=="):
                return fnmatch.fnmatchcase(a, b) if double else a == b
            if op == "!=":
                return not fnmatch.fnmatchcase(a, b) if double else a != b
            if op == "=~":
                try:
                    return re.search(b, a) is not None
                except re.error:
                    return None
            if op in ("<", ">"):
                return a < b if op == "<" else a > b
            if op in _INT_OPS:
                if re.fullmatch(r"\s*-?\d+\s*", a) and re.fullmatch(r"\s*-?\d+\s*", b):
                    return _INT_OPS[op](int(a), int(b))
                return None
            return None  # file comparisons
        if isinstance(tok, str) and (tok in _UNARY_DECIDABLE or tok in _UNARY_FILE) and pos + 1 < len(items):
            arg = items[pos + 1]
            pos += 2
            if tok in _UNARY_FILE or not isinstance(arg, str):
                return None
            return (arg != "") if tok == "-n" else (arg == "")
        pos += 1
        return tok != "" if isinstance(tok, str) else None

    def conjunction() -> bool | None:
        nonlocal pos
        v = primary()
        while pos < len(items) and items[pos] in and_ops:
            pos += 1
            w = primary()
            v = False if (v is False or w is False) else (None if (v is None or w is None) else True)
        return v

    def disjunction() -> bool | None:
        nonlocal pos
        v = conjunction()
        while pos < len(items) and items[pos] in or_ops:
            pos += 1
            w = conjunction()
            v = True if (v is True or w is True) else (None if (v is None or w is None) else False)
        return v

    return disjunction()
