"""Launch scripts read, never run: variables, arrays and expansions, then the ``pretrain_gpt.py`` launch.

``read_script`` walks the parsed script (mcx/interop/shell.py) the way bash would, with every side
effect left out: assignments and arrays are tracked and words expanded (mcx/interop/expand.py:
``${VAR:-default}``, arrays, ``$((...))`` over a restricted syntax tree, never ``eval``),
``if``/``case``/``&&``/``||`` are followed when their tests are decidable (mcx/interop/conditions.py),
functions are followed when called, and ``bash -c '...'`` strings are read as scripts. What cannot be
known without running anything (command substitution, variables from the environment, file tests)
becomes an ``Unknown`` value with its reason; the importer reports it where it reaches an argument
it needs. Loop bodies are not followed: what they assign becomes unknown.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import shlex
from collections.abc import Mapping, Sequence

from attrs import frozen

from mcx.errors import InputError
from mcx.interop import shell
from mcx.interop.conditions import evaluate
from mcx.interop.expand import Expander, Field, Text, Unknown, join, settle
from mcx.interop.lexer import ArrayWord, Op, Word
from mcx.interop.unmapped import SBATCH_SHORT, TORCHRUN_SWITCHES
from mcx.plan.memory import ALLOCATOR_ENV

__all__ = ["Field", "Launch", "Script", "Unknown", "read_script"]


@frozen
class Launch:
    line: int
    words: tuple[Field, ...]  # the whole command as bash would run it
    entry: Field  # the training script, e.g. "pretrain_gpt.py"
    args: tuple[Field, ...]  # its arguments
    torchrun: tuple[tuple[str, Field | None], ...] | None  # options, names with dashes; None: no torchrun
    srun: tuple[tuple[str, Field | None], ...] | None  # srun options; None: not under srun
    allocator: Field | None = None  # PYTORCH_CUDA_ALLOC_CONF where the launch runs; None: unset


@frozen
class Script:
    launch: Launch | None
    sbatch: tuple[tuple[str, str | None], ...]  # (#SBATCH long option, value) in order
    problems: tuple[str, ...]


_ENTRY = re.compile(r"(^|/)pretrain_[A-Za-z0-9_]+\.py$")
_SRUN_VALUE_OPTS = frozenset({"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "--gpus-per-node", "--gres",
                              "-c", "--cpus-per-task", "--mpi", "--container-image", "--container-mounts",
                              "--container-name", "--container-workdir", "--export", "-o", "--output", "-e",
                              "--error", "-p", "--partition", "-A", "--account", "-t", "--time", "-J",
                              "--job-name", "-w", "--nodelist", "-x", "--exclude", "--mem", "--gpus", "-G"})
_LAUNCH_HINTS = ("pretrain_", "torchrun", "torch.distributed")
_MAX_DEPTH = 16


class _Exit(Exception):
    pass


class _Return(Exception):
    pass


def _split_sbatch(text: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The #SBATCH options of the script's header (sbatch reads none after the first command)."""
    opts: list[tuple[str, str | None]] = []
    problems: list[str] = []
    in_header = True
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s.startswith("#SBATCH"):
            if s and not s.startswith("#"):
                in_header = False
            continue
        if not in_header:
            problems.append(f"line {lineno}: #SBATCH after the first command is ignored by sbatch, and by mcx import")
            continue
        try:
            toks = shlex.split(s[len("#SBATCH"):], comments=True)
        except ValueError as exc:
            problems.append(f"line {lineno}: unreadable #SBATCH line ({exc})")
            continue
        i = 0
        while i < len(toks):
            tok = toks[i]
            name, eq, val = tok.partition("=")
            if not eq and re.fullmatch(r"-[A-Za-z].+", tok):
                name, val, eq = tok[:2], tok[2:], "="
            name = SBATCH_SHORT.get(name, name)
            if eq:
                opts.append((name, val))
                i += 1
            elif i + 1 < len(toks) and not toks[i + 1].startswith("-"):
                opts.append((name, toks[i + 1]))
                i += 2
            else:
                opts.append((name, None))
                i += 1
    return opts, problems


