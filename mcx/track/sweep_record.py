"""SweepRecorder: a sweep's MLflow record, a parent run whose children are its trials' own runs.

A trial is an ordinary run recorded by its own RunRecorder. The sweep's journal (``.mcx/sweeps/<name>/track/``)
holds the parent run (the sweep's definition as params), one ``adopt`` operation a trial (the trial's run
nested under the parent and tagged with the sweep, its trial number and state), the objective of each
trial as a metric over trial numbers, and the end. It is sent like a run's journal, and by ``mcx sync``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mcx.errors import InputError
from mcx.track import paths
from mcx.track.outage import Outages
from mcx.track.mlflow_records import TAG_VALUE_LIMIT, clip, scalar_text
from mcx.track.recorder import MLFLOW_STATUS, RUN, TARGET_FILE, RunRecorder, now_ms
from mcx.track.target import resolve_target, target_from_name

SWEEP_TAG = "mcx.sweep"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class SweepRecorder(RunRecorder):
    """The MLflow record of one sweep directory."""

    def __init__(self, project_root: Path, sweep_dir: Path, *, target, experiment: str, name: str,
                 definition: str | None = None, outages: Outages | None = None) -> None:
        # ``definition``: the sweep's identity (mcx.ops.sweep.definition_identity), so that a sweep started over
        # under its name with another definition gets a parent run of its own
        self.definition = definition
        super().__init__(project_root, sweep_dir, target=target, experiment=experiment, run_id=name, outages=outages)

    def _checked(self, run_id: str) -> str:
        if not _NAME.fullmatch(run_id):
            raise InputError(f"{run_id!r} is not a sweep name", "see sweep.name in docs/spec.md.")
        return run_id

    def _anchor_identity(self) -> dict[str, str]:
        return {SWEEP_TAG: self.run_id, "mcx.record": "sweep", "mcx.sweep.definition": str(self.definition)[:16]}

    @classmethod
    def for_sweep(cls, project_root: Path, sweep_dir: Path, name: str, experiment: str, tracking_uri: str | None,
                  definition: str) -> SweepRecorder:
        return cls(project_root, sweep_dir, target=resolve_target(project_root, tracking_uri),
                   experiment=experiment, name=name, definition=definition)

    @classmethod
    def load(cls, project_root: Path, run_dir: Path, tracking_uri: str | None = None,
             outages: Outages | None = None) -> SweepRecorder:
        """The recorder a previous `mcx sweep` set up in ``run_dir`` (for ``mcx sync``: its journal names the
        parent run's identity, so the definition is not needed again)."""
        state = paths.read_json(Path(run_dir) / paths.TRACK_DIR / TARGET_FILE)
        if not isinstance(state, dict) or "target" not in state:
            raise InputError(f"{run_dir} has no tracking state", "it was never recorded; nothing to sync.")
        target = (resolve_target(project_root, tracking_uri) if tracking_uri is not None
                  else target_from_name(project_root, state["target"]))
        return cls(project_root, run_dir, target=target, experiment=state["experiment"], name=state["run_id"],
                   outages=outages)

    def stages(self) -> list[str]:
        return []  # a sweep has no metrics files of its own: its trials' runs do

    def start(self, *, definition: dict[str, Any], tags: dict[str, str] | None = None) -> None:  # type: ignore[override]
        """The parent run: the sweep's definition as params (each parameter's values as JSON)."""
        anchor = {SWEEP_TAG: self.run_id, "mcx.status": "running", **(tags or {})}
        self._op("experiment", name=self.experiment)
        self._op("open", record=RUN, identity=self._anchor_identity(), parent=None, parent_identity=None,
                 tags={k: clip(v, TAG_VALUE_LIMIT) for k, v in anchor.items()}, name=f"sweep {self.run_id}",
                 start_ms=now_ms())
        params = {f"sweep.{k}": clip(v if isinstance(v, str) else json.dumps(v, sort_keys=True), TAG_VALUE_LIMIT)
                  for k, v in definition.items()}
        self._op("params", record=RUN, params=params)

    def trial(self, number: int, run_id: str, state: str, value: float | None) -> None:
        """Trial ``number``'s run nested under the sweep and tagged; its objective as a metric at step ``number``."""
        tags = {SWEEP_TAG: self.run_id, "mcx.sweep.trial": str(number), "mcx.sweep.state": state}
        self._op("adopt", record=RUN, child_identity={"mcx.run_id": run_id, "mcx.record": "run"}, tags=tags)
        if value is not None:
            self._op("metrics", record=RUN, metrics={"objective": value}, step=number)

    def finish(self, status: str, *, tags: dict[str, str] | None = None) -> None:
        self._op("tags", record=RUN, tags={"mcx.status": status, **{k: scalar_text(v) for k, v in (tags or {}).items()}})
        self._op("status", record=RUN, status=MLFLOW_STATUS.get(status, "KILLED"), end_ms=now_ms())
