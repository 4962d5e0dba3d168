"""Bash commands for launch scripts: assignments, simple commands, ``if``/``case``/loops/functions.

Only syntax lives here (over the tokens of mcx/interop/lexer.py); mcx/interop/script.py interprets
it without running anything.
"""

from __future__ import annotations

import re

from attrs import field, frozen

from mcx.errors import InputError
from mcx.interop.lexer import NAME_RE, ArrayWord, Lit, Op, Token, Word, lex


@frozen
class Simple:
    assigns: tuple[Word | ArrayWord, ...]  # NAME=value words before the command
    words: tuple[Word | ArrayWord, ...]
    line: int


@frozen
class Test:
    """``[[ ... ]]``: its operators stay tokens instead of splitting the command."""

    tokens: tuple[Word | Op, ...]
    line: int


@frozen
class Pipeline:
    commands: tuple[Node, ...]
    negated: bool
    line: int


@frozen
class AndOr:
    first: Node
    rest: tuple[tuple[str, Node], ...]
    line: int


@frozen
class If:
    branches: tuple[tuple[tuple[Node, ...], tuple[Node, ...]], ...]
    orelse: tuple[Node, ...] | None
    line: int


@frozen
class Loop:
    keyword: str
    body: tuple[Node, ...]
    line: int


@frozen
class Case:
    subject: Word
    arms: tuple[tuple[tuple[Word, ...], tuple[Node, ...]], ...]
    line: int


@frozen
class Group:
    body: tuple[Node, ...]
    subshell: bool
    line: int


@frozen
class Function:
    name: str
    body: tuple[Node, ...]
    line: int


Node = Simple | Test | Pipeline | AndOr | If | Loop | Case | Group | Function

_RESERVED_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}", "in"}


