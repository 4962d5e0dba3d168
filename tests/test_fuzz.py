"""Fuzzing bad input (hypothesis): specs, TOML text, --set overrides and CLI argument vectors.

The properties, for every generated input:

* ``load_spec`` / ``make_plan`` return a spec and a plan, or raise an ``InputError`` (exit code 2);
  never any other exception, and never slower than ``LIMIT_S``.
* Every ``SpecError`` problem names a real TOML path (a schema key or a key of the input; file-level
  problems such as malformed TOML name the line and column instead).
* The CLI, in-process (``mcx.cli.main.main``), exits 0 or 2, prints no traceback and writes nothing
  into the project (no ``.mcx/``, no ``mlruns/``); a handful of real subprocesses confirm the exit codes.

Specs are built by mutating the recipes in experiments/ (deleting keys, inserting random and near-miss
keys, wrong-typed values: strings, floats, ints, bools, arrays, tables, zero, negatives, NaN/inf,
unicode); TOML text is generated line by line, by editing a recipe's text, or as raw bytes.

``MCX_FUZZ_SCALE`` multiplies every example count (default 1: about 4,000 examples in about a minute
on two cores); run e.g. ``MCX_FUZZ_SCALE=10`` for a longer local hunt.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mcx.cli.main import main
from mcx.errors import InputError, McxError, SpecError
from mcx.ops.plan import te_available
from mcx.plan.planner import make_plan, plan_to_dict
from mcx.spec import load_spec
from mcx.spec.load import resolve_dict
from mcx.spec.schema import ExperimentSpec, MixComponent, SweepRange

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
LIMIT_S = 10.0  # one load + plan takes milliseconds; anything near this is a hang
CLI_LIMIT_S = 90.0  # a verb's first call may import mlflow or dvc (seconds on a busy CI machine)
RUN_ID = re.compile(r"^[0-9a-f]{12}$")

settings.register_profile(
    "mcx-fuzz",
    deadline=None,  # timing is LIMIT_S's job; CI machines vary
    database=None,  # nothing written into the repository or the project under test
    print_blob=True,  # a failure prints @reproduce_failure to replay it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture],
)
SCALE = float(os.environ.get("MCX_FUZZ_SCALE", "1"))


def examples(n: int) -> settings:
    return settings(settings.get_profile("mcx-fuzz"), max_examples=max(1, int(n * SCALE)))


class TooSlow(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TooSlow in the main thread after ``seconds`` (a hang becomes a failing, shrinkable example)."""
    def fire(signum, frame):
        raise TooSlow(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- the schema as data -------------------------------------------------------------------------


def _tables(cls: type, prefix: str = "") -> dict[str, type]:
    out = {prefix: cls}
    for name, tp in typing.get_type_hints(cls).items():
        table = _table_type(tp)
        if table is not None:
            out.update(_tables(table, f"{prefix}.{name}" if prefix else name))
    return out


def _table_type(tp: Any) -> type | None:
    """The attrs class of a table field (``SweepSpec | None`` included: an optional table)."""
    if attrs.has(tp):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 and attrs.has(args[0]) else None


TABLES: dict[str, type] = _tables(ExperimentSpec)  # "" -> ExperimentSpec, "data.tokenizer" -> TokenizerSpec, ...


def _kind(tp: Any) -> tuple[str, tuple]:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is Literal:
        return "literal", typing.get_args(tp)
    if args and typing.get_origin(tp) is not None and len(args) == 1 and typing.get_origin(tp) not in (tuple, dict):
        return _kind(args[0])  # X | None
    if typing.get_origin(tp) is tuple:
        return "strings", ()
    if typing.get_origin(tp) is dict:
        return "numbers", ()
    return {int: "int", float: "float", bool: "bool", str: "str"}[tp], ()


FIELDS: dict[str, tuple[str, tuple]] = {  # "train.lr" -> ("float", ()), "train.precision" -> ("literal", (...))
    (f"{table}.{name}" if table else name): _kind(tp)
    for table, cls in TABLES.items() for name, tp in typing.get_type_hints(cls).items() if _table_type(tp) is None
}
INT_FIELDS = sorted(k for k, (kind, _) in FIELDS.items() if kind == "int")
KNOWN_PATHS: set[str] = set(TABLES) | set(FIELDS) | {"extends", "--set"}

SEEDS = {name: tomllib.loads((EXPERIMENTS / f"{name}.toml").read_text())
         for name in ("tiny", "tiny_moe", "tiny_slurm", "llama3_8b", "mixtral_8x7b", "llama3_70b", "h200_1gpu")}


# --- strategies -----------------------------------------------------------------------------------

_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz_-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@st.composite
def near_miss(draw, name: str) -> str:
    """``name`` with one typo: a character dropped, doubled, swapped, replaced, a case or plural change."""
    if not name:
        return draw(st.sampled_from(_NAME_CHARS))
    i = draw(st.integers(0, len(name) - 1))
    edit = draw(st.sampled_from(["drop", "double", "swap", "replace", "upper", "plural", "dash"]))
    if edit == "drop" and len(name) > 1:
        return name[:i] + name[i + 1:]
    if edit == "double":
        return name[:i] + name[i] + name[i:]
    if edit == "swap" and i + 1 < len(name):
        return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    if edit == "replace":
        return name[:i] + draw(st.sampled_from(_NAME_CHARS)) + name[i + 1:]
    if edit == "upper":
        return name.upper() if name.upper() != name else name.lower()
    if edit == "dash" and "_" in name:
        return name.replace("_", "-")
    return name + "s"


random_keys = st.text(st.characters(blacklist_characters=".[]", blacklist_categories=("Cs",)), max_size=12)
ints = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 4, 5, 7, 8, 12, 16, 64, 127, 128, 1000, 4096, 65536]),
                 st.integers(-3, 70), st.integers(-(2 ** 16), 2 ** 16),
                 st.sampled_from([2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 2 ** 64, 10 ** 30]))
