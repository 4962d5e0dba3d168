"""A stage's checkpoint directory as both sides see it: where it is, the ``latest`` pointer, the iteration
directories, and the names of what a save or a prune leaves beside them. The worker writes it
(mcx.train.checkpoint.CheckpointStore); the control plane reads it to resume, track and collect garbage."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mcx.contract.files import CHECKPOINTS_DIR, JOB_FILE
from mcx.weights.checkpoint_files import LATEST, iter_name

META = "meta.json"  # what makes an iteration directory a complete checkpoint (written last)
RETIRED = ".retired"  # a pruned checkpoint, renamed out of the store while a thread deletes it
DAMAGED = ".damaged"  # a checkpoint whose files do not match its checksums, set aside for the user
PARTIAL = ".tmp"  # a save in progress (renamed to its iteration when complete)
ITER = re.compile(r"^iter_(\d{7,})$")


def checkpoint_root(stage_dir: Path) -> Path:
    """Where the stage's worker keeps its checkpoints: job.json's ``checkpoint_dir`` (``checkpoint.dir`` puts
    them outside the run directory), else ``checkpoints/`` in the stage directory."""
    try:
        job = json.loads((stage_dir / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        job = None
    where = job.get("checkpoint_dir") if isinstance(job, dict) else None
    return Path(where) if isinstance(where, str) and where else stage_dir / CHECKPOINTS_DIR


def read_latest(root: Path) -> str | None:
    """The name ``root``'s ``latest`` points at, as written; None when there is none (or it cannot be read)."""
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):  # none yet, or no directory there (the worker names what is wrong)
        return None
    return name or None


def latest_checkpoint(stage_dir: Path) -> str | None:
    """The name the stage's ``latest`` points at, or None before the first checkpoint."""
    return read_latest(checkpoint_root(stage_dir))


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints in ``root``, ascending."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir()
                  if (m := ITER.match(p.name)) and p.is_dir() and (p / META).is_file())


def checkpoint_path(root: Path, step: int) -> Path:
    return root / iter_name(step)
