"""Code identity: the project's git commit plus the exact uncommitted change, and mcx itself.

Hashed (``id``):

- ``commit``: ``git rev-parse HEAD`` of the repository holding the project root (None outside git).
- ``dirty``: whether anything differs from that commit (tracked changes or untracked, not ignored
  files).
- ``diff_sha256``: the uncommitted change, untracked files included. It is computed over the
  *content* of every path that differs from HEAD (``git diff HEAD --name-status`` plus
  ``git ls-files --others --exclude-standard``): mode and sha256 of each such file, or "deleted".
  The patch text is not hashed because its bytes depend on the user's git settings
  (``diff.algorithm``, ``diff.context``, ``diff.orderFile``...); file contents do not. Ignored files
  and the project's own ``.mcx/`` state never count.
- ``mcx_version`` and ``mcx_sources``: ``mcx.__version__`` and a sha256 over mcx's ``.py`` sources.
  The sources are always hashed (a few milliseconds): an editable or pip-installed mcx outside the
  project's repository would otherwise train with code no commit names.

Side data (never hashed again): ``patch``, the tracked diff (``git diff HEAD --binary``) followed by
one new-file patch per untracked file, so ``git apply`` on the commit restores the tree. Untracked
files over ``PATCH_FILE_LIMIT`` are hashed but left out of the patch, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import mcx
from mcx.errors import EnvironmentProblem
from mcx.fingerprint.tools import GIT_ENV, run_tool
from mcx.hashing import digest, file_sha256

GIT_TIMEOUT_S = 120.0
PATCH_FILE_LIMIT = 1 << 20  # bytes; bigger untracked files are hashed but not embedded in the patch

# Patch text flags: stable prefixes, binary hunks, no user-configured helpers.
_DIFF_FLAGS = ("--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
               "--src-prefix=a/", "--dst-prefix=b/")


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


def _entry(path: Path) -> list[str]:
    """[git mode, sha256] of one working-tree path, as git would store it."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ["120000", hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()]
    if stat.S_ISDIR(st.st_mode):  # a submodule (gitlink): its checked-out commit
        head = run_tool(("git", "rev-parse", "HEAD"), cwd=path, timeout=GIT_TIMEOUT_S, env=GIT_ENV)
        commit = head.stdout.decode().strip() if head is not None and head.returncode == 0 else "unknown"
        return ["160000", commit]
    return ["100755" if st.st_mode & stat.S_IXUSR else "100644", file_sha256(path)]


def _split_z(out: bytes) -> list[str]:
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def _key(path: str) -> str:
    """A path as JSON can hold it: names that are not UTF-8 keep their bytes as \\x escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def mcx_sources_sha256() -> str:
    """sha256 over mcx's own ``.py`` files (relative path + content), sorted by path."""
    root = Path(mcx.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    return digest([[p.relative_to(root).as_posix(), file_sha256(p)] for p in files])


def _changes(top: Path, exclude: str) -> tuple[dict[str, list[str] | str], list[str]]:
    """Every path that differs from HEAD -> [mode, sha256] or "deleted"; plus the untracked paths."""
    status = _split_z(_git(top, "diff", "HEAD", "--name-status", "-z", "--no-renames", "--no-ext-diff"))
    changes: dict[str, list[str] | str] = {}
    for kind, path in zip(status[0::2], status[1::2], strict=True):
        changes[_key(path)] = "deleted" if kind == "D" else _entry(top / path)
    untracked = _split_z(_git(top, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", exclude))
    for path in untracked:
        changes[_key(path)] = _entry(top / path)
    return dict(sorted(changes.items())), untracked


def _patch(top: Path, untracked: list[str], warnings: list[str]) -> bytes:
    parts = [_git(top, "diff", "HEAD", *_DIFF_FLAGS)]
    for path in untracked:
        full = top / path
        if not full.is_symlink() and full.is_file() and full.stat().st_size > PATCH_FILE_LIMIT:
            warnings.append(f"untracked {path} ({full.stat().st_size} bytes) is hashed but not kept in the "
                            "patch; commit it or add it to .gitignore")
            continue
        # `git diff --no-index` exits 1 when the files differ, which they always do here.
        parts.append(_git(top, "diff", "--no-index", *_DIFF_FLAGS, "--", "/dev/null", path, ok=(0, 1)))
    return b"".join(parts)


def collect_code(project_root: Path) -> dict[str, Any]:
    """The code component: ``{"id": ..., "info": ..., "warnings": [...], "patch": bytes | None}``."""
    project_root = Path(project_root).resolve()
    warnings: list[str] = []
    ident: dict[str, Any] = {"commit": None, "dirty": None, "diff_sha256": None,
                             "mcx_version": mcx.__version__, "mcx_sources": mcx_sources_sha256()}
    info: dict[str, Any] = {"git_root": None, "changes": {}}
    try:
        top = Path(_git(project_root, "rev-parse", "--show-toplevel").decode().strip())
        commit = _git(top, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
    except _NotGit as exc:
        warnings.append(f"{project_root} is not a git checkout with a commit ({exc}); the run ID covers the "
                        "spec, data and mcx's own sources but not other project files; `git init` and commit")
        return {"id": ident, "info": info, "warnings": warnings, "patch": None}
    mcx_state = (project_root / ".mcx").relative_to(top).as_posix()
    changes, untracked = _changes(top, f":(exclude){mcx_state}")
    ident.update(commit=commit, dirty=bool(changes), diff_sha256=digest(changes) if changes else None)
    info.update(git_root=str(top), changes=changes)
    patch = _patch(top, untracked, warnings) if changes else None
    return {"id": ident, "info": info, "warnings": warnings, "patch": patch}
