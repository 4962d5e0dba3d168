"""The evaluation worker: ``python -m mcx.eval EVAL_DIR`` runs lm-evaluation-harness's Hugging Face model
(``lm_eval.models.huggingface.HFLM``) on the job's exported weights and writes ``scores.json`` beside the job;
``python -m mcx.train.eval_model EVAL_DIR`` runs the harness's model interface over the run's own Megatron-Core
model (mcx.eval.megatron_lm, D72) through :func:`evaluate` with its model given.

Offline by design: the hub is never asked (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE); registry tasks read a datasets
cache the user filled (HF_DATASETS_CACHE / HF_HOME), local task directories read their own files.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from mcx.eval.job import SCORES_FILE, read_job
from mcx.eval.scores import from_harness
from mcx.jsonfile import write_json_atomic

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def evaluate(directory: Path, lm: Any = None, *, dtype: str = "float32", started: float | None = None) -> Path:
    """Run the job in ``directory``; returns the scores file. ``lm``: the harness model to score with (a
    MegatronLM over the run's weights, in ``dtype``, loaded since ``started``), else HFLM on the job's directory."""
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
    job = read_job(directory)
    started = time.monotonic() if started is None else started
    import lm_eval  # type: ignore[import-untyped]
    from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]

    registry = any(t.directory is None for t in job.tasks)  # the built-in index is read only when a task needs it
    manager = TaskManager(include_path=job.include_paths() or None, include_defaults=registry)
    if lm is None:
        # float32 on the CPU (exact sums, and what the run's CPU backend computes in); the export's dtype on a GPU
        dtype = "float32" if job.device == "cpu" else "auto"
    results = lm_eval.simple_evaluate(
        model="hf" if lm is None else lm, model_args={"pretrained": job.model_dir, "dtype": dtype} if lm is None
        else None, tasks=job.names(),
        num_fewshot=job.settings.num_fewshot, limit=job.settings.limit, batch_size=job.settings.batch_size,
        device=job.device, task_manager=manager, log_samples=False)
    if results is None:  # only a non-zero rank returns None; this is one process
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    evaluation = from_harness(results, key=job.key(), model=job.model, harness=job.harness, device=job.device,
                              settings={"num_fewshot": job.settings.num_fewshot, "limit": job.settings.limit,
                                        "batch_size": job.settings.batch_size, "dtype": dtype,
                                        "interface": job.interface},
                              wall_s=time.monotonic() - started)
    write_json_atomic(directory / SCORES_FILE, evaluation.to_dict())
    return directory / SCORES_FILE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mcx.eval EVAL_DIR", file=sys.stderr)
        return 2
    evaluate(Path(args[0]))
    return 0