floats = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 0.5, 3e-4, 1e-300, 1e300, -1.0, math.nan, math.inf, -math.inf]),
                   st.floats(allow_nan=True, allow_infinity=True))
strings = st.one_of(
    st.sampled_from(["", " ", "3e-4", "1", "true", "nan", "bf16", "BF16", "fp8-hybrid", "H100", "h100", "cpu",
                     "any", "slurm", "local", "rope", "ü", "√2", "日本語", "../..", "969,30,1", "1,2", "04:00:00",
                     "1-00:00:00", "data/quickstart", "tiny.toml", "llama3-8b", "a;rm -rf /", "$(reboot)",
                     "\x00", "\t\n", "'\"", "x" * 200, "/proc/self", "/dev/zero", "/sys", "/dev/stdin"]),
    st.text(max_size=24),
)
scalars = st.one_of(ints, floats, st.booleans(), strings)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(random_keys, inner, max_size=3),
                      max_leaves=6)


def typed_values(kind: str, choices: tuple) -> st.SearchStrategy:
    """Values of the field's own type (to reach the rules and the planner), or near it."""
    own = {
        "int": ints, "float": floats, "bool": st.booleans(), "str": strings,
        "literal": st.one_of(st.sampled_from(choices or ("",)), st.sampled_from(choices or ("",)).flatmap(near_miss)),
        "strings": st.lists(strings, max_size=3), "numbers": st.dictionaries(random_keys, floats, max_size=3),
    }[kind]
    return st.one_of(own, own, values)


def _walk(node: dict, prefix: tuple = ()):
    """(path, value) of every entry under ``node``, tables included."""
    for key, value in node.items():
        yield (*prefix, key), value
        if isinstance(value, dict):
            yield from _walk(value, (*prefix, key))


def _parent(data: dict, path: tuple, create: bool = False) -> dict | None:
    node = data
    for key in path[:-1]:
        if create and key not in node:
            node[key] = {}
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None
    return node


@st.composite
def mutated_specs(draw) -> dict:
    """A recipe from experiments/ with one to five random edits."""
    seed = draw(st.sampled_from(sorted(SEEDS)))
    data = json.loads(json.dumps(SEEDS[seed]))  # deep copy of plain TOML data
    for _ in range(draw(st.integers(1, 5))):
        entries = list(_walk(data))
        op = draw(st.sampled_from(["delete", "replace", "insert", "typed", "typed", "rename"]))
        if op in ("delete", "replace", "rename") and entries:
            path, _ = draw(st.sampled_from(entries))
            parent = _parent(data, path)
            if op == "delete":
                del parent[path[-1]]
            elif op == "replace":
                parent[path[-1]] = draw(values)
            else:
                parent[draw(near_miss(path[-1]))] = parent.pop(path[-1])
        elif op == "typed":
            dotted = draw(st.sampled_from(sorted(FIELDS)))
            path = tuple(dotted.split("."))
            parent = _parent(data, path, create=True)
            if parent is not None:
                parent[path[-1]] = draw(typed_values(*FIELDS[dotted]))
        else:  # insert a key: a typo of a real one, a real one, a random one, or extends
            table = draw(st.sampled_from(sorted(TABLES)))
            node = _parent(data, (*(table.split(".") if table else ()), "<new key>"), create=True)
            if node is None:
                continue
            names = [a.name for a in attrs.fields(TABLES[table])]
            key = draw(st.one_of(st.sampled_from(names).flatmap(near_miss), st.sampled_from(names), random_keys,
                                 st.just("extends") if not table else st.nothing()))
            if key == "extends":
                node[key] = draw(st.one_of(st.sampled_from(["tiny.toml", "tiny_ddp.toml", "case.toml", "missing.toml",
                                                            ".", "", "../specs/tiny.toml"]), values))
            else:
                node[key] = draw(values)
    return data


# TOML text, line by line: headers, assignments of literal or junk values, comments, junk.
_toml_literals = st.one_of(
    st.sampled_from(["1", "-1", "0", "3e-4", "1e400", "nan", "+inf", "true", "false", '"bf16"', "'x'", '""', "[]",
                     "[1, 2]", '["a", 1]', "{}", "{a = 1}", "1979-05-27", "0x10", "1_000", '"""multi\nline"""',
                     "[1,", '"open', "= 2", "01", "1.", ".5"]),
    values.map(lambda v: tomli_w.dumps({"v": v})[4:].strip()),  # (arrays of tables come out as junk: fine)
    st.text(max_size=12),
    st.sampled_from(["9223372036854775808", "-9223372036854775809", "99999999999999999999999", "4294967296"]),
    st.integers(1, 6000).map(lambda n: "[" * n + "]" * n),  # nesting past the parser's recursion limit
    st.integers(1, 3000).map(lambda n: "{a = " * n + "1" + "}" * n),
)
_toml_keys = st.one_of(st.sampled_from(sorted({k.split(".")[-1] for k in FIELDS})), random_keys.map(json.dumps),
                       st.sampled_from(sorted(FIELDS)).flatmap(near_miss), st.sampled_from(sorted(FIELDS)))
