"""The git worktrees `mcx reproduce` makes, and which of them are left over.

``mcx reproduce`` checks the recorded code out into ``<tmp>/mcx-repro-<run_id>-XXXX/code`` and
removes it when it ends. While it runs it holds ``<tmp>/mcx-repro-.../lock`` (the run lock of
mcx.track.runcache: a killed process releases it), so a worktree there whose lock nobody holds was
left by a process killed before its cleanup. A registration whose directory is gone is what
``git worktree prune`` would drop. Only mcx's own worktrees are listed: the user's are not mcx's to
prune. Registrations are read from git's layout (``<common dir>/worktrees/<name>/gitdir`` names
``<worktree>/.git``), which also says where each one's administrative files are.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from attrs import frozen

PREFIX = "mcx-repro-"
CODE = "code"  # the worktree itself, inside the temporary directory
_OURS = re.compile(rf"^{PREFIX}[0-9a-f]{{12}}-")


@frozen
class Worktree:
    path: Path  # the worktree (…/mcx-repro-<id>-XXXX/code)
    admin: Path  # its registration: <git common dir>/worktrees/<name>

    @property
    def home(self) -> Path:
        """The temporary directory reproduce made for it (the worktree and the lock)."""
        return self.path.parent


def reproduction_worktrees(project: Path) -> list[Worktree]:
    """The reproduction worktrees registered in ``project``'s git repository ([] outside git)."""
    proc = subprocess.run(["git", "-C", str(project), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                          capture_output=True, text=True)
    if proc.returncode:
        return []
    out = []
    for admin in sorted(Path(proc.stdout.strip(), "worktrees").glob("*/")):
        try:
            path = Path((admin / "gitdir").read_text(encoding="utf-8").strip()).parent
        except (OSError, UnicodeDecodeError):
            continue
        if path.name == CODE and _OURS.match(path.parent.name):
            out.append(Worktree(path, admin))
    return out


def remove(project: Path, worktree: Worktree) -> None:
    """Drop the registration and delete the temporary directory (git's own removal first)."""
    import shutil

    subprocess.run(["git", "-C", str(project), "worktree", "remove", "--force", str(worktree.path)],
                   capture_output=True)
    for leftover in (worktree.home, worktree.admin):
        if leftover.is_dir():
            shutil.rmtree(leftover)
