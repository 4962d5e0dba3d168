"""What `mcx tune` and `mcx tune --layouts` return: each trial, the model's ranking and the best setting, typed.

``mcx.ops.tune`` and ``mcx.ops.tune_layouts`` build them; the CLI renders them (``tune_view``) or prints
their ``to_dict()``, the commands' ``--json``.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from mcx.plan.tuning import Candidate

MEASURED_KEYS = ("tokens_per_s_per_gpu", "mfu", "mem_peak_bytes", "step_time_s")


@frozen(kw_only=True)
class Measured:
    """A trial's figures as docs/metrics.md defines them, over its steps after the first (the warm-up)."""

    tokens_per_s_per_gpu: float | None
    mfu: float | None
    mem_peak_bytes: float | None
    step_time_s: float | None

    def to_dict(self) -> dict[str, float | None]:
        return {"tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "mem_peak_bytes": self.mem_peak_bytes, "step_time_s": self.step_time_s}


@frozen(kw_only=True)
class Trial:
    """A few real optimizer steps of one setting: its figures, or that it ran out of memory (``measured`` None)
    with what the worker recorded of its allocator then (None where only its log said so)."""

    expandable_segments: bool  # train.expandable_segments as the trial ran
    measured: Measured | None
    out_of_memory: dict[str, Any] | None = None

    @property
    def fits(self) -> bool:
        return self.measured is not None

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """The throughput the trials are ranked by (0 where none was measured)."""
        return (self.measured.tokens_per_s_per_gpu or 0.0) if self.measured is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        if self.measured is None:
            return {"fits": False, "reason": "out of memory", "expandable_segments": self.expandable_segments,
                    "out_of_memory": self.out_of_memory}
        return {"fits": True, "expandable_segments": self.expandable_segments, **self.measured.to_dict()}


@frozen(kw_only=True)
class MicroBatchTrial:
    """One trial of `mcx tune`'s sweep."""

    micro_batch_size: int
    trial: Trial

    def to_dict(self) -> dict[str, Any]:
        return {"micro_batch_size": self.micro_batch_size, **self.trial.to_dict()}


@frozen(kw_only=True)
class TuneResult:
    """`mcx tune`: every trial in the order run (an out-of-memory trial retried with expandable segments appears
    twice), the fastest that fitted, the tuned spec written, and the GPU-hours the trials were priced at."""

    trials: tuple[MicroBatchTrial, ...]
    best: MicroBatchTrial
    spec: str
    trials_gpu_hours: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"trials": [t.to_dict() for t in self.trials], "best": self.best.to_dict(), "spec": self.spec,
                "trials_gpu_hours": self.trials_gpu_hours}


def predicted_dict(c: Candidate) -> dict[str, Any]:
    """The step-time model's step for a candidate layout."""
    st = c.step
    return {"step_time_s": st.step_s, "mfu": st.mfu, "tokens_per_s_per_gpu": st.tokens_per_s_per_gpu,
            "breakdown_s": st.breakdown()}


def candidate_dict(c: Candidate) -> dict[str, Any]:
    return {"settings": dict(c.settings), "layout": c.layout.to_dict(), "memory_bytes": c.memory_bytes,
            "memory_verdict": c.verdict, "predicted": predicted_dict(c)}


@frozen(kw_only=True)
class RankedLayout:
    """A layout of the model's ranking; ``rank`` None for the spec's own layout where it is not in the ranking."""

    rank: int | None
    candidate: Candidate

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, **candidate_dict(self.candidate)}


@frozen(kw_only=True)
class LayoutTrial:
    """One measured layout of `mcx tune --layouts`, beside its prediction."""

    rank: int
    candidate: Candidate
    trial: Trial

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, **self.trial.to_dict(), "predicted": predicted_dict(self.candidate)}

    def best_dict(self) -> dict[str, Any]:
        """As the result's ``best``: the layout's settings, its prediction and what it measured."""
        assert self.trial.measured is not None  # the best is a trial that fitted
        return {"rank": self.rank, "settings": dict(self.candidate.settings), "predicted": predicted_dict(self.candidate),
                "measured": self.trial.measured.to_dict(), "expandable_segments": self.trial.expandable_segments}


@frozen(kw_only=True)
class TuneLayoutsResult:
    """`mcx tune --layouts`: the layouts that fit ranked by the step-time model (the first ``max(--show, --top)``),
    the spec's own; where the spec's GPUs are here, the top ones measured, the fastest and the tuned spec written,
    else why none was measured."""

    considered: int  # layouts the rules allowed
    too_big: int  # of those, the ones that did not fit even with full recomputation
    fitting: int
    capacity_bytes: int
    ranking: tuple[RankedLayout, ...]
    current: RankedLayout | None  # the spec's own layout, where it fits
    not_measured: str | None = None  # why no trial ran; None where they did
    trials: tuple[LayoutTrial, ...] = ()
    best: LayoutTrial | None = None
    spec: str | None = None  # the tuned spec written
    trials_gpu_hours: float | None = None

    @property
    def measured_here(self) -> bool:
        return self.not_measured is None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spec": self.spec, "considered": self.considered, "too_big": self.too_big, "fitting": self.fitting,
            "capacity_bytes": self.capacity_bytes, "ranking": [r.to_dict() for r in self.ranking],
            "current": None if self.current is None else self.current.to_dict(),
            "trials": [t.to_dict() for t in self.trials], "best": None if self.best is None else self.best.best_dict(),
            "measured_here": self.measured_here}
        if self.not_measured is not None:
            out["not_measured"] = self.not_measured
        else:
            out["trials_gpu_hours"] = self.trials_gpu_hours
        return out