_toml_line = st.one_of(
    st.sampled_from(sorted(TABLES)).map(lambda t: f"[{t}]" if t else ""),
    st.sampled_from(sorted(TABLES)).flatmap(near_miss).map(lambda t: f"[{t}]"),
    st.builds(lambda k, v: f"{k} = {v}", _toml_keys, _toml_literals),
    st.sampled_from(["# comment", "", "[[train]]", "[model", "model]", "a.b.c = 1", "= 1", "extends = 'tiny.toml'",
                     "extends = 'case.toml'", "[model.x.y]", "name = 'x'\nname = 'y'"]),
    st.text(max_size=20),
)
toml_lines = st.lists(_toml_line, max_size=14).map("\n".join)


@st.composite
def edited_recipe_text(draw) -> str:
    """A recipe's text with a few character-level edits: broken syntax at varied lines and columns."""
    text = (EXPERIMENTS / f"{draw(st.sampled_from(sorted(SEEDS)))}.toml").read_text()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        edit = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        junk = draw(st.one_of(st.text(max_size=8), st.sampled_from(["=", "[", "]", '"', "\n", "#", ".", "{", ","])))
        text = {"delete": text[:i] + text[j:], "insert": text[:i] + junk + text[i:],
                "replace": text[:i] + junk + text[j:], "duplicate": text[:j] + text[i:j] + text[j:]}[edit]
    return text


# --- the workspace: a project that must stay untouched, and a directory of spec files ------------


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.project = self.new_project("project")
        self.specs = root / "specs"
        self.specs.mkdir()
        for recipe in EXPERIMENTS.glob("*.toml"):  # so extends = "tiny.toml" resolves beside a case
            shutil.copyfile(recipe, self.specs / recipe.name)
        self.case = self.specs / "case.toml"

    def write(self, content: dict | str | bytes) -> Path:
        if isinstance(content, dict):
            content = tomli_w.dumps(content)
        if isinstance(content, str):
            content = content.encode("utf-8", "surrogatepass")
        self.case.write_bytes(content)
        return self.case

    def new_project(self, name: str) -> Path:
        """A project that is not a git checkout, whose data/ DVC tracks but nobody pulled."""
        project = self.root / name
        (project / ".dvc").mkdir(parents=True)
        shutil.copyfile(ROOT / "data.dvc", project / "data.dvc")
        return project

    def snapshot(self, project: Path | None = None) -> dict[str, tuple[int, int]]:
        project = project or self.project
        return {str(p.relative_to(project)): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in sorted(project.rglob("*"))}


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("fuzz"))


# --- the properties ---------------------------------------------------------------------------


def key_parts(key: str) -> tuple[str, ...]:
    """A problem's TOML path as its keys: ``model."a b"[2]`` -> ("model", "a b"); bare keys split on dots."""
    parts: list[str] = []
    for quoted, bare in re.findall(r'("(?:[^"\\]|\\.)*")|([^."]+|(?<=\.)(?=\.|$)|^(?=\.))', re.sub(r"\[\d+\]", "", key)):
        if quoted:
            try:
                parts.append(tomllib.loads(f"v = {quoted}")["v"])
            except tomllib.TOMLDecodeError:
                parts.append(json.loads(quoted))
        else:
            parts.append(bare)
    return tuple(parts)


def input_paths(*trees: Any, overrides: list[str] = ()) -> set[tuple[str, ...]]:
    """Every path a problem may name: the schema's, the inputs' and the --set keys (and their prefixes)."""
    out = {tuple(p.split(".")) for p in KNOWN_PATHS}
    for tree in trees:
        if isinstance(tree, dict):
            walked = [tuple(map(str, p)) for p, _ in _walk(tree)]
            out.update(walked)
            # a sweep parameter's own keys (any spec key) hold a range table, whose keys the schema knows
            out.update((*p, f.name) for p in walked if p[:2] == ("sweep", "parameters") and len(p) == 3
                       for f in attrs.fields(SweepRange))
            # a mixture component's table ([data.mix.NAME], [data.valid.NAME], [data.test.NAME]) has the component's keys
            out.update((*p, f.name) for p in walked if len(p) == 3 and p[:2] in (("data", "mix"), ("data", "valid"),
                                                                                 ("data", "test"))
                       for f in attrs.fields(MixComponent))
    for item in overrides:
        parts = item.split("=", 1)[0].strip().split(".")
        out.update(tuple(parts[:i]) for i in range(1, len(parts) + 1))
    return out


FILE_LEVEL = ("malformed TOML", "file not found", "cannot read", "must be a TOML table")


def check_error(err: McxError, paths: set[tuple[str, ...]]) -> None:
    """An input error whose every problem names a real TOML path (or is about the file itself)."""
    assert isinstance(err, InputError) and err.exit_code == 2, repr(err)
    text = str(err)
    assert text.strip() and "Traceback" not in text
    if isinstance(err, SpecError):
        assert err.problems
        for key, msg in err.problems:
            assert msg.strip()
            if key:
                assert key_parts(key) in paths, (key, msg)
            else:
                assert any(s in msg for s in FILE_LEVEL), msg
                if "malformed TOML" in msg:
                    assert re.search(r"line \d+, column \d+|end of document", msg), msg
    else:  # DataError and the like: the message names the key it is about
        dotted = {".".join(p) for p in paths if len(p) > 1}
        assert any(re.search(rf"(^|\W){re.escape(p)}(\W|$)", text) for p in dotted), text


def load_and_plan(path: Path, overrides: list[str] = (), limit: float = LIMIT_S) -> Any:
    """The plan, or the McxError; any other exception (or a hang) fails the example."""
    with time_limit(limit):
        try:
            spec = load_spec(path, overrides)
            plan = make_plan(spec, te_available=te_available(spec))
        except McxError as err:
            return err
        json.dumps(plan_to_dict(plan))
    layout = plan.layout
    assert layout.tp * layout.pp * layout.cp * layout.dp == layout.world_size
    return plan


