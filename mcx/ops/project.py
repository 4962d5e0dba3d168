"""Where the project is, and where mcx keeps its state inside it."""

from __future__ import annotations

import os
from pathlib import Path

from mcx.errors import InputError

STATE_DIR = ".mcx"


def find_project(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The project root: --project, else $MCX_PROJECT, else the nearest ancestor holding .git or .dvc."""
    given = explicit or os.environ.get("MCX_PROJECT")
    if given:
        root = Path(given).resolve()
        try:
            found = root.is_dir()
        except OSError as exc:
            raise InputError(f"project directory {str(given)[:40]!r}...: {exc.strerror};",
                             "pass an existing directory to --project.") from None
        if not found:
            raise InputError(f"project directory {given!r} does not exist;", "pass an existing directory to --project.")
        return root
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists() or (d / ".dvc").is_dir():
            return d
    return here


def state_dir(project: Path) -> Path:
    return project / STATE_DIR


def runs_dir(project: Path) -> Path:
    return state_dir(project) / "runs"
