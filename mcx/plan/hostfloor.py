"""The host floor as this project's own runs measured it (issue 41, D78).

A small model's eager step is the host's (mcx.plan.steptime, "the host floor"), and hosts differ: two H100
machines ran the same loops 1.5-1.7x apart (docs/benchmarks.md, "Small shapes"), where one calibrated
constant cannot hold 15% on both. So each finished eager GPU run whose step the host set records what its
host took a layer and micro-batch (``PredictionCheck.host_layer_s``, mcx.plan.steptime.host_layer_seconds),
and the plan of a later run on the same GPU model prices its floor with the median of the newest of them
instead of the calibration's.

Only dense models teach it; a mixture of experts' layers are priced from it, each as several dense layers (D81).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from attrs import frozen

LEARN_FROM = 5  # the newest runs whose median is the floor: recent enough to be these hosts, several for noise


@frozen(kw_only=True)
class HostMeasure:
    """One recorded run's host time a layer and micro-batch (its run.json's ``summary.step_time``)."""

    run_id: str
    gpu: str  # the hardware table's key of the GPU it ran on
    host_layer_s: float
    created: float  # when the run was made (seconds since the epoch): the newest count


@frozen(kw_only=True)
class HostFloor:
    """The host's time a layer and micro-batch the plan uses, learned from ``runs`` (newest first)."""

    host_layer_s: float
    gpu: str
    runs: tuple[str, ...]
    calibrated_s: float  # the calibration's constant it replaces, for the plan's line

    def to_dict(self) -> dict[str, object]:
        return {"host_layer_s": self.host_layer_s, "gpu": self.gpu, "runs": list(self.runs),
                "calibrated_host_layer_s": self.calibrated_s}


def learned_floor(measures: Sequence[HostMeasure], gpu: str, calibrated_s: float) -> HostFloor | None:
    """The median of the newest LEARN_FROM measures on ``gpu``; None where there is none."""
    mine = sorted((m for m in measures if m.gpu == gpu), key=lambda m: m.created, reverse=True)[:LEARN_FROM]
    if not mine:
        return None
    return HostFloor(host_layer_s=statistics.median(m.host_layer_s for m in mine), gpu=gpu,
                     runs=tuple(m.run_id for m in mine), calibrated_s=calibrated_s)