def _raw(path: Path) -> Any:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):  # (mcx says "nested too deep")
        return None


def check_load_and_plan(path: Path, overrides: list[str] = ()) -> None:
    result = load_and_plan(path, overrides)
    if isinstance(result, McxError):
        try:
            merged = resolve_dict(path, overrides)
        except McxError:
            merged = None
        check_error(result, input_paths(_raw(path), merged, overrides=overrides))


@examples(1500)
@given(data=mutated_specs())
def test_mutated_specs_plan_or_fail_with_paths(ws, data):
    check_load_and_plan(ws.write(data))


@examples(500)
@given(text=st.one_of(toml_lines, edited_recipe_text(), st.text(max_size=200)))
def test_random_toml_text(ws, text):
    check_load_and_plan(ws.write(text))


@st.composite
def spliced_bytes(draw) -> bytes:
    """A recipe with random bytes (invalid UTF-8 among them) spliced in."""
    text = (EXPERIMENTS / f"{draw(st.sampled_from(sorted(SEEDS)))}.toml").read_bytes()
    i = draw(st.integers(0, len(text)))
    return text[:i] + draw(st.binary(min_size=1, max_size=8)) + text[i:]


@examples(200)
@given(blob=st.one_of(st.binary(max_size=300), spliced_bytes()))
def test_garbage_bytes(ws, blob):
    check_load_and_plan(ws.write(blob))


override_items = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(sorted(FIELDS)), _toml_literals),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(sorted(FIELDS)).flatmap(near_miss), _toml_literals),
    st.builds(lambda k, v: f"{k}={v}", st.lists(random_keys, min_size=1, max_size=3).map(".".join), _toml_literals),
    st.sampled_from(["train.lr", "=1", "train..lr=1", " = ", "model=3", "train.lr.x=1", "model.preset=gpt5",
                     "model.preset=llama3-8b", "launch.slurm.extra_sbatch=[1]", "a b=1", "train.lr=fast",
                     'train.lr=1\nname="x"', "name=a\nb", "train.lr=1\r\n[model]", 'name="""a\nb"""']),
    st.builds(lambda k, v, w: f"{k}={v}\n{w}", st.sampled_from(sorted(FIELDS)), _toml_literals, _toml_line),
    st.text(max_size=20),
)


@examples(500)
@given(seed=st.sampled_from(sorted(SEEDS)), overrides=st.lists(override_items, min_size=1, max_size=4))
def test_set_overrides(ws, seed, overrides):
    check_load_and_plan(ws.specs / f"{seed}.toml", overrides)


# --- the CLI, in-process --------------------------------------------------------------------------


