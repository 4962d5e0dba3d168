"""Bash words for launch scripts: the lexer keeps each part's quoting, which shlex drops.

``shlex`` alone is not enough for launch scripts: it loses the difference between ``'$X'`` and
``"$X"`` (expanded or not, split or not), treats ``#`` inside a word as a comment, and knows neither
arrays, ``${...}``, ``$((...))`` nor ``$(...)``. This lexer covers what launch scripts use: quoting,
comments, line continuations, heredocs, arrays ``NAME=( ... )``, and the operators between commands.
mcx/interop/shell.py parses the tokens into commands; mcx/interop/script.py gives them meaning
without running anything.
"""

from __future__ import annotations

import re

from attrs import frozen

from mcx.errors import InputError


@frozen
class Lit:
    text: str
    quoted: bool  # from quotes or a backslash: never split, never a reserved word


@frozen
class Param:
    raw: str  # inside ${...} (or the bare name of $NAME)
    quoted: bool


@frozen
class Arith:
    expr: str
    quoted: bool


@frozen
class CmdSub:
    text: str
    quoted: bool


Part = Lit | Param | Arith | CmdSub


@frozen
class Word:
    parts: tuple[Part, ...]
    line: int

    def literal(self) -> str | None:
        """The text when the word is all unquoted literal (reserved words, assignments), else None."""
        if all(isinstance(p, Lit) and not p.quoted for p in self.parts):
            return "".join(p.text for p in self.parts)  # type: ignore[union-attr]
        return None

    def source(self) -> str:
        """A readable rendering for messages."""
        out = []
        for p in self.parts:
            if isinstance(p, Lit):
                out.append(p.text)
            elif isinstance(p, Param):
                out.append("${" + p.raw + "}")
            elif isinstance(p, Arith):
                out.append("$((" + p.expr + "))")
            else:
                out.append("$(" + p.text + ")")
        return "".join(out)


@frozen
class ArrayWord:
    """``NAME=( ... )`` or ``NAME+=( ... )``."""

    name: str
    append: bool
    items: tuple[Word, ...]
    line: int


@frozen
class Op:
    text: str
    line: int


Token = Word | ArrayWord | Op

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=$")
_OPS = ("&&", "||", ";;", ";", "&", "|", "(", ")")
_REDIRS = ("<<<", "<<-", "<<", ">>", "&>", ">&", "<&", ">|", "<>", ">", "<")
_METACHARS = set(" \t\n;&|()<>")
_SPECIAL_PARAMS = set("@*#?$!-0123456789")


