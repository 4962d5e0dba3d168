"""How a stage, a run or a sweep ended (or stands), as result.json, run.json and the ``mcx.status`` tag spell it.

A ``StrEnum``: each member is its string, so the files keep their bytes and a status read from a file
compares equal to its member. Parse one with :func:`parse_status` (None for a word mcx never wrote).
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    FINISHED = "finished"  # the stage trained to its last step (and a smoke stage passed its checks)
    FAILED = "failed"  # a check failed, the worker crashed, or the input was bad (exit code 2)
    DIVERGED = "diverged"  # the divergence guard stopped it (loss spike, NaN/Inf)
    PREEMPTED = "preempted"  # the scheduler's signal: checkpointed, resumable
    INTERRUPTED = "interrupted"  # the user's signal (Ctrl-C, SIGTERM to `mcx run`): exit 130 (D47)
    PRUNED = "pruned"  # a sweep's pruner stopped the trial
    RUNNING = "running"  # run.json while `mcx run` works on it
    SMOKE_PASSED = "smoke-passed"  # run.json of a run that ran its smoke stage only, and passed
    DRY_RUN = "dry-run"  # `mcx run --dry-run`'s summary: nothing ran
    PLANNED = "planned"  # `mcx sweep --dry-run`'s: its trials planned, none run
    INCOMPLETE = "incomplete"  # a stage directory with metrics but no result.json (read, never written)
    PENDING = "pending"  # a stage not started yet (read, never written)
    DAMAGED = "damaged"  # `mcx ls` of a run whose record files do not parse (read, never written)
    QUEUED = "queued"  # `mcx ls` of a running run whose stage's job waits in the cluster's queue (read, never written)


# What a worker's result.json can say; the control plane adds INTERRUPTED and PRUNED to a stage's result.
WORKER_STATUSES = frozenset({Status.FINISHED, Status.FAILED, Status.DIVERGED, Status.PREEMPTED})
# How a run ends (run.json, the tracking record), as opposed to RUNNING and the readers' INCOMPLETE and PENDING.
RUN_ENDINGS = frozenset({Status.FINISHED, Status.FAILED, Status.DIVERGED, Status.PREEMPTED, Status.INTERRUPTED,
                         Status.PRUNED})


def parse_status(value: object) -> Status | None:
    """``value`` as a Status; None where it is none (absent, or a word mcx does not write)."""
    if not isinstance(value, str):
        return None
    try:
        return Status(value)
    except ValueError:
        return None