def run_main(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``mcx ARGV``; an exception escaping main fails the example."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(CLI_LIMIT_S):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors 2, --help and --version 0
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return code, out.getvalue(), err.getvalue()


def data_stays_home(ws: Workspace, path: Path, overrides: list[str]) -> bool:
    """No data path outside the project that exists: `mcx plan` hashes untracked data by content."""
    try:
        data = resolve_dict(path, overrides)
    except McxError:
        return True
    d = data.get("data") if isinstance(data.get("data"), dict) else {}
    tok = d.get("tokenizer") if isinstance(d.get("tokenizer"), dict) else {}
    for value in (d.get("path"), tok.get("path"), tok.get("merges")):
        if isinstance(value, str) and "\x00" not in value:
            full = Path(os.path.normpath(ws.project / value))
            kernel = any(full.is_relative_to(root) for root in ("/proc", "/sys", "/dev"))  # refused, never walked
            if _exists(full) and not full.is_relative_to(ws.project) and not kernel:
                return False
    return True


def _exists(path: Path) -> bool:
    """Path.exists, with a name the kernel refuses (ENAMETOOLONG, a generated 2,000-character path) as absent."""
    try:
        return path.exists()
    except OSError:
        return False


def check_cli(ws: Workspace, argv: list[str], quiet_verbs: tuple[str, ...] = ("plan", "explain"),
              project: Path | None = None) -> tuple[int, str]:
    """`mcx ARGV` run from ``project``: exit 0 or 2, no traceback; on exit 2 (and for ``quiet_verbs``
    always) the project is left exactly as it was."""
    project = project or ws.project
    before = ws.snapshot(project)
    code, out, err = run_main(argv, project)
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err and "Traceback" not in out
    if code == 2:
        assert err.startswith(("mcx: error: ", "usage:")), err
    if code == 2 or any(v in argv for v in quiet_verbs):
        assert ws.snapshot(project) == before, "something was written into the project"
    return code, out


@examples(300)
@given(data=mutated_specs(), overrides=st.lists(override_items, max_size=2), as_json=st.booleans())
def test_cli_plan_exits_0_or_2(ws, data, overrides, as_json):
    path = ws.write(data)
    assume(data_stays_home(ws, path, overrides))
    argv = ["--project", str(ws.project), "plan", str(path), *[a for o in overrides for a in ("--set", o)]]
    code, out = check_cli(ws, argv + (["--json"] if as_json else []))
    if code == 0 and as_json:  # a run ID, unless the plan names a data file that is not here (then it is unknown)
        planned = json.loads(out.splitlines()[-1])
        absent = any(w.startswith("data.") and "is not on this machine" in w for w in planned["warnings"])
        assert RUN_ID.match(planned["run_id"]) if planned["run_id"] is not None else absent, planned["warnings"]


# --- CLI argument vectors ---------------------------------------------------------------------------

# The ops modules each verb imports (mcx/cli/verbs.py); every verb is fuzzed.
VERB_MODULES = {
    "plan": ["mcx.ops.plan"], "explain": ["mcx.ops.explain"], "run": ["mcx.ops.run"], "data": ["mcx.ops.data"],
    "ls": ["mcx.ops.records", "mcx.report.records_view"], "show": ["mcx.ops.records", "mcx.report.records_view"],
    "sync": ["mcx.ops.records"], "baseline": ["mcx.ops.records"], "reproduce": ["mcx.ops.reproduce"],
    "compare": ["mcx.ops.compare"], "import": ["mcx.ops.interop"], "export": ["mcx.ops.interop"],
    "tune": ["mcx.ops.tune"], "import-hf": ["mcx.ops.hf"], "export-hf": ["mcx.ops.hf"], "sweep": ["mcx.ops.sweep"],
    "pull": ["mcx.ops.pull"], "lineage": ["mcx.ops.records"], "gc": ["mcx.ops.gc"], "locate": ["mcx.ops.locate"],
}


READY = sorted(VERB_MODULES)
# Verbs that train, prepare data or write files on good input: fuzzed only with bad positionals below.
SIDE_EFFECTS = {"run", "tune", "data", "sweep"}
# Verbs that never write into the project, even when they succeed.
READ_ONLY = ("plan", "explain", "export", "show", "compare", "reproduce", "import", "import-hf", "locate")

BAD_RUN_IDS = ["../../etc/passwd", "abc;rm -rf /", "$(reboot)", "`id`", "0123456789ab", "0123456789AB",
               "0123456789abc", "012345", "", " ", "-", "..", "/", "ab\ncd", "x" * 300, "run id", "ünï", "%s%n",
               "0123456789a/", "*", "~", "\\..\\..", "deadbeefcafe;ls"]


def bad_specs(ws: Workspace, always: bool = False) -> list[str]:
    """Spec paths that fail to load; ``always``: only those no --set can repair."""
    repairable = {  # a --set of the key repairs these (and explain does not plan, so a bad layout passes it)
        "bad_type.toml": tomli_w.dumps({**SEEDS["tiny"], "train": {**SEEDS["tiny"]["train"], "lr": "3e-4"}}),
        "bad_layout.toml": tomli_w.dumps({**SEEDS["tiny"], "parallel": {"tensor": 3}}),
    }
    broken = {
        "bad_syntax.toml": 'name = "x"\n[model\n',
        "bad_key.toml": tomli_w.dumps({**SEEDS["tiny"], "trian": {}}),
        "cycle_a.toml": 'extends = "cycle_b.toml"\n', "cycle_b.toml": 'extends = "cycle_a.toml"\n',
    }
    for name, text in {**repairable, **broken}.items():
        if not (ws.specs / name).exists():
            (ws.specs / name).write_text(text)
    (ws.specs / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    (ws.specs / "a_dir.toml").mkdir(exist_ok=True)
    (ws.specs / "deep.toml").write_text(f'{tomli_w.dumps(SEEDS["tiny"])}\nx = {"[" * 5000}{"]" * 5000}\n')
    if not (ws.specs / "fifo.toml").exists():
        os.mkfifo(ws.specs / "fifo.toml")  # no writer: reading it would block forever
    names = [*broken, "latin1.toml", "a_dir.toml", "missing.toml", "deep.toml", "fifo.toml"]
    names += [] if always else [*repairable]
    return [str(ws.specs / n) for n in names] + ["/dev/zero", "/proc/self/status"]


FLAGS = ["--json", "--set", "--help", "-h", "--version", "--project", "--stage", "--force", "--yes", "--dry-run",
         "--skip-smoke", "--wait", "--quiet", "--format", "--experiment", "--baseline", "--megatron-args",
         "--max-micro-batch", "--steps", "--tokenizer", "--tokenizer-kind", "--merges", "--vocab-size", "--json-key",
         "--bogus", "-x", "--", "-"]
JUNK = ["", " ", "=", "a=b", "train.lr=1", "train.lr=fast", "x", "smoke", "full", "all", "md", "html", "bpe", "-1",
        "0", "3.5", "ünï", "prepare", "set", "ls"]


@examples(200)
@given(st.data())
def test_argv_soup(ws, data):
    """Random argv from verbs, flags, run IDs, specs and junk: exit 0 or 2, no traceback."""
    safe = [v for v in READY if v not in SIDE_EFFECTS]
    good = str(ws.specs / "tiny.toml")
    vocab = st.sampled_from([*safe, *FLAGS, *JUNK, *BAD_RUN_IDS, *bad_specs(ws), good, str(ws.project)])
    argv = data.draw(st.lists(vocab, max_size=6))
    if data.draw(st.booleans()):
        argv = [data.draw(st.sampled_from(safe)), *argv]
    check_cli(ws, argv)


def verb_argv(ws: Workspace, verb: str) -> st.SearchStrategy:
    """``[verb, ...]`` with the verb's own positionals and options, every positional a bad one.

    Verbs with side effects (run, tune, data) get only inputs that no option can repair.
    """
    ids, specs, broken = st.sampled_from(BAD_RUN_IDS), st.sampled_from(bad_specs(ws)), st.sampled_from(bad_specs(ws, True))
    sets = st.lists(st.sampled_from(JUNK), max_size=2).map(lambda xs: [a for x in xs for a in ("--set", x)])
    common = st.lists(st.sampled_from(["--json"]), max_size=1)
    missing = [str(ws.specs / "nope.txt"), str(ws.specs / "nope" / "dir"), str(ws.specs / "nope.jsonl")]
    shapes = {
        "plan": st.tuples(specs, sets, common),
        "explain": st.tuples(st.one_of(specs, ids), st.one_of(specs, ids), sets, common),
        "export": st.tuples(specs, sets, st.lists(st.just("--megatron-args"), max_size=1)),
        "run": st.tuples(broken, sets, st.lists(st.sampled_from(["--json", "--dry-run", "--quiet", "--force", "--yes",
                                                                 "--skip-smoke", "--stage=smoke", "--stage=full",
                                                                 "--stage=nope"]), max_size=3)),
        "tune": st.tuples(broken, sets, st.lists(st.sampled_from(["--json", "--max-micro-batch=0", "--steps=-1",
                                                                  "--steps=x"]), max_size=2)),
        "data": st.tuples(st.just("prepare"), st.sampled_from(missing),
                          st.lists(st.sampled_from(["--json", "--force", "--tokenizer-kind=gpt2", "--vocab-size=0",
                                                    "--vocab-size=-5", "--tokenizer=/nonexistent.json", "--json-key=",
                                                    "--out=out"]), max_size=2)),
        "show": st.tuples(ids, common),
        "reproduce": st.tuples(ids, common),
        "locate": st.tuples(ids, ids, st.lists(st.sampled_from(["--json", "--step=0", "--step=x", "--step=-3"]),
                                               max_size=2)),
        "compare": st.tuples(st.lists(ids, min_size=1, max_size=3),
                             st.lists(st.sampled_from(["--format=json", "--format=md", "--format=pdf", "--baseline=x;y",
                                                       "--experiment=../../etc"]), max_size=2)),
        "baseline": st.tuples(st.just("set"), st.sampled_from(["main", "", "a/b", "../x", "$(x)"]), ids),
        "ls": st.tuples(st.lists(st.sampled_from(["--json", "--experiment=../../x", "--experiment=;rm"]), max_size=2)),
        "sync": st.tuples(common),
        "import": st.tuples(st.sampled_from(missing)),
        "import-hf": st.tuples(st.sampled_from([*missing, str(ws.specs / "tiny.toml"), str(ws.specs)]),
                               st.lists(st.sampled_from(["--extends=nope.toml", "--seq-length=0", "--seq-length=x",
                                                         "--name=", "--set=train.lr=fast"]), max_size=2)),
        "sweep": st.tuples(st.one_of(broken, st.just("show"), st.just("ls")), st.sampled_from(["", "nope", "../x"]),
                           st.lists(st.sampled_from(["--json", "--dry-run", "--yes"]), max_size=2)),
        "pull": st.tuples(ids, st.lists(st.sampled_from(["--json", "--remote=", "--remote=/nonexistent",
                                                         "--remote=../x"]), max_size=2)),
        "lineage": st.tuples(ids, common),
        "gc": st.tuples(st.lists(st.sampled_from(["--json", "--dry-run", "--keep-final", "--bogus", "x"]), max_size=3)),
        "export-hf": st.tuples(ids, st.just("-o=hf-out"),
                               st.lists(st.sampled_from(["--step=0", "--step=x", "--dtype=int8", "--json",
                                                         "--max-shard-size=big", "--max-shard-size=0"]), max_size=2)),
    }

    def flatten(parts: tuple) -> list[str]:
        out: list[str] = []
        for p in parts:
            out.extend(p if isinstance(p, list) else [p])
        return out

    return shapes[verb].map(lambda parts: [verb, *flatten(parts)])


@pytest.mark.parametrize("verb", sorted(VERB_MODULES))
def test_argv_per_verb(ws, verb):
    """Each verb with bad run IDs, bad specs and bad options: exit 2, nothing written.

    Exit 0 is allowed only where no argument is bad beyond repair (``ls``, ``sync``,
    a spec repaired by its --set, or a layout ``explain`` does not check).
    """
    fatal = {*BAD_RUN_IDS, *bad_specs(ws, always=True)} - set(JUNK)  # JUNK also fills option values
    project = ws.new_project(f"verb-{verb}")  # untouched by the other tests' successful commands

    @examples(25)
    @given(argv=verb_argv(ws, verb))
    def fuzz(argv):
        code, _ = check_cli(ws, ["--project", str(project), *argv], quiet_verbs=READ_ONLY, project=project)
        if fatal.intersection(argv[1:]):
            assert code == 2, argv

    fuzz()


# --- real processes -------------------------------------------------------------------------------


@examples(6)
@given(data=mutated_specs())
def test_subprocess_exit_codes(ws, data):
    """A few generated specs through `python -m mcx plan`: the real exit code, no traceback."""
    path = ws.write(data)
    assume(data_stays_home(ws, path, []))
    before = ws.snapshot()
    proc = subprocess.run([sys.executable, "-m", "mcx", "plan", str(path)], cwd=ws.project, capture_output=True,
                          text=True, env={**os.environ, "MCX_PROJECT": str(ws.project)}, timeout=60)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert ws.snapshot() == before
    in_process, _, _ = run_main(["--project", str(ws.project), "plan", str(path)], ws.project)
    assert in_process == proc.returncode


# --- huge integers --------------------------------------------------------------------------------

# Counts that the planner enumerates divisors of, one by one: 2**62 never finishes. The odd world
# size of a mixture-of-experts spec reaches the same loop through the expert-parallel rule.
HUGE = [*((f, "tiny_moe" if "expert" in f else "tiny") for f in INT_FIELDS), ("hardware.nodes", "tiny_moe")]


@pytest.mark.parametrize("field,seed", [pytest.param(f, s, id=f"{f}-{s}") for f, s in HUGE])
def test_huge_counts_are_rejected_quickly(ws, field, seed):
    """Every integer key set to a huge value (TOML allows 64-bit integers) plans or fails within 2 s."""
    data = json.loads(json.dumps(SEEDS[seed]))
    path = tuple(field.split("."))
    _parent(data, path, create=True)[path[-1]] = 3 ** 38 if field.startswith("hardware.") else 2 ** 62  # odd world
    spec_path = ws.specs / "huge.toml"
    spec_path.write_text(tomli_w.dumps(data))
    result = load_and_plan(spec_path, limit=2.0)
    if isinstance(result, McxError):
        check_error(result, input_paths(data))


# --- output options: every path a command writes, from the parser ---------------------------------


def output_options() -> list[tuple[list[str], str, str, str]]:
    """(command words, flag, kind, required positionals' placeholders) of every output option of every
    command, read from the parser (mcx.cli.main.OUTPUTS), so a new one is fuzzed without a test edit."""
    import argparse

    from mcx.cli.main import OUTPUTS, build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, [*words, name])
        if subs:
            return
        positionals = [a for a in parser._actions if not a.option_strings and a.nargs not in ("?", "*")]
        for dest, flag, kind in parser.get_default(OUTPUTS) or []:
            found.append((words, flag, kind, ["x.toml"] * len(positionals)))

    walk(build_parser(), [])
    return found


OUTPUT_OPTIONS = output_options()


def test_every_path_writing_option_is_declared_as_an_output():
    """An option whose help says it writes somewhere must be an output option (checked and fuzzed)."""
    import argparse

    from mcx.cli.main import OUTPUTS, build_parser

    def walk(parser: argparse.ArgumentParser, words: list[str]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, [*words, name])
            elif action.option_strings and action.nargs != 0 and re.search(r"\b(write|output|out)\b", (action.help or "") + action.dest):
                declared = {d for d, _, _ in parser.get_default(OUTPUTS) or []}
                yield " ".join(words), action.option_strings, action.dest in declared

    undeclared = [(w, o) for w, o, ok in walk(build_parser(), []) if not ok]
    assert not undeclared, f"declare these with _output_option in mcx/cli/main.py: {undeclared}"
    assert {(" ".join(w), f) for w, f, _, _ in OUTPUT_OPTIONS} >= {
        ("compare", "-o"), ("import", "-o"), ("tune", "-o"), ("data prepare", "--out")}


def bad_output_paths(root: Path, kind: str) -> dict[str, str]:
    """name -> a path no command may write to, and what the error must say about it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a_dir").mkdir(exist_ok=True)
    (root / "a_file").write_text("x")
    ro = root / "read_only"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    paths = {  # (a directory option makes missing parents: not bad for it)
        **({"missing parent": str(root / "nowhere" / "deeper" / "out.txt")} if kind == "file" else {}),
        "proc": "/proc/self/mcx-out/report.txt",
        "proc file": "/proc/mcx-out.txt",
        "sys": "/sys/mcx-out.txt",
        "under a file": str(root / "a_file" / "out.txt"),
        "a device": "/dev/full",  # every write fails: found before the work, not after it
    }
    if kind == "file":
        paths["a directory"] = str(root / "a_dir")
    else:
        paths["a file"] = str(root / "a_file")
    if os.geteuid() != 0:  # root writes through permissions
        paths["unwritable"] = str(ro / "out.txt")
    return paths


@pytest.mark.parametrize("words,flag,kind,positionals",
                         [pytest.param(*o, id=f"{' '.join(o[0])} {o[1]}") for o in OUTPUT_OPTIONS])
def test_every_output_option_refuses_a_bad_path(ws, tmp_path, words, flag, kind, positionals):
    """Each bad path: exit 2, one paragraph naming the path and the fix, no traceback, nothing written."""
    project = ws.new_project(f"out-{'-'.join(words)}{flag}")
    outside = tmp_path / "outside"
    for name, path in bad_output_paths(outside, kind).items():
        before, around = ws.snapshot(project), ws.snapshot(outside)
        argv = ["--project", str(project), *words, *positionals, flag, path]
        code, out, err = run_main(argv, project)
        assert code == 2, (name, argv, err)
        assert out == "" and "Traceback" not in err, (name, err)
        assert err.startswith("mcx: error: ") and err.count("\n") == 1, (name, err)  # one paragraph
        assert path in err and "Nothing was written" in err, (name, err)
        assert any(fix in err for fix in ("choose", "create it", "give a")), (name, err)
        assert ws.snapshot(project) == before and ws.snapshot(outside) == around, name
        assert not Path(path).exists() or name in ("a directory", "a file", "a device"), name


@examples(60)
@given(data=st.data())
def test_output_options_with_generated_paths(ws, data):
    """Generated paths (junk names, deep missing directories, NUL bytes, pseudo file systems): exit 0 or 2,
    no traceback; exit 2 writes nothing."""
    words, flag, kind, positionals = data.draw(st.sampled_from(OUTPUT_OPTIONS))
    base = data.draw(st.sampled_from([str(ws.root / "gen" / "missing"), "/proc", "/proc/self", "/sys/kernel", "/",
                                      str(ws.specs / "tiny.toml"), "", "/dev/full", "/dev/zero"]))
    tail = data.draw(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
                              min_size=1, max_size=3))
    path = "/".join([base, *tail])
    assume("\x00" not in path or data.draw(st.booleans()))
    project = ws.new_project(f"outgen-{len(os.listdir(ws.root))}")
    before = ws.snapshot(project)
    code, out, err = run_main(["--project", str(project), *words, *positionals, flag, path], project)
    assert code == 2 and "Traceback" not in err and err.startswith("mcx: error: "), (path, code, err)
    assert ws.snapshot(project) == before


# --- the tail of issue 35: each case by name ------------------------------------------------------


def _spec_text(**sections: dict) -> str:
    data = json.loads(json.dumps(SEEDS["tiny"]))
    for name, table in sections.items():
        data[name] = {**data.get(name, {}), **table}
    return tomli_w.dumps(data)


def _issue35_cases(root: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv after ``--project P``, what the one-paragraph error must say), files made under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    deep = root / "deep.toml"
    deep.write_text(_spec_text() + f"\nx = {'[' * 5000}{']' * 5000}\n")
    huge = {}
    for key in ("train_iters", "seed", "eval_iters", "eval_interval"):
        huge[key] = root / f"huge-{key}.toml"
        huge[key].write_text(_spec_text().replace(f"\n{key} = ", f"\n{key} = 1{'0' * 25} # ", 1))
    hf = root / "hf.toml"
    hf.write_text(_spec_text(init={"from": "hf:" + "a" * 5000}))
    surrogate = root / "surrogate.jsonl"
    surrogate.write_text('{"text": "ok"}\n{"text": "\\ud800 lone"}\n')
    corpus = root / "corpus.jsonl"
    corpus.write_text('{"text": "a small, good corpus"}\n')
    empty_path = root / "empty-path.toml"
    empty_path.write_text(_spec_text(data={"path": ""}))
    tolerance = root / "tolerance.toml"
    tolerance.write_text(_spec_text(baseline={"tolerances": {"valid_los": 0.01}}))
    proc = root / "proc.toml"
    proc.write_text(_spec_text(data={"path": "/proc/self"}))
    tiny = root / "tiny.toml"
    tiny.write_text(_spec_text())
    fifo = root / "launch.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    cases = {
        **{f"deep-{' '.join(v)}": ([*v, str(deep)], "nested too deep")
           for v in (["plan"], ["run", "--dry-run"], ["sweep", "--dry-run"])},
        **{f"int64-{k}": (["plan", str(p)], f"train.{k}: 1{'0' * 25} does not fit in 64 bits") for k, p in huge.items()},
        "int64-set": (["run", "--dry-run", str(tiny), "--set", "train.seed=18446744073709551616"], "64 bits"),
        "seed-past-numpy": (["plan", str(tiny), "--set", "train.seed=4294967296"], "train.seed: 4294967296 is above"),
        "explain-hf-5000": (["explain", str(tiny), str(hf)], "init.from: 'aaaa"),
        "data-surrogate": (["data", "prepare", str(surrogate), "--out", str(root / "out")], "lone surrogate '\\ud800'"),
        "plan-dev-zero": (["plan", "/dev/zero"], "cannot read /dev/zero: not a regular file"),
        "data-proc-self": (["plan", str(proc)], "data.path = '/proc/self': cannot read /proc/self"),
        "set-two-lines": (["plan", str(tiny), "--set", 'train.lr=1\nname="x"'], "spans lines"),
        "empty-data-path": (["run", "--dry-run", str(empty_path)], "data.path: is empty"),
        "unknown-tolerance": (["run", "--dry-run", str(tolerance)], "baseline.tolerances.valid_los: unknown metric"),
        "tune-dev-full": (["tune", str(tiny), "-o", "/dev/full"], "-o /dev/full: is a device"),
        "import-dev-zero": (["import", "/dev/zero"], "cannot read /dev/zero (not a regular file"),
        "import-fifo": (["import", str(fifo)], "launch.fifo (not a regular file"),
        "plan-fifo": (["plan", str(fifo)], "launch.fifo: not a regular file"),
        "tokenizer-fifo": (["plan", str(tiny), "--set", 'data.tokenizer.kind="huggingface"', "--set",
                            f"data.tokenizer.path={json.dumps(str(fifo))}"], "launch.fifo (not a regular file)"),
        "tokenizer-dev-zero": (["plan", str(tiny), "--set", 'data.tokenizer.kind="sentencepiece"', "--set",
                                'data.tokenizer.path="/dev/zero"'], "cannot read /dev/zero (a kernel file system"),
        "prepare-tokenizer-fifo": (["data", "prepare", str(corpus), "--out", str(root / "out"), "--tokenizer-kind",
                                    "huggingface", "--tokenizer", str(fifo)], "(not a regular file"),
    }
    return cases


ISSUE35 = ["deep-plan", "deep-run --dry-run", "deep-sweep --dry-run", "int64-train_iters", "int64-seed",
           "int64-eval_iters", "int64-eval_interval", "int64-set", "seed-past-numpy", "explain-hf-5000",
           "data-surrogate", "plan-dev-zero", "data-proc-self", "set-two-lines", "empty-data-path",
           "unknown-tolerance", "tune-dev-full", "import-dev-zero", "import-fifo", "plan-fifo",
           "tokenizer-fifo", "tokenizer-dev-zero", "prepare-tokenizer-fifo"]


@pytest.fixture(scope="module")
def issue35(ws) -> dict[str, tuple[list[str], str]]:
    cases = _issue35_cases(ws.root / "issue35")
    assert sorted(cases) == sorted(ISSUE35)
    return cases


@pytest.mark.parametrize("name", ISSUE35)
def test_issue35_case_exits_2_in_one_paragraph_writing_nothing(ws, issue35, name):
    """Each case the generated hunt of issue 35 found: exit 2 within the hang guard, one paragraph (a spec's
    problems are one list), the key or path and the fix named, no traceback, nothing written."""
    argv, says = issue35[name]
    project = ws.new_project(f"issue35-{name}")
    before, around = ws.snapshot(project), ws.snapshot(ws.root / "issue35")
    with time_limit(60):  # the hangs (/dev/zero, /proc/self) fail here, not in CI's global timeout
        code, out, err = run_main(["--project", str(project), *argv], project)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("mcx: error: ") and "Traceback" not in err and says in err, err
    assert "\n\n" not in err.strip()
    assert ws.snapshot(project) == before and ws.snapshot(ws.root / "issue35") == around
