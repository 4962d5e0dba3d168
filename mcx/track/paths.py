"""Where mcx.track keeps its state inside a project, and small file helpers it shares.

    <project>/.mcx/mlflow.db              embedded MLflow store (SQLite)
    <project>/.mcx/mlartifacts/<exp>/     embedded MLflow artifacts, one folder per experiment
    <project>/.mcx/dvc-remote/            embedded DVC remote
    <project>/.mcx/runs/<run_id>/         run directory (docs/runs.md)
    <project>/.mcx/checkpoints/<run_id>/  DVC pointers to the run's final checkpoints, <stage>.dvc: the one
                                          part of .mcx/ that is committed (.gitignore: /.mcx/* then
                                          !/.mcx/checkpoints/), so that clones can pull them (D38)
        track/                            the spool: journal.jsonl, acked.json, ids.json, target.json,
                                          artifacts/ (redacted copies of what is uploaded), lock
        <stage>/tracked.json              metrics cursor: what of <stage>/metrics.jsonl MLflow holds
        <stage>/tracked.system[.N].json   the same for <stage>/system[.N].jsonl (system metrics of node N)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from mcx.errors import RunIdError
from mcx.contract.files import METRICS_FILE, RESULT_FILE  # noqa: F401  (track modules use them as paths.*)
from mcx.jsonfile import read_json, write_json_atomic  # noqa: F401  (track modules use them as paths.*)

STATE_DIR = ".mcx"
RUNS = "runs"
POINTERS = "checkpoints"
EMBEDDED_DB = "mlflow.db"
EMBEDDED_ARTIFACTS = "mlartifacts"
DVC_REMOTE_DIR = "dvc-remote"
TRACK_DIR = "track"
SWEEPS = "sweeps"
CURSOR_FILE = "tracked.json"
STAGES = ("smoke", "full")

RUN_ID_PATTERN = re.compile(r"^[0-9a-f]{12}$")


def state_dir(project_root: Path) -> Path:
    return Path(project_root) / STATE_DIR


def sweeps_dir(project_root: Path) -> Path:
    """Where each sweep keeps its definition, study and records (mcx.ops.sweep)."""
    return state_dir(project_root) / SWEEPS


def runs_dir(project_root: Path) -> Path:
    return state_dir(project_root) / RUNS


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is 12 lowercase hex digits (so it is safe as a path and a filter value)."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise RunIdError(f"{run_id!r} is not a run ID",
                         "a run ID is 12 lowercase hex digits, e.g. 3f9c0a12b4de; list runs with `mcx ls`.")
    return run_id


def run_dir(project_root: Path, run_id: str) -> Path:
    return runs_dir(project_root) / check_run_id(run_id)


def pointer_dir(project_root: Path, run_id: str) -> Path:
    return state_dir(project_root) / POINTERS / check_run_id(run_id)


def pointer_file(project_root: Path, run_id: str, stage: str) -> Path:
    """The committed .dvc file of a run stage's final checkpoint."""
    return pointer_dir(project_root, run_id) / f"{stage}.dvc"


def git_ignores(project_root: Path, path: Path) -> bool:
    """Whether the project's git ignore rules match ``path`` (tracked or not, as DVC checks it);
    False outside git."""
    proc = subprocess.run(["git", "-C", str(project_root), "check-ignore", "-q", "--no-index", str(path)],
                          capture_output=True)
    return proc.returncode == 0


