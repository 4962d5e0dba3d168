"""What stops a sweep's trial early: the sweep interrupted (Ctrl-C, SIGTERM), or Optuna's median pruner.

Each is a run's watch (mcx.ops.stage.Watch): asked every few seconds while a stage trains, a Stop ends it
with the workers saving a checkpoint first.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcx.contract.status import Status
from mcx.errors import InputError
from mcx.metrics.curves import parse_records
from mcx.ops.stage import Stop
from mcx.plan.sweep_trials import INTERMEDIATE

if TYPE_CHECKING:
    import optuna

    from mcx.ops.stage import Stop
    from mcx.spec.schema import SweepSpec


class StopWatch:
    """Ends a trial's stage when the sweep is interrupted (Ctrl-C reaches the main thread only)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, stage: str, stage_path: Path) -> Stop | None:
        if self.stop.is_set():
            return Stop(Status.INTERRUPTED, "the sweep was interrupted; `mcx sweep` again trains this trial on")
        return None


class PrunerWatch(StopWatch):
    """Reports the full stage's validation objective at each evaluation to Optuna and stops the trial when
    the median pruner says so (Optuna's MedianPruner: worse than the median of the earlier trials at the
    same evaluation, after ``sweep.prune_warmup_evals`` evaluations and ``sweep.prune_startup_trials``
    trials)."""

    def __init__(self, trial: optuna.trial.Trial, sweep: SweepSpec, stop: threading.Event) -> None:
        super().__init__(stop)
        self.trial, self.kind, self.field = trial, *INTERMEDIATE[sweep.objective]
        self.offset, self.evals = 0, 0

    def __call__(self, stage: str, stage_path: Path) -> Stop | None:
        stopped = super().__call__(stage, stage_path)
        if stopped is not None or stage != "full":
            return stopped
        for record in self._new_records(stage_path / "metrics.jsonl"):
            if record.get("kind") != self.kind or not isinstance(record.get(self.field), (int, float)):
                continue
            self.evals += 1
            value = float(record[self.field])
            self.trial.report(value, self.evals)
            if self.trial.should_prune():
                return Stop(Status.PRUNED, f"pruned at step {record.get('step')} (evaluation {self.evals}): {self.field} "
                                      f"{value:.4f} trails the median of the earlier trials there")
        return None

    def _new_records(self, path: Path) -> list[dict[str, Any]]:
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next look
        self.offset += len(complete)
        try:
            return parse_records(complete, str(path))[0]
        except InputError:  # a damaged line: the run's own reading reports it; the pruner goes without
            return []
