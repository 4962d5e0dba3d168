"""A run directory's JSON records, read strictly: ``run.json``, ``fingerprint.json`` and each stage's
``result.json`` are written whole (mcx.jsonfile), so one that is there but is not a JSON object was damaged
afterwards (cut short, overwritten). It is named, never read as empty: an empty record reads as a run that
never finished (D48). A record that is absent is not damage (a clone holds only pulled checkpoints; a stage
still running has no result yet).
"""

from __future__ import annotations

import json
from pathlib import Path

from mcx.errors import InputError
from mcx.track import paths

RECORDS = ("run.json", "fingerprint.json", *(f"{stage}/{paths.RESULT_FILE}" for stage in paths.STAGES))


def problem(path: Path) -> str | None:
    """What is wrong with the record ``path`` ("not JSON: ...", "a JSON array, not an object"); None when it
    is absent or a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"{len(text.encode())} B that are not JSON ({exc})"
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
        return f"a JSON {kind}, not an object"
    return None


def damaged(run_path: Path) -> list[str]:
    """``"<record>: <problem>"`` for each damaged record of the run directory ``run_path`` (RECORDS' order)."""
    found = ((name, problem(run_path / name)) for name in RECORDS)
    return [f"{name}: {what}" for name, what in found if what is not None]


def damaged_error(project_root: Path, run_path: Path, problems: list[str]) -> InputError:
    """The error for a run whose records are damaged: each file named, and the two fixes there are."""
    shown = run_path.relative_to(project_root).as_posix() if run_path.is_relative_to(project_root) else str(run_path)
    many = len(problems) != 1
    return InputError(f"run {run_path.name}'s record{'s' * many} in {shown}/ {'are' if many else 'is'} damaged: "
                      f"{'; '.join(problems)};",
                      "mcx writes it again when it runs the spec that made the run (`mcx run SPEC`, with the same code "
                      "and data: each stage whose result.json is intact is reused, not trained again), or remove the "
                      "run directory "
                      f"(rm -r {shown}) if the run is not wanted.")
