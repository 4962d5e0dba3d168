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
# Each rank's own files: rank<R>.jsonl (step times), rank<R>.json (pid, host), stacks.rank<R>.txt; and
# batches.dp<D>.jsonl (batch hashes, one writer a data-parallel rank).
RANKS_DIR = "ranks"
HANGS_DIR = "hangs"  # what a node's watchdog found on a hang: one directory an attempt (mcx.launch.watchdog)


def system_file(node: int) -> str:
    """The system-metrics file of ``node``."""
    return SYSTEM_FILE if node == 0 else f"system.{node}.jsonl"


def rank_steps_file(rank: int) -> str:
    """A rank's step times under RANKS_DIR: one ``{"kind": "train", "step", "step_time_s", "time"}`` a step."""
    return f"rank{rank}.jsonl"


def rank_info_file(rank: int) -> str:
    """A rank's ``{"rank", "local_rank", "pid", "host"}`` under RANKS_DIR, written as it starts."""
    return f"rank{rank}.json"


def rank_stacks_file(rank: int) -> str:
    """Where a rank's faulthandler writes every thread's stack on SIGUSR2, under RANKS_DIR."""
    return f"stacks.rank{rank}.txt"


PROFILE_DIR = "profile"  # `mcx run --profile`: each rank's trace and op table (mcx.contract.profile, D73)


def profile_trace_file(rank: int) -> str:
    """A rank's Chrome/Perfetto trace of the profiled steps under PROFILE_DIR (open it in ui.perfetto.dev)."""
    return f"trace-rank{rank}.json.gz"


def profile_ops_file(rank: int) -> str:
    """A rank's table of the profiled steps' ops by self CPU time under PROFILE_DIR."""
    return f"ops-rank{rank}.txt"
def batch_hashes_file(dp_rank: int) -> str:
    """A data-parallel rank's batch hashes under RANKS_DIR: one ``{"kind": "train", "step", "batches"}`` a step,
    a 16-hex-digit digest per micro-batch (mcx.train.batch_hash)."""
    return f"batches.dp{dp_rank}.jsonl"
