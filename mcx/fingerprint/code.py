"""Code identity: the content of the mcx modules a run executes; the repository's state as provenance.

Hashed (``id``): ``{"modules": {"mcx/train/loop.py": "<sha256>", ...}}``, every module of the mcx package
that the worker, the planner and the stage launcher import (``mcx.fingerprint.modules``), by the sha256 of
its bytes, from the package the worker will import (``worker_package``). What a spec points to (datasets,
tokenizer files, the weights a run starts from) is hashed by the data and init components, the installed
packages by the environment's lockfile. Nothing else of the repository is: not its commit, branch or other
files, tracked or not. So committing a checkpoint pointer, a ``.dvc`` file, an export, a doc or another
spec leaves every run ID as it was; editing a module a run executes changes it (docs/decisions.md D52).

Not hashed (``info``), the code's provenance: ``git_root``, ``commit``, ``branch``, ``dirty`` and
``changes`` (each path that differs from the commit: "modified", "deleted" or "untracked"; the project's
``.mcx/`` and ignored files never count), ``mcx_version`` and ``mcx_root`` (where the hashed package was
read). ``mcx show`` prints it; ``mcx reproduce`` rebuilds the tree from it.

Side data (never hashed): ``patch``, the tracked diff (``git diff HEAD --binary``) followed by one new-file
patch per untracked file, so ``git apply`` on the commit restores the tree. Untracked files over
``PATCH_FILE_LIMIT`` are left out of the patch, with a warning.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import mcx
from mcx.errors import EnvironmentProblem
from mcx.fingerprint.modules import closure
from mcx.fingerprint.tools import GIT_ENV, run_tool
from mcx.hashing import file_sha256

GIT_TIMEOUT_S = 120.0
PATCH_FILE_LIMIT = 1 << 20  # bytes; bigger untracked files are left out of the patch

# Patch text flags: stable prefixes, binary hunks, no user-configured helpers.
_DIFF_FLAGS = ("--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
               "--src-prefix=a/", "--dst-prefix=b/")
_STATUS = {"D": "deleted"}  # git's name-status letters; anything else of a tracked path is "modified"


class _NotGit(Exception):
    """The project root is not inside a usable git work tree (the message says why)."""


def _git(top: Path, *args: str, ok: tuple[int, ...] = (0,)) -> bytes:
    try:
        proc = run_tool(("git", "-c", "core.quotepath=on", *args), cwd=top, timeout=GIT_TIMEOUT_S, env=GIT_ENV)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(
            f"git {args[0]} in {top} took longer than {GIT_TIMEOUT_S:.0f} s",
            "check the repository (a huge untracked directory? add it to .gitignore).",
        ) from None
    if proc is None:
        raise _NotGit("git is not installed")
    if proc.returncode not in ok:
        err = proc.stderr.decode("utf-8", "replace").strip()
        if "safe.directory" in err:
            raise EnvironmentProblem(
                f"git refuses to read {top}: the repository is owned by another user",
                f"run `git config --global --add safe.directory {top}` if you trust it.",
            )
        raise _NotGit(err.splitlines()[0] if err else f"git {args[0]} exited with {proc.returncode}")
    return proc.stdout


def _split_z(out: bytes) -> list[str]:
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def _key(path: str) -> str:
    """A path as JSON can hold it: names that are not UTF-8 keep their bytes as \\x escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def worker_package(code_path: Path | None = None) -> Path:
    """The mcx package the worker imports: a reproduction's tree's own ``mcx/`` where it holds one (the worker
    gets that tree first on its path), else the one this process imported."""
    if code_path is not None and (Path(code_path) / "mcx" / "__init__.py").is_file():
        return Path(code_path).resolve() / "mcx"
    return Path(mcx.__file__).resolve().parent


def module_hashes(package: Path) -> dict[str, str]:
    """``{"mcx/train/loop.py": sha256}`` for every module a run executes (mcx.fingerprint.modules)."""
    base = package.parent
    return {path.relative_to(base).as_posix(): file_sha256(path) for path in closure(package).values()}


def _changes(top: Path, exclude: str) -> tuple[dict[str, str], list[str]]:
    """Every path that differs from HEAD -> "modified" | "deleted" | "untracked"; plus the untracked paths."""
    status = _split_z(_git(top, "diff", "HEAD", "--name-status", "-z", "--no-renames", "--no-ext-diff"))
    changes = {_key(path): _STATUS.get(kind, "modified") for kind, path in zip(status[0::2], status[1::2], strict=True)}
    untracked = _split_z(_git(top, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", exclude))
    changes.update((_key(path), "untracked") for path in untracked)
    return dict(sorted(changes.items())), untracked


def _patch(top: Path, untracked: list[str], warnings: list[str]) -> bytes:
    parts = [_git(top, "diff", "HEAD", *_DIFF_FLAGS)]
    for path in untracked:
        full = top / path
        if not full.is_symlink() and full.is_file() and full.stat().st_size > PATCH_FILE_LIMIT:
            warnings.append(f"untracked {path} ({full.stat().st_size} bytes) is left out of the recorded patch "
                            "(mcx reproduce cannot rebuild it); commit it or add it to .gitignore")
            continue
        # `git diff --no-index` exits 1 when the files differ, which they always do here.
        parts.append(_git(top, "diff", "--no-index", *_DIFF_FLAGS, "--", "/dev/null", path, ok=(0, 1)))
    return b"".join(parts)


def collect_code(project_root: Path, code_path: Path | None = None) -> dict[str, Any]:
    """The code component: ``{"id": ..., "info": ..., "warnings": [...], "patch": bytes | None}``.

    ``code_path``: a reproduction's rebuilt tree, whose own mcx (if it holds one) the worker imports."""
    project_root = Path(project_root).resolve()
    package = worker_package(code_path)
    warnings: list[str] = []
    ident = {"modules": module_hashes(package)}
    info: dict[str, Any] = {"mcx_version": mcx.__version__, "mcx_root": str(package), "git_root": None,
                            "commit": None, "branch": None, "dirty": None, "changes": {}}
    try:
        top = Path(_git(project_root, "rev-parse", "--show-toplevel").decode().strip())
        commit = _git(top, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
    except _NotGit as exc:
        warnings.append(f"{project_root} is not a git checkout with a commit ({exc}); the run ID is unaffected, "
                        "but `mcx reproduce` can only rerun it where mcx's modules are the recorded ones; "
                        "`git init` and commit")
        return {"id": ident, "info": info, "warnings": warnings, "patch": None}
    branch = _git(top, "symbolic-ref", "-q", "--short", "HEAD", ok=(0, 1)).decode().strip() or None
    mcx_state = (project_root / ".mcx").relative_to(top).as_posix()
    changes, untracked = _changes(top, f":(exclude){mcx_state}")
    info.update(git_root=str(top), commit=commit, branch=branch, dirty=bool(changes), changes=changes)
    patch = _patch(top, untracked, warnings) if changes else None
    return {"id": ident, "info": info, "warnings": warnings, "patch": patch}


def module_changes(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The module files whose content differs between two code ids ("path (added)", "path (removed)", "path");
    [] when they are equal. A record made before D52 has no module list: ["(recorded before modules were
    hashed by content)"]."""
    a, b = recorded.get("modules"), now.get("modules")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if recorded == now else ["(recorded before modules were hashed by content)"]
    return [f"{p} (added)" if p not in a else f"{p} (removed)" if p not in b else p
            for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p)]