def _slurm_env(sbatch: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    """The variables Slurm would set from the header, so ${SLURM_NNODES} and friends resolve."""
    env: dict[str, str] = {}
    for name, val in sbatch:
        if val is None:
            continue
        if name == "--job-name":
            env["SLURM_JOB_NAME"] = val
        elif name == "--nodes" and val.isdigit():
            env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = val
        elif name == "--ntasks-per-node" and val.isdigit():
            env["SLURM_NTASKS_PER_NODE"] = val
        elif name in ("--gpus-per-node", "--gres"):
            m = re.fullmatch(r"(?:gpu:)?(?:[A-Za-z0-9_-]+:)?(\d+)", val)
            if m:
                env["SLURM_GPUS_PER_NODE"] = env["SLURM_GPUS_ON_NODE"] = m.group(1)
    return env


class _Reader(Expander):
    def __init__(self, env: Mapping[str, str], args: Sequence[str]) -> None:
        super().__init__(env, args)
        self.functions: dict[str, tuple[shell.Node, ...]] = {}
        self.problems: list[str] = []
        self.launches: list[Launch] = []
        self.srun_context: list[tuple[tuple[str, Field | None], ...]] = []
        self.depth = 0

    def words(self, node: shell.Simple) -> list[Text]:
        out: list[Text] = []
        for w in node.words:
            out.extend(self.expand(w) if isinstance(w, Word) else [Unknown("an array in argument position")])
        return out

    # ---- commands

    def run(self, nodes: Sequence[shell.Node]) -> None:
        for node in nodes:
            self.node(node)

    def node(self, node: shell.Node) -> None:
        if isinstance(node, shell.Simple):
            self.simple(node)
        elif isinstance(node, shell.Pipeline):
            for cmd in node.commands:
                self.node(cmd)
        elif isinstance(node, shell.AndOr):
            self.and_or(node)
        elif isinstance(node, shell.If):
            self.if_(node)
        elif isinstance(node, shell.Loop):
            self.skip([node.body], f"the `{node.keyword}` loop at line {node.line}")
        elif isinstance(node, shell.Case):
            self.case(node)
        elif isinstance(node, shell.Group):
            saved = dict(self.vars) if node.subshell else None
            try:
                self.run(node.body)
            finally:
                if saved is not None:
                    self.vars = saved
        elif isinstance(node, shell.Function):
            self.functions[node.name] = node.body

    def assign(self, tok: Word | ArrayWord) -> None:
        if isinstance(tok, ArrayWord):
            items: list[Text] = []
            for w in tok.items:
                items.extend(self.expand(w))
            old = self.vars.get(tok.name)
            if tok.append and old is not None:
                items = (old if isinstance(old, list) else [old]) + items
            self.vars[tok.name] = items
            return
        name, append, value_word = shell.split_assignment(tok)
        value = join(self.expand(value_word, split=False))
        old = self.vars.get(name)
        if not append or old is None:
            self.vars[name] = value
        elif isinstance(old, list):  # NAME+=value on an array appends to its first element, as bash does
            self.vars[name] = [join([old[0], value], "") if old else value, *old[1:]]
        else:
            self.vars[name] = join([old, value], "")

    def simple(self, node: shell.Simple) -> None:
        if not node.words:
            for tok in node.assigns:
                self.assign(tok)
            return
        if not node.assigns:
            self.command(node, None)
            return
        # ``VAR=value cmd``: the value holds in cmd's environment only (e.g. a launch's allocator setting).
        names = [tok.name if isinstance(tok, ArrayWord) else shell.split_assignment(tok)[0] for tok in node.assigns]
        saved = {name: self.vars.get(name) for name in names}
        try:
            self.command(node, node.assigns)
        finally:
            for name, value in saved.items():
                if value is None:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = value

    def command(self, node: shell.Simple, prefix) -> None:
        head = node.words[0]
        cmd = head.literal() if isinstance(head, Word) else None
        if cmd in ("export", "declare", "typeset", "local", "readonly"):
            for tok in node.words[1:]:
                if shell.is_assignment(tok):
                    self.assign(tok)
            return
        fields = self.words(node)  # expanded before the prefix assignments take effect, as bash does
        for tok in prefix or ():
            self.assign(tok)
        if cmd == "unset":
            for f in fields[1:]:
                if isinstance(f, str):
                    self.vars.pop(f, None)
        elif cmd == "exit":
            raise _Exit()
        elif cmd == "return":
            raise _Return()
        elif cmd == "shift":
            n = fields[1] if len(fields) > 1 else "1"
            if isinstance(n, str) and n.isdigit():
                self.positional = self.positional[int(n):]
        elif cmd in ("source", "."):
            self.problems.append(f"line {node.line}: `{cmd} {_show(fields[1:])}` is not read; "
                                 "variables it sets are unknown to mcx import")
        elif cmd in self.functions:
            self.call(cmd, fields[1:], node.line)
        else:
            self.maybe_nested(fields, node.line)
            self.detect(fields, node.line)

    def call(self, name: str, args: list[Text], line: int) -> None:
        if self.depth >= _MAX_DEPTH:
            self.problems.append(f"line {line}: calls nest deeper than {_MAX_DEPTH}; `{name}` is not followed")
            return
        saved, self.positional = self.positional, list(args)
        self.depth += 1
        try:
            self.run(self.functions[name])
        except _Return:
            pass
        finally:
            self.positional = saved
            self.depth -= 1

    def maybe_nested(self, fields: list[Text], line: int) -> None:
        """``bash -c 'script'`` (also under srun, docker exec, ...): read the string as a script."""
        for i, f in enumerate(fields[:-2]):
            if isinstance(f, str) and f.rsplit("/", 1)[-1] in ("bash", "sh") and fields[i + 1] == "-c":
                body = fields[i + 2]
                if not isinstance(body, str) or self.depth >= _MAX_DEPTH:
                    return
                srun = self.srun_options(fields[:i])
                if srun is not None:
                    self.srun_context.append(srun)
                self.depth += 1
                try:
                    self.run(shell.parse(body, line))
                except InputError as exc:
                    self.problems.append(f"line {line}: the `{f} -c` string is not valid bash ({exc.message})")
                except (_Exit, _Return):
                    pass
                finally:
                    self.depth -= 1
                    if srun is not None:
                        self.srun_context.pop()
                return

    # ---- conditions

    def status(self, node: shell.Node, *, assume_success: bool) -> bool | None:
        """Run the node and return its exit status as truth; None when it cannot be known."""
        if isinstance(node, shell.Test):
            return self.test_dbl(node)
        if isinstance(node, shell.Simple) and node.words and isinstance(node.words[0], Word):
            cmd = node.words[0].literal()
            if cmd in ("[", "test"):
                fields = self.words(node)[1:]
                if cmd == "[":
                    fields = fields[:-1] if fields and fields[-1] == "]" else fields
                return evaluate(fields, double=False)
            if cmd in ("true", ":"):
                return True
            if cmd == "false":
                return False
        if isinstance(node, shell.Pipeline) and node.negated:
            for cmd_node in node.commands[:-1]:
                self.node(cmd_node)
            st = self.status(node.commands[-1], assume_success=assume_success)
            return None if st is None else not st
        if isinstance(node, shell.AndOr):
            return self.and_or(node, assume_success=assume_success)
        self.node(node)
        return True if assume_success else None

    def and_or(self, node: shell.AndOr, *, assume_success: bool = True) -> bool | None:
        st = self.status(node.first, assume_success=assume_success)
        for op, nxt in node.rest:
            runs = st if op == "&&" else (None if st is None else not st)
            if runs is None:
                self.skip([(nxt,)], f"the `{op}` at line {node.line}")
                st = None
            elif runs:
                st = self.status(nxt, assume_success=assume_success)
        return st

    def if_(self, node: shell.If) -> None:
        for k, (cond, body) in enumerate(node.branches):
            for c in cond[:-1]:
                self.node(c)
            st = self.status(cond[-1], assume_success=False) if cond else None
            if st is None:
                rest = [b for _, b in node.branches[k:]] + ([node.orelse] if node.orelse else [])
                self.skip(rest, f"the `if` at line {node.line}")
                return
            if st:
                self.run(body)
                return
        if node.orelse:
            self.run(node.orelse)

    def case(self, node: shell.Case) -> None:
        subject = join(self.expand(node.subject, split=False))
        for patterns, body in node.arms:
            for pat_word in patterns:
                pat = join(self.expand(pat_word, split=False))
                if not isinstance(subject, str) or not isinstance(pat, str):
                    self.skip([b for _, b in node.arms], f"the `case` at line {node.line}")
                    return
                if fnmatch.fnmatchcase(subject, pat):
                    self.run(body)
                    return

    def test_dbl(self, node: shell.Test) -> bool | None:
        items: list[Text] = []
        for tok in node.tokens:
            if isinstance(tok, Op):
                items.append(tok.text.removeprefix("redir:"))
            else:
                items.append(join(self.expand(tok, split=False)))
        return evaluate(items, double=True)

    def skip(self, bodies: Sequence[Sequence[shell.Node]], what: str) -> None:
        """Branches that cannot be decided: what they assign becomes unknown; a launch inside is reported."""
        for node in _walk(bodies):
            if not isinstance(node, shell.Simple):
                continue
            for tok in _assignments(node):
                name, append = (tok.name, tok.append) if isinstance(tok, ArrayWord) else shell.split_assignment(tok)[:2]
                if append:
                    self.problems.append(f"{what} may add to {name}; it cannot be decided without running the "
                                         "script, so those additions are not imported")
                else:
                    self.vars[name] = Unknown(f"{name} is assigned inside {what}, which cannot be decided "
                                              "without running the script")
            text = " ".join(w.source() for w in node.words if isinstance(w, Word))
            if any(h in text for h in _LAUNCH_HINTS):
                self.problems.append(f"line {node.line}: a launch command inside {what} is not imported "
                                     "(the condition cannot be decided without running the script)")

    # ---- the launch

    def srun_options(self, texts: Sequence[Text]) -> tuple[tuple[str, Field | None], ...] | None:
        fields = [settle(t) for t in texts]
        for i, f in enumerate(fields):
            if isinstance(f, str) and f.rsplit("/", 1)[-1] == "srun":
                opts: list[tuple[str, Field | None]] = []
                j = i + 1
                while j < len(fields) and isinstance(fields[j], str) and fields[j].startswith("-"):  # type: ignore[union-attr]
                    name, eq, val = fields[j].partition("=")  # type: ignore[union-attr]
                    if eq:
                        opts.append((name, val))
                        j += 1
                    elif name in _SRUN_VALUE_OPTS and j + 1 < len(fields):
                        opts.append((name, fields[j + 1]))
                        j += 2
                    else:
                        opts.append((name, None))
                        j += 1
                return tuple(opts)
        return None

    def detect(self, texts: list[Text], line: int) -> None:
        fields = [settle(t) for t in texts]
        entry = next((i for i, f in enumerate(fields) if isinstance(f, str) and _ENTRY.search(f)), None)
        runner = next((i for i, f in enumerate(fields) if isinstance(f, str) and (
            f.rsplit("/", 1)[-1] == "torchrun" or (f in ("torch.distributed.run", "torch.distributed.launch")
                                                    and i > 0 and fields[i - 1] == "-m"))), None)
        if entry is None and runner is None:
            return
        torchrun = None
        if runner is not None and (entry is None or runner < entry):
            opts: list[tuple[str, Field | None]] = []
            j = runner + 1
            while j < len(fields):
                f = fields[j]
                if isinstance(f, Unknown):
                    if entry is None or j >= entry:
                        break
                    opts.append(("?", f))
                    j += 1
                    continue
                if not f.startswith("-") or (entry is not None and j >= entry):
                    break
                name, eq, val = f.partition("=")
                name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
                if eq:
                    opts.append((name, val))
                    j += 1
                elif name in TORCHRUN_SWITCHES:
                    opts.append((name, None))
                    j += 1
                else:
                    opts.append((name, fields[j + 1] if j + 1 < len(fields) else Unknown(f"{name} has no value")))
                    j += 2
            torchrun = tuple(opts)
            if entry is None:
                entry = j
                target = fields[j] if j < len(fields) else Unknown("torchrun has no training script")
                if isinstance(target, str):
                    self.problems.append(f"line {line}: torchrun runs {target}, not pretrain_gpt.py; not imported")
                    return
        elif entry is None:
            return
        srun = self.srun_options(fields[:entry]) or (self.srun_context[-1] if self.srun_context else None)
        conf = self.lookup(ALLOCATOR_ENV)
        self.launches.append(Launch(line=line, words=tuple(fields), entry=fields[entry], args=tuple(fields[entry + 1:]),
                                    torchrun=torchrun, srun=srun,
                                    allocator=None if conf is None else Unknown(f"{ALLOCATOR_ENV} is an array")
                                    if isinstance(conf, list) else settle(conf)))


def _walk(bodies: Sequence[Sequence[shell.Node]]):
    stack = [n for body in bodies for n in body]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, shell.Pipeline):
            stack.extend(node.commands)
        elif isinstance(node, shell.AndOr):
            stack.extend([node.first, *[n for _, n in node.rest]])
        elif isinstance(node, shell.If):
            stack.extend(n for cond, body in node.branches for n in (*cond, *body))
            stack.extend(node.orelse or ())
        elif isinstance(node, (shell.Loop, shell.Group, shell.Function)):
            stack.extend(node.body)
        elif isinstance(node, shell.Case):
            stack.extend(n for _, body in node.arms for n in body)


