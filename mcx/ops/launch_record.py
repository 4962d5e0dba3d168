"""``launch.json`` in a stage directory: which job (Slurm job ID, or the launcher's process ID) runs the stage.

Written by `mcx run` as soon as the stage's workers are started, read by `mcx status`, `logs` and `cancel`, and
by the next `mcx run` of the same spec, which follows a Slurm job that is still queued or running instead of
submitting the stage a second time (a supervisor that died while its job ran: D64).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.jsonfile import read_json, write_json_atomic

LAUNCH_FILE = "launch.json"


@frozen(kw_only=True)
class LaunchRecord:
    stage: str
    kind: str  # launch.kind
    job_id: str | None
    submitted: float  # time.time()
    log: str | None = None  # the launch's own output (Slurm's slurm-<job>.out); the worker's is worker.log

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "kind": self.kind, "job_id": self.job_id, "submitted": self.submitted,
                "log": self.log}


def record_launch(stage_path: Path, kind: str, job_id: str | None, log: Path | None) -> LaunchRecord:
    record = LaunchRecord(stage=stage_path.name, kind=kind, job_id=job_id, submitted=time.time(),
                          log=None if log is None else str(log))
    write_json_atomic(stage_path / LAUNCH_FILE, record.to_dict())
    return record


def read_launch(stage_path: Path) -> LaunchRecord | None:
    """The stage's last launch; None when it was never launched (or the file is not one mcx wrote)."""
    try:
        data = read_json(stage_path / LAUNCH_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    job_id = data.get("job_id")
    log = data.get("log")
    submitted = data.get("submitted")
    return LaunchRecord(stage=stage_path.name, kind=data["kind"], job_id=str(job_id) if job_id is not None else None,
                        submitted=float(submitted) if isinstance(submitted, (int, float)) else 0.0,
                        log=log if isinstance(log, str) else None)
