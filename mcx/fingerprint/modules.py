"""The modules of the mcx package that a run executes: the import closure of its entry points.

A run executes the worker (``python -m mcx.train``) and, before it, the control plane's planner and stage
launcher, which decide what the worker is given (the stage's spec and layout, the job file, the worker's
environment). Those entry points and every mcx module they import, followed through the sources as written
(imports inside functions too, and each package's ``__init__``, which Python runs on the way), are the code
the run ID hashes. The rest of mcx (the CLI, reports, Megatron-LM import and export, sweeps and tuning, which
reach training only through a spec) is not.

The imports are read with a regular expression instead of ``ast``: it reads the package in a few
milliseconds against half a second for ``ast.parse`` (``mcx plan`` stays fast), and tests/test_fingerprint.py
checks that it finds exactly the edges ``ast`` finds in every module of mcx.
"""

from __future__ import annotations

import re
from pathlib import Path

# python -m mcx.train; the planner; the stage launcher (ops.run -> ops.stage -> launch, job file, env).
ENTRY_POINTS = ("mcx.train.__main__", "mcx.plan.planner", "mcx.ops.run")

_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.MULTILINE)


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of the package at ``package``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = (package.name, *path.relative_to(package).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every dotted name an import statement of ``source`` may load (``from a.b import c`` -> a.b, a.b.c)."""
    base = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for dots, target, what in _FROM.findall(source):
        if dots:  # relative: each dot beyond the first climbs one package
            anchor = base.split(".")[: len(base.split(".")) - (len(dots) - 1)]
            target = ".".join([*anchor, target] if target else anchor)
        names.add(target)
        for item in what.strip("()").split(","):
            item = item.split("#")[0].strip().split(" as ")[0].strip()
            if item and item != "*":
                names.add(f"{target}.{item}")
    for group in _IMPORT.findall(source):
        names.update(item.strip().split(" as ")[0].strip() for item in group.split(","))
    return names


def dependencies(name: str, files: dict[str, Path]) -> set[str]:
    """The package's modules that importing ``name`` loads directly: each import and its parent packages."""
    path = files[name]
    found = set()
    for target in imported_names(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"):
        while target:
            if target in files:
                found.add(target)
            target = target.rpartition(".")[0]
    return found - {name}


def closure(package: Path, roots: tuple[str, ...] = ENTRY_POINTS) -> dict[str, Path]:
    """The modules loaded by importing ``roots`` (and their parent packages), by name, sorted."""
    files = module_files(package)
    seen: set[str] = set()
    todo = [r for r in roots if r in files]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        todo.extend(d for d in (dependencies(name, files) | ({parent} if parent in files else set())) if d not in seen)
    return {name: files[name] for name in sorted(seen)}
