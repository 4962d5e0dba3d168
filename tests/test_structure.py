"""The shape of the code (docs/architecture.md): no import cycle between modules, packages import
only downward, and the control plane leaves torch, Megatron, MLflow and DVC alone.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import``,
at module level, inside functions and under ``if TYPE_CHECKING:`` alike (an import hidden in a
function is still a dependency), ``from package import name`` resolved to the submodule where
``name`` is one. A package's ``__init__`` that a submodule's import runs implicitly is not an edge.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcx.spec.load import dump_spec, load_spec

ROOT = Path(__file__).resolve().parents[1]
MCX = ROOT / "mcx"

# Cycles still tolerated, each as the sorted tuple of its modules. Empty: none is.
ALLOWED_CYCLES: frozenset[tuple[str, ...]] = frozenset()

# Layers, lowest first (docs/architecture.md): a module imports only from its own layer or below.
# The package ``mcx`` itself holds ``__version__``; ``mcx.__main__`` is ``python -m mcx``.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The contract's names and statuses are plain data: below everything that reads or writes a stage directory.
    ("mcx", "mcx.errors", "mcx.hashing", "mcx.jsonfile", "mcx.contract.files", "mcx.contract.status"),
    ("mcx.spec",),
    ("mcx.plan", "mcx.contract", "mcx.launch", "mcx.track", "mcx.data", "mcx.fingerprint", "mcx.metrics", "mcx.weights",
     "mcx.eval"),
    ("mcx.train", "mcx.report", "mcx.interop"),
    ("mcx.ops",),
    ("mcx.cli",),
    ("mcx.__main__",),
)
HEAVY = ("torch", "megatron", "mlflow", "dvc", "safetensors")
# Variables that would send records elsewhere or change what a command does (conftest.E2E_ENV_DROP).
ENV_DROP = ("MLFLOW_TRACKING_URI", "MCX_PROJECT", "MCX_LOCKFILE")
# What may import torch and megatron at module level: the worker, the modules of mcx.weights that move
# tensors, and the harness's model over the Megatron-Core model (the control plane reaches none of them: only
# the functions of the commands that need them, or the worker processes, import them).
WORKER = ("mcx.train", "mcx.weights.canonical", "mcx.weights.hf_convert", "mcx.weights.dist", "mcx.eval.megatron_lm")


# -- the import graph --------------------------------------------------------------------------------

def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(MCX.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """``name`` or its nearest enclosing module that is part of mcx (None: not ours)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported mcx module, line) for every import statement anywhere in ``module``."""
    path, package = MODULES[module]
    here = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _known(alias.name)) is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                target = sub if sub in MODULES else _known(source)
                if target is not None:
                    yield target, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}; self-imports left out."""
    graph: dict[str, dict[str, int]] = {}
    for module in MODULES:
        edges = graph.setdefault(module, {})
        for target, line in _imports(module):
            if target != module:
                edges.setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a list of modules (first == last)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no cycle through {start}")


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} -> {b} ({MODULES[a][0].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "\n    ".join(steps)


def test_the_graph_sees_function_level_and_submodule_imports():
    """The reader itself: an import inside a function counts, and ``from mcx.track import paths``
    is an import of mcx.track.paths, not of the package."""
    graph = import_graph()
    assert "mcx.track.mlflow_store" in graph["mcx.track.recorder"]  # imported inside RunRecorder.store
    assert "mcx.track.paths" in graph["mcx.track.runcache"] and "mcx.track" not in graph["mcx.track.runcache"]
    assert "mcx.cli.main" in graph["mcx.__main__"]


def test_no_import_cycles():
    graph = import_graph()
    cycles = [c for c in strongly_connected(graph) if tuple(c) not in ALLOWED_CYCLES]
    for component in cycles:
        print(f"cycle among {', '.join(component)}:\n    {describe_cycle(graph, one_cycle(graph, component))}")
    assert not cycles, "import cycles (printed above); break each by moving what both sides need into a module below both"


# -- layers --------------------------------------------------------------------------------------------

def layer_of(module: str) -> tuple[int, str]:
    """(layer, the package or top-level module that places it)."""
    best: tuple[int, str] | None = None
    for level, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (level, name)
    assert best is not None, f"{module} is in no layer of tests/test_structure.py's LAYERS; add its package"
    return best


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_packages_import_only_downward():
    """cli -> ops -> train/report/interop -> plan/launch/track/data/fingerprint/metrics/weights -> spec
    -> errors/hashing: nothing imports from a layer above its own."""
    graph = import_graph()
    upward = []
    for module, edges in sorted(graph.items()):
        mine, unit = layer_of(module)
        for target, line in sorted(edges.items()):
            theirs, other = layer_of(target)
            if theirs > mine:
                upward.append(f"{module} ({unit}, layer {mine}) imports {target} ({other}, layer {theirs}) "
                              f"at {MODULES[module][0].relative_to(ROOT)}:{line}")
    assert not upward, "imports upward:\n" + "\n".join(upward)


def test_no_two_packages_import_each_other():
    """Between packages, too, data flows one way (even through a third package)."""
    graph = import_graph()
    packages: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        unit = layer_of(module)[1]
        for target, line in edges.items():
            other = layer_of(target)[1]
            if other != unit:
                packages.setdefault(unit, {}).setdefault(other, line)
            packages.setdefault(other, {})
    cycles = strongly_connected(packages)
    assert not cycles, f"packages that import each other: {cycles}"


# -- heavy imports ---------------------------------------------------------------------------------------

def _import_time_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Top-level package names imported when the module is imported: everything but function bodies
    and ``if TYPE_CHECKING:`` blocks."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name.split(".")[0], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.split(".")[0], node.lineno
        todo.extend(ast.iter_child_nodes(node))


def test_only_the_worker_imports_torch_megatron_mlflow_or_dvc_at_import_time():
    found = []
    for module, (path, _) in sorted(MODULES.items()):
        if any(module == w or module.startswith(w + ".") for w in WORKER):
            continue
        for name, line in _import_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if name in HEAVY:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not found, "control-plane modules importing heavy packages at import time (import them inside the " \
                      "function that needs them):\n" + "\n".join(found)


# What `python -m mcx` has imported of HEAVY when it exits: the command's own modules and nothing else.
PROBE = """
import atexit, json, runpy, sys
HEAVY = %r
atexit.register(lambda: print("HEAVY=" + json.dumps(sorted(h for h in HEAVY if h in sys.modules)), file=sys.stderr))
sys.argv = ["mcx", *sys.argv[1:]]
runpy.run_module("mcx", run_name="__main__", alter_sys=True)
""" % (HEAVY,)

RUN_A, RUN_B = "aaaa1111bbbb", "cccc2222dddd"


def _write_run(runs: Path, run_id: str, lr: float) -> None:
    """A finished run directory, as `mcx run` leaves it (what `mcx compare` reads)."""
    spec = load_spec(ROOT / "experiments" / "tiny.toml", [f"train.lr={lr}"])
    d = runs / run_id
    (d / "full").mkdir(parents=True)
    (d / "spec.toml").write_text(dump_spec(spec), encoding="utf-8")
    component = {"id": {"x": run_id}, "info": {}, "warnings": []}
    (d / "fingerprint.json").write_text(json.dumps({"run_id": run_id, "components": {
        c: component for c in ("code", "environment", "config", "data", "hardware")}}), encoding="utf-8")
    (d / "plan.json").write_text("{}", encoding="utf-8")
    lines = [{"kind": "train", "step": s, "loss": 8.0 - s / 10 - lr, "grad_norm": 1.0, "lr": lr,
              "tokens_per_s_per_gpu": 1000.0 + s, "tflops_per_gpu": 0.1, "mfu": None, "mem_peak_bytes": 1 << 28,
              "step_time_s": 0.5, "time": 1_750_000_000.0 + s} for s in range(1, 21)]
    lines.append({"kind": "valid", "step": 20, "loss": 6.5 - lr, "ppl": 665.0})
    (d / "full" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    (d / "full" / "result.json").write_text(json.dumps({
        "status": "finished", "passed": True, "checks": {}, "final": {}, "error": None, "steps": 20,
        "layer_spec": "local", "versions": {}}), encoding="utf-8")
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "status": "finished"}), encoding="utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("structure") / "project"
    (root / "experiments").mkdir(parents=True)
    (root / "experiments" / "tiny.toml").write_text((ROOT / "experiments" / "tiny.toml").read_text())
    for run_id, lr in ((RUN_A, 3e-3), (RUN_B, 1e-3)):
        _write_run(root / ".mcx" / "runs", run_id, lr)
    return root


@pytest.mark.parametrize("argv, heavy", [
    (["plan", "experiments/tiny.toml"], []),
    (["run", "experiments/tiny.toml", "--dry-run"], []),
    (["compare", RUN_A, RUN_B], []),
    (["ls"], []),
], ids=["plan", "run-dry-run", "compare", "ls"])
def test_the_cli_imports_heavy_packages_only_where_a_command_needs_them(project, argv, heavy):
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", PROBE, "--project", str(project), *argv], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    assert loaded and json.loads(loaded[-1][len("HEAVY="):]) == heavy, (proc.stderr[-3000:], proc.stdout[-1500:])


def test_every_page_of_docs_the_code_names_exists():
    """Messages and comments send readers to docs/*.md; a page renamed or never written leaves them nowhere
    (the plan's step-time table once cited docs/planning.md)."""
    import re

    named = {(m.group(0), path.relative_to(ROOT).as_posix())
             for path in MCX.rglob("*.py") for m in re.finditer(r"docs/[\w.-]+\.md", path.read_text())}
    assert named, "the scan found no reference at all: its pattern is wrong"
    missing = sorted((page, where) for page, where in named if not (ROOT / page).is_file())
    assert not missing, missing


# -- one plan of each stage ------------------------------------------------------------------------------

def test_a_stages_spec_layout_and_device_are_derived_only_by_make_plan():
    """The smoke stage's spec is shrunk in one place (mcx.plan.stages.smoke_spec) and called from one
    (mcx.plan.planner.make_plan, into a StagePlan); everything else reads ``plan.stage(name)``. A second
    derivation (once at five call sites, the device at four) is how two views of one stage drift apart."""
    import re

    callers = sorted(path.relative_to(ROOT).as_posix() for path in [*MCX.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
                     if re.search(r"\bsmoke_spec\b", path.read_text(encoding="utf-8")))
    assert callers == ["mcx/plan/planner.py", "mcx/plan/stages.py", "tests/test_structure.py"], callers
    for name in ("stage_spec", "stage_device"):  # the old derivations are gone, not renamed in place
        found = [path.relative_to(ROOT).as_posix() for path in MCX.rglob("*.py")
                 if re.search(rf"\bdef {name}\b", path.read_text(encoding="utf-8"))]
        assert not found, (name, found)


def test_the_control_plane_and_the_worker_meet_only_in_the_contract():
    """The job, the stage result, the statuses, the stage directory's files and the checkpoint layout live in
    mcx.contract, which both sides import; nothing outside the worker imports mcx.train (ops once imported
    mcx.train.job and mcx.train.checkpoint for them), and the contract imports neither side."""
    graph = import_graph()
    into_worker = sorted(f"{module} imports {target}" for module, edges in graph.items() for target in edges
                         if target.startswith("mcx.train") and not module.startswith("mcx.train"))
    assert not into_worker, into_worker
    contract = [m for m in graph if m.startswith("mcx.contract")]
    assert {"mcx.contract.job", "mcx.contract.result", "mcx.contract.status", "mcx.contract.files",
            "mcx.contract.checkpoints"} <= set(contract)
    upward = sorted(f"{module} imports {target}" for module in contract for target in graph[module]
                    if target.startswith(("mcx.train", "mcx.ops", "mcx.launch", "mcx.track", "mcx.cli")))
    assert not upward, upward



def _status_literals() -> Iterator[tuple[str, str]]:
    """(where, value) of each string the code writes as a status or compares a status with: ``"status": "..."``,
    ``status="..."``, and ``<x>.status`` / ``<x>.get("status")`` against a literal."""
    def is_status(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "status") or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "status")

    for module, (path, _) in sorted(MODULES.items()):
        if module == "mcx.track.mlflow_store":  # MLflow's own run statuses (RUNNING, FINISHED, KILLED)
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            found: list[ast.AST] = []
            if isinstance(node, ast.Dict):
                found = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "status"]
            elif isinstance(node, ast.keyword) and node.arg == "status":
                found = [node.value]
            elif isinstance(node, ast.Compare) and is_status(node.left):
                found = node.comparators
            while found:
                value = found.pop()
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield where, value.value
                elif isinstance(value, (ast.Tuple, ast.List, ast.Set)):
                    found += value.elts
                elif isinstance(value, ast.IfExp):
                    found += [value.body, value.orelse]
                elif isinstance(value, ast.BoolOp):
                    found += value.values


def test_every_status_written_to_disk_is_a_status_of_the_contract():
    """result.json, run.json and the mcx.status tag spell a stage's or a run's end with mcx.contract.status.Status
    (its values are the strings the files always held): no status the code writes or compares is outside it."""
    from mcx.contract.status import Status, parse_status

    found = list(_status_literals())
    assert found, "the scan found no status at all: its pattern is wrong"
    unknown = sorted(f"{where}: {value!r}" for where, value in found if parse_status(value) is None)
    assert not unknown, unknown
    assert {parse_status(s.value) for s in Status} == set(Status)  # each value parses back to its member
    assert parse_status("finished") is Status.FINISHED and parse_status("done") is None and parse_status(None) is None
