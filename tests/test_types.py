"""The type checker passes: mypy, configured in pyproject.toml ([tool.mypy]), strict on mcx/plan, mcx/fingerprint
and mcx/ops (docs/decisions.md D54), checked on every other package (D58, D62). Run here so that `./dev test` and CI
fail on a type error as on a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Checked, not strict (D58, D62): the run records' packages and their views, the metrics, the CLI, the spec, the
# data, the weights' converters, the script importer, the launchers, the worker, the job contract, the evaluation,
# the root modules: with plan, fingerprint and ops (strict), every package of mcx.
CHECKED = ("mcx/report", "mcx/track", "mcx/metrics", "mcx/cli", "mcx/spec", "mcx/data", "mcx/weights", "mcx/interop",
           "mcx/launch", "mcx/train", "mcx/contract", "mcx/eval")
CHECKED_FILES = ("mcx/errors.py", "mcx/hashing.py", "mcx/jsonfile.py")


@pytest.mark.slow
def test_mypy_passes_on_the_configured_packages():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=REPO, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_strict_packages_are_checked_strictly():
    """The strict flags reach every module of the three packages (mypy's per-module `strict` would reach all)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert set(config["files"]) == {"mcx/plan", "mcx/fingerprint", "mcx/ops", *CHECKED, *CHECKED_FILES}
    strict = [o for o in config["overrides"] if o.get("disallow_untyped_defs")]
    assert len(strict) == 1 and set(strict[0]["module"]) == {"mcx.plan.*", "mcx.fingerprint.*", "mcx.ops.*"}
    flags = ("disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls", "disallow_incomplete_defs",
             "check_untyped_defs", "disallow_untyped_decorators", "warn_return_any", "no_implicit_reexport",
             "strict_equality", "extra_checks")
    assert all(strict[0].get(flag) is True for flag in flags), [f for f in flags if strict[0].get(f) is not True]
    assert config["warn_unused_ignores"] and config["warn_redundant_casts"]


def test_the_checked_packages_are_read_whole_and_none_is_ignored():
    """The run records' packages, their views, the metrics, the CLI, the launchers, the worker and the root
    modules: every function body checked, and none of them in ``ignore_errors``."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    modules = {p.replace("/", ".") + ".*" for p in CHECKED} | {p.removesuffix(".py").replace("/", ".") for p in CHECKED_FILES}
    body = [o for o in config["overrides"] if o.get("check_untyped_defs") and not o.get("disallow_untyped_defs")]
    assert len(body) == 1 and set(body[0]["module"]) == modules
    ignored = {m for o in config["overrides"] if o.get("ignore_errors") for m in o["module"]}
    assert not ignored & modules, ignored & modules
    packages = {f"mcx/{p.parent.name}" for p in (REPO / "mcx").glob("*/__init__.py")}
    assert packages <= set(config["files"]), f"packages mypy does not check: {sorted(packages - set(config['files']))}"