@frozen
class _Stop:
    words: frozenset[str] = field(factory=frozenset)
    ops: frozenset[str] = field(factory=frozenset)


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.t = tokens
        self.i = 0

    def error(self, msg: str) -> InputError:
        line = self._line()
        return InputError(f"line {line}: {msg};", "fix the script's syntax (bash -n finds it too).")

    def _line(self) -> int:
        tok = self.t[min(self.i, len(self.t) - 1)] if self.t else None
        return tok.line if tok is not None else 1

    def peek(self) -> Token | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def _kw(self, tok: Token | None) -> str | None:
        return tok.literal() if isinstance(tok, Word) else None

    def _skip_newlines(self) -> None:
        while self._op("\n", ";"):
            self.i += 1

    def _expect_word(self, word: str) -> None:
        self._skip_newlines()
        if self._kw(self.peek()) != word:
            raise self.error(f"expected '{word}'")
        self.i += 1

    def parse_list(self, stop: _Stop = _Stop()) -> tuple[Node, ...]:
        nodes: list[Node] = []
        while True:
            tok = self.peek()
            if tok is None:
                return tuple(nodes)
            if isinstance(tok, Op) and tok.text in ("\n", ";", "&"):
                self.i += 1
                continue
            if isinstance(tok, Op) and tok.text in stop.ops:
                return tuple(nodes)
            if self._kw(tok) in stop.words:
                return tuple(nodes)
            if isinstance(tok, Op) and tok.text in (")", ";;"):
                raise self.error(f"unexpected '{tok.text}'")
            nodes.append(self._and_or())

    def _and_or(self) -> Node:
        line = self._line()
        first = self._pipeline()
        rest: list[tuple[str, Node]] = []
        while isinstance(tok := self.peek(), Op) and tok.text in ("&&", "||"):
            op = tok.text
            self.i += 1
            while self._op("\n"):
                self.i += 1
            rest.append((op, self._pipeline()))
        return AndOr(first, tuple(rest), line) if rest else first

    def _pipeline(self) -> Node:
        line = self._line()
        negated = False
        if self._kw(self.peek()) == "!":
            negated = True
            self.i += 1
        commands = [self._command()]
        while self._op("|"):
            self.i += 1
            while self._op("\n"):
                self.i += 1
            commands.append(self._command())
        if len(commands) == 1 and not negated:
            return commands[0]
        return Pipeline(tuple(commands), negated, line)

    def _command(self) -> Node:
        tok = self.peek()
        line = self._line()
        kw = self._kw(tok)
        if isinstance(tok, Op) and tok.text == "(":
            self.i += 1
            body = self.parse_list(_Stop(ops=frozenset({")"})))
            self.i += 1
            return self._redirects_after(Group(body, True, line))
        if kw == "{":
            self.i += 1
            body = self.parse_list(_Stop(words=frozenset({"}"})))
            self._expect_word("}")
            return self._redirects_after(Group(body, False, line))
        if kw == "if":
            return self._if(line)
        if kw in ("for", "while", "until", "select"):
            return self._loop(kw, line)
        if kw == "case":
            return self._case(line)
        if kw == "function":
            self.i += 1
            name = self._kw(self.peek()) or "?"
            self.i += 1
            if self._op("("):
                self.i += 2
            self._skip_newlines()
            return Function(name, (self._command(),), line)
        if kw == "[[":
            return self._test(line)
        if (kw is not None and NAME_RE.fullmatch(kw) and self._op("(", k=1) and self._op(")", k=2)):
            self.i += 3
            self._skip_newlines()
            return Function(kw, (self._command(),), line)
        if kw in _RESERVED_END:
            raise self.error(f"unexpected '{kw}'")
        return self._simple(line)

    def _op(self, *texts: str, k: int = 0) -> bool:
        """Whether the token ``k`` ahead is an operator, one of ``texts``."""
        tok = self._at(k)
        return isinstance(tok, Op) and tok.text in texts

    def _at(self, k: int) -> Token | None:
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def _skip_redirect(self) -> bool:
        tok = self.peek()
        if not isinstance(tok, Op) or not tok.text.startswith(("redir:", "heredoc:")):
            return False
        self.i += 1
        if tok.text.startswith("redir:") and isinstance(self.peek(), Word):
            self.i += 1  # the redirection's target
        return True

    def _redirects_after(self, node: Node) -> Node:
        while self._skip_redirect():
            pass
        return node

    def _simple(self, line: int) -> Simple:
        assigns: list[Word | ArrayWord] = []
        words: list[Word | ArrayWord] = []
        while True:
            tok = self.peek()
            if tok is None:
                break
            if isinstance(tok, Op):
                if self._skip_redirect():
                    continue
                break
            self.i += 1
            if not words and (isinstance(tok, ArrayWord) or _is_assignment(tok)):
                assigns.append(tok)
            else:
                words.append(tok)
        return Simple(tuple(assigns), tuple(words), line)

    def _test(self, line: int) -> Test:
        self.i += 1
        toks: list[Word | Op] = []
        while True:
            tok = self.peek()
            if tok is None:
                raise self.error("'[[' is never closed by ']]'")
            self.i += 1
            if self._kw(tok) == "]]":
                return Test(tuple(toks), line)
            if isinstance(tok, ArrayWord):
                raise self.error("unexpected array inside [[ ]]")
            toks.append(tok)

    def _if(self, line: int) -> If:
        self.i += 1
        branches = []
        orelse = None
        while True:
            cond = self.parse_list(_Stop(words=frozenset({"then"})))
            self._expect_word("then")
            body = self.parse_list(_Stop(words=frozenset({"elif", "else", "fi"})))
            branches.append((cond, body))
            kw = self._kw(self.peek())
            self.i += 1
            if kw == "elif":
                continue
            if kw == "else":
                orelse = self.parse_list(_Stop(words=frozenset({"fi"})))
                self._expect_word("fi")
            elif kw != "fi":
                raise self.error("'if' is never closed by 'fi'")
            return If(tuple(branches), orelse, line)

    def _loop(self, keyword: str, line: int) -> Loop:
        self.i += 1
        if keyword in ("for", "select"):
            while self._kw(self.peek()) != "do":
                if self.peek() is None:
                    raise self.error(f"'{keyword}' without 'do'")
                self.i += 1
        else:
            self.parse_list(_Stop(words=frozenset({"do"})))
        self._expect_word("do")
        body = self.parse_list(_Stop(words=frozenset({"done"})))
        self._expect_word("done")
        return Loop(keyword, body, line)

    def _case(self, line: int) -> Case:
        self.i += 1
        subject = self.peek()
        if not isinstance(subject, Word):
            raise self.error("'case' needs a word")
        self.i += 1
        self._expect_word("in")
        arms: list[tuple[tuple[Word, ...], tuple[Node, ...]]] = []
        while True:
            while self._op("\n"):
                self.i += 1
            if self._kw(self.peek()) == "esac":
                self.i += 1
                return Case(subject, tuple(arms), line)
            if self._op("("):
                self.i += 1
            patterns: list[Word] = []
            while not self._op(")"):
                tok = self.peek()
                if tok is None:
                    raise self.error("'case' is never closed by 'esac'")
                if isinstance(tok, Word):
                    patterns.append(tok)
                self.i += 1
            self.i += 1
            body = self.parse_list(_Stop(words=frozenset({"esac"}), ops=frozenset({";;"})))
            if self._op(";;"):
                self.i += 1
            arms.append((tuple(patterns), body))


def _is_assignment(tok: Token) -> bool:
    if not isinstance(tok, Word) or not tok.parts:
        return False
    first = tok.parts[0]
    return isinstance(first, Lit) and not first.quoted and re.match(r"[A-Za-z_][A-Za-z0-9_]*\+?=", first.text) is not None


def split_assignment(word: Word) -> tuple[str, bool, Word]:
    """``NAME=value`` (or ``NAME+=value``) -> (name, append, value word)."""
    first = word.parts[0]
    assert isinstance(first, Lit)
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=", first.text)
    assert m
    rest = first.text[m.end():]
    parts = ((Lit(rest, False),) if rest else ()) + word.parts[1:]
    return m.group(1), m.group(2) == "+", Word(parts, word.line)


def is_assignment(tok: Token) -> bool:
    return isinstance(tok, ArrayWord) or _is_assignment(tok)


def parse(text: str, line: int = 1) -> tuple[Node, ...]:
    """Parse a script (starting at ``line``) into commands; InputError names the line of a syntax error."""
    parser = _Parser(lex(text, line))
    nodes = parser.parse_list()
    if parser.peek() is not None:
        raise parser.error("unexpected text")
    return nodes
