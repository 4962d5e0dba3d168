"""The names of a stage directory's files (STAGE_DIR = .mcx/runs/<id>/<stage>): the control plane writes
job.json, the worker everything else; both sides and the trackers read them by these names."""

from __future__ import annotations

import re

JOB_FILE = "job.json"  # the job (mcx.contract.job), written by the control plane before the launch
METRICS_FILE = "metrics.jsonl"  # one JSON record per step and evaluation (docs/metrics.md), rank 0
RESULT_FILE = "result.json"  # how the stage ended (mcx.contract.result), written by the worker last
LOG_FILE = "worker.log"  # every rank's log lines
SYSTEM_FILE = "system.jsonl"  # node 0's system metrics; node n writes system.<n>.jsonl
SYSTEM_FILES = re.compile(r"system(\.[0-9]+)?\.jsonl")  # every node's
CHECKPOINTS_DIR = "checkpoints"  # the checkpoints, unless checkpoint.dir puts them elsewhere (job.checkpoint_dir)
CACHE_DIR = "cache"  # Megatron-Core's dataset index cache


def system_file(node: int) -> str:
    """The system-metrics file of ``node``."""
    return SYSTEM_FILE if node == 0 else f"system.{node}.jsonl"