def _assignments(node: shell.Simple) -> list[Word | ArrayWord]:
    if not node.words:
        return list(node.assigns)
    head = node.words[0]
    if isinstance(head, Word) and head.literal() in ("export", "declare", "typeset", "local", "readonly"):
        return [t for t in node.words[1:] if shell.is_assignment(t)]
    return []


def _show(fields: Sequence[Text]) -> str:
    return " ".join(f if isinstance(f, str) else "?" for f in fields)


def read_script(text: str, *, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> Script:
    """Read a launch script without running it.

    ``env`` gives variables the script takes from its environment; ``args`` its positional arguments
    ($1, $2, ...; ``${1:-default}`` takes the default when there are fewer). Slurm's SLURM_NNODES,
    SLURM_GPUS_PER_NODE and SLURM_JOB_NAME come from #SBATCH lines unless ``env`` sets them.
    Raises InputError for a script that is not valid bash.
    """
    sbatch, problems = _split_sbatch(text)
    reader = _Reader({**_slurm_env(sbatch), **(env or {})}, args)
    reader.problems.extend(problems)
    with contextlib.suppress(_Exit, _Return):
        reader.run(shell.parse(text))
    launch = reader.launches[0] if reader.launches else None
    for extra in reader.launches[1:]:
        reader.problems.append(f"line {extra.line}: a further launch of {_show([extra.entry])} is not imported "
                               f"(only the first, at line {launch.line})")  # type: ignore[union-attr]
    return Script(launch=launch, sbatch=tuple(sbatch), problems=tuple(reader.problems))
