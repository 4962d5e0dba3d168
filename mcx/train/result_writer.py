"""result.json: how the stage ended, its checks, final metrics, and what ran.

``final`` holds the stage's summary metrics, computed from its metrics.jsonl by
``mcx.metrics.summary`` (the one definition every report reads).

Status -> exit code of ``python -m mcx.train`` (also recorded as ``exit_code``):

* ``finished`` -> 0; ``preempted`` -> 0: the worker handled the signal as asked (a resumable
  checkpoint is saved, ``latest`` names it); a zero exit keeps torchrun from restarting the group and
  Slurm from marking the step failed, and the control plane reads the status from this file;
* ``failed`` (a smoke check, a crash) -> 1; ``diverged`` -> 1;
* bad input (job file, spec, data, environment) -> 2, status ``failed``.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import sys
from pathlib import Path
from typing import Any

from mcx.contract.files import RESULT_FILE
from mcx.contract.result import EXIT_CODES
from mcx.contract.status import Status
from mcx.jsonfile import write_json_atomic



def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "megatron-core", "transformer-engine", "numpy", "mcx"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    torch = sys.modules.get("torch")  # a stage refused before torch was loaded does not load it to say so
    if torch is None:
        return out
    out["cuda"] = torch.version.cuda
    try:
        out["cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None
    except RuntimeError as exc:  # e.g. another cuDNN already loaded (Transformer Engine's): recorded, not fatal
        out["cudnn"] = f"unknown ({str(exc).split('.')[0]})"
    return out


def make_result(*, status: Status, passed: bool, checks: dict[str, Any] | None = None, final: dict[str, Any] | None = None,
                error: str | None = None, steps: int = 0, layer_spec: str | None = None, exit_code: int | None = None,
                details: dict[str, Any] | None = None, out_of_memory: dict[str, Any] | None = None,
                warnings: list[str] | None = None) -> dict[str, Any]:
    return {
        "status": status,
        "passed": passed,
        "checks": checks or {},
        "final": final or {},
        "error": error,
        "steps": steps,
        "layer_spec": layer_spec,
        "exit_code": EXIT_CODES[status] if exit_code is None else exit_code,
        "details": details or {},
        "out_of_memory": out_of_memory,  # what the allocator held when the worker ran out (stage.out_of_memory)
        "warnings": warnings or [],  # what the stage went on despite (a damaged checkpoint set aside, ...)
        "versions": versions(),
    }


def write_result(stage_dir: Path, result: dict[str, Any]) -> None:
    write_json_atomic(stage_dir / RESULT_FILE, _json_safe(result))


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
