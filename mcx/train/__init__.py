"""The training worker: the only package that imports torch and megatron.

``python -m mcx.train STAGE_DIR`` or, in process, :func:`run_stage`. The contract (job.json in;
metrics.jsonl, checkpoints/, result.json, worker.log out) is in docs/architecture.md. Importing this
package is cheap: torch and megatron load when a stage runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_stage(stage_dir: Path | str) -> dict[str, Any]:
    """Run one stage in this process; returns the result dict that is also written to result.json."""
    from mcx.train.stage import run_stage as _run_stage

    return _run_stage(stage_dir)


__all__ = ["run_stage"]
