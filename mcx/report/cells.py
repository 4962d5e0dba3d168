"""The cells of a comparison, which the renderers' formatting (mcx.report.fmt) reads: ``ABSENT``
(a key a run does not have) and ``MetricCell`` (one run's value of a metric, against the baseline)."""

from __future__ import annotations

from typing import Any

from attrs import frozen


class _Absent:
    """A key a run does not have (distinct from a value that is null)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@frozen
class MetricCell:
    value: float | None
    delta: float | None = None  # value - baseline
    delta_rel: float | None = None  # delta / |baseline|; None when the baseline is 0 or not finite
    regressed: bool = False
    improved: bool = False
    spread: float | None = None  # this run's step-to-step spread (relative), for steady metrics
    within_noise: bool = False  # the change is smaller than the larger step-to-step spread of the two runs
    noise: float | None = None  # that larger spread (relative), which the change was held to
