"""The tasks of an evaluation: lm-evaluation-harness registry names or local task directories.

A directory (YAML task configs and their local data, e.g. ``evals/quickstart_next_line``) is read by the
harness through its ``include_path``; its identity is every file's sha256, so a changed item or prompt is
another evaluation. A registry task ships with the harness: its identity is the harness's version (its data
comes from the local datasets cache, which the harness checks by the task's own revision pins).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.hashing import file_sha256

HARNESS = "lm-eval"
_TASK_LINE = re.compile(r"^task:\s*['\"]?([A-Za-z0-9_.\-]+)", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@frozen
class TaskSource:
    """One entry of ``eval.tasks``: the harness names it runs and, for a directory, where it lies."""

    given: str  # as the spec or --tasks wrote it
    names: tuple[str, ...]  # the harness's task names
    directory: str | None = None  # absolute path of a local task directory; None: the harness's registry
    files: tuple[tuple[str, str], ...] = ()  # (path in the directory, sha256) of every file, for the key

    def identity(self) -> dict[str, object]:
        if self.directory is None:
            return {"registry": self.given}
        return {"directory": dict(self.files), "names": list(self.names)}


def harness_version() -> str:
    """The installed lm-evaluation-harness's version, read from its metadata (nothing imported)."""
    try:
        return importlib.metadata.version(HARNESS)
    except importlib.metadata.PackageNotFoundError:
        raise InputError("lm-evaluation-harness is not installed here;",
                         "install mcx's eval extra (`pip install -e '.[eval]'`; ./dev installs it from "
                         "lockfiles/cpu.txt).") from None


def resolve_tasks(given: tuple[str, ...], project: Path) -> tuple[TaskSource, ...]:
    """Each entry as a directory (relative to the project, or absolute) when one is there, else a registry name."""
    out = []
    for entry in given:
        path = Path(entry).expanduser()
        path = path if path.is_absolute() else Path(project) / path
        if path.is_dir():
            out.append(_directory(entry, path.resolve()))
        elif "/" in entry or not _NAME.fullmatch(entry):
            raise InputError(f"eval task {entry!r} is neither a task directory here nor a task name;",
                             "give a directory of lm-eval task YAML files (relative to the project) or a registry "
                             "name such as hellaswag.")
        else:
            out.append(TaskSource(given=entry, names=(entry,)))
    return tuple(out)


def _directory(entry: str, path: Path) -> TaskSource:
    files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    names: list[str] = []
    for yaml in (p for p in files if p.suffix in (".yaml", ".yml")):
        names += [n for n in _TASK_LINE.findall(yaml.read_text(encoding="utf-8")) if n not in names]
    if not names:
        raise InputError(f"eval task directory {entry} has no YAML file with a `task:` name;",
                         "point at a directory of lm-eval task configs (see evals/quickstart_next_line).")
    digests = tuple((p.relative_to(path).as_posix(), file_sha256(p)) for p in files)
    return TaskSource(given=entry, names=tuple(names), directory=str(path), files=digests)