class _Lexer:
    def __init__(self, text: str, line: int = 1) -> None:
        self.s = text
        self.i = 0
        self.line = line
        self.heredocs: list[tuple[str, bool]] = []

    def error(self, msg: str, line: int | None = None) -> InputError:
        return InputError(f"line {line or self.line}: {msg};", "fix the script's syntax (bash -n finds it too).")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "\n":
                out.append(Op("\n", self.line))
                self.i += 1
                self.line += 1
                self._skip_heredocs()
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif self._digits_then_redirect():
                continue
            elif any(self.s.startswith(r, self.i) for r in _REDIRS):
                out.append(self._redirect())
            elif c in ";&|()":
                op = next(o for o in _OPS if self.s.startswith(o, self.i))
                out.append(Op(op, self.line))
                self.i += len(op)
            else:
                out.append(self._word_or_array())
        return out

    def _digits_then_redirect(self) -> bool:
        m = re.compile(r"\d+(?=[<>])").match(self.s, self.i)
        if not m:
            return False
        self.i = m.end()  # the fd number belongs to the redirection that follows
        return True

    def _redirect(self) -> Op:
        op = next(r for r in _REDIRS if self.s.startswith(r, self.i))
        self.i += len(op)
        if op in ("<<", "<<-"):
            while self.peek() in " \t":
                self.i += 1
            delim = self._word()
            text = "".join(p.text if isinstance(p, Lit) else "$" + p.raw for p in delim.parts
                           if isinstance(p, (Lit, Param)))
            self.heredocs.append((text, op == "<<-"))
            return Op("heredoc:" + op, self.line)  # its delimiter is consumed here, not a target word
        return Op("redir:" + op, self.line)

    def _skip_heredocs(self) -> None:
        while self.heredocs:
            delim, strip_tabs = self.heredocs.pop(0)
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                body = self.s[self.i:end]
                self.i = min(end + 1, len(self.s))
                self.line += 1
                if (body.lstrip("\t") if strip_tabs else body) == delim:
                    break
            else:
                raise self.error(f"heredoc delimited by {delim!r} never ends")

    def _word_or_array(self) -> Token:
        line = self.line
        word = self._word()
        lit = word.literal()
        m = _ASSIGN.match(lit) if lit is not None else None
        if m and self.peek() == "(":
            self.i += 1
            items: list[Word] = []
            while True:
                c = self.peek()
                if c == "":
                    raise self.error(f"array {m.group(1)}=( is never closed")
                if c == "\\" and self.peek(1) == "\n":
                    self.i += 2
                    self.line += 1
                elif c in " \t\r":
                    self.i += 1
                elif c == "\n":
                    self.i += 1
                    self.line += 1
                elif c == "#":
                    while self.i < len(self.s) and self.peek() != "\n":
                        self.i += 1
                elif c == ")":
                    self.i += 1
                    break
                else:
                    items.append(self._word())
            return ArrayWord(m.group(1), m.group(2) == "+", tuple(items), line)
        return word

    def _word(self) -> Word:
        line = self.line
        parts: list[Part] = []
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(Lit("".join(buf), False))
                buf.clear()

        while self.i < len(self.s):
            c = self.peek()
            if c in _METACHARS:
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                    continue
                flush()
                parts.append(Lit(nxt, True))
            elif c == "'":
                flush()
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("unterminated single quote", self.line)
                body = self.s[self.i + 1:end]
                self.line += body.count("\n")
                parts.append(Lit(body, True))
                self.i = end + 1
            elif c == '"':
                flush()
                self.i += 1
                parts.extend(self._double_quoted())
            elif c == "$" and self.peek(1) == "'":
                flush()
                parts.append(Lit(self._ansi_c(), True))
            elif c in "$`":
                part = self._dollar(quoted=False)
                if part is None:
                    buf.append(c)
                    self.i += 1
                else:
                    flush()
                    parts.append(part)
            else:
                buf.append(c)
                self.i += 1
        flush()
        return Word(tuple(parts), line)

    def _double_quoted(self) -> list[Part]:
        parts: list[Part] = []
        buf: list[str] = []
        start = self.line
        while True:
            c = self.peek()
            if c == "":
                raise self.error("unterminated double quote", start)
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(1) in '$`"\\\n':
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                else:
                    buf.append(nxt)
            elif c in "$`":
                part = self._dollar(quoted=True)
                if part is None:
                    buf.append(c)
                    self.i += 1
                else:
                    if buf:
                        parts.append(Lit("".join(buf), True))
                        buf.clear()
                    parts.append(part)
            else:
                if c == "\n":
                    self.line += 1
                buf.append(c)
                self.i += 1
        if buf or not parts:
            parts.append(Lit("".join(buf), True))  # "" stays an (empty) quoted part
        return parts

    def _ansi_c(self) -> str:
        self.i += 2
        line = self.line
        out: list[str] = []
        escapes = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "r": "\r", "0": "\0"}
        while True:
            c = self.peek()
            if c == "":
                raise self.error("unterminated $'...' string", line)
            self.i += 1
            if c == "'":
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                self.i += 1
                out.append(escapes.get(nxt, "\\" + nxt))
            else:
                out.append(c)

    def _dollar(self, *, quoted: bool) -> Part | None:
        if self.peek() == "`":
            end = self.s.find("`", self.i + 1)
            if end < 0:
                raise self.error("unterminated backquote")
            text = self.s[self.i + 1:end]
            self.line += text.count("\n")
            self.i = end + 1
            return CmdSub(text, quoted)
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            self.i += 3
            body = self._balanced("(", ")", depth=2)
            if not body.endswith(")"):
                raise self.error("$(( is not closed by ))")
            return Arith(body[:-1], quoted)
        if nxt == "(":
            self.i += 2
            return CmdSub(self._balanced("(", ")"), quoted)
        if nxt == "{":
            self.i += 2
            return Param(self._balanced("{", "}"), quoted)
        m = NAME_RE.match(self.s, self.i + 1)
        if m:
            self.i = m.end()
            return Param(m.group(0), quoted)
        if nxt and nxt in _SPECIAL_PARAMS:
            self.i += 2
            return Param(nxt, quoted)
        return None

    def _balanced(self, open_: str, close: str, depth: int = 1) -> str:
        """Text up to the matching close (consumed, not returned), skipping quoted parts."""
        start, line = self.i, self.line
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\":
                self.i += 2
                continue
            if c == "'":
                end = self.s.find("'", self.i + 1)
                self.i = (end if end >= 0 else len(self.s) - 1) + 1
                continue
            if c == '"':
                self.i += 1
                while self.i < len(self.s) and self.peek() != '"':
                    self.i += 2 if self.peek() == "\\" else 1
                self.i += 1
                continue
            if c == "\n":
                self.line += 1
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    body = self.s[start:self.i]
                    self.i += 1
                    return body
            self.i += 1
        raise self.error(f"'{open_}' is never closed by '{close}'", line)


def lex(text: str, line: int = 1) -> list[Token]:
    return _Lexer(text, line).tokens()


def lex_word(text: str) -> Word:
    """One word from text (the default of ``${X:-text}``); quotes inside keep their meaning."""
    lexer = _Lexer(text)
    parts: list[Part] = []
    while lexer.i < len(text):
        parts.extend(lexer._word().parts)
        if lexer.i < len(text):  # whitespace or a metacharacter: literal inside ${...}
            parts.append(Lit(text[lexer.i], False))
            lexer.i += 1
    return Word(tuple(parts), 1)
