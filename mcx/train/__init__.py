"""The training worker: the only package that imports torch and megatron.

``python -m mcx.train STAGE_DIR`` or, in process, :func:`train_stage`. The contract (job.json in;
metrics.jsonl, checkpoints/, result.json, worker.log out) is in docs/architecture.md. Importing this
package is cheap: torch and megatron load when a stage runs.
"""

from __future__ import annotations

from mcx.train.stage import train_stage

__all__ = ["train_stage"]
