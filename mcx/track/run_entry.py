"""A recorded run as `mcx ls` and `mcx show` read it back (mcx.track.query), typed.

Each record file is read once, at the edge, into these classes; the views (mcx.report.records_view) read
their fields. ``to_dict`` writes the JSON `--json` has always printed: the same keys for the same origin (a
stage with no result.json yet has only its status; a run only the tracking store knows has no local
tracking state), so a script reading it sees no change.
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import evolve, field, frozen

from mcx.eval.scores import Evaluation, steps_to_dict
from mcx.metrics.ranks import SlowestRank


Json = dict[str, Any]
Metrics = dict[str, Any]  # a metric's key -> its value as result.json or MLflow holds it (a number, or null)
StageOrigin = Literal["result", "no-result", "tracking"]


def _number(value: object) -> float | None:
    """A JSON number as written (an int stays an int: the JSON printed back is the same), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@frozen(kw_only=True)
class StageEntry:
    """One stage: from its result.json, from its directory alone (no result yet), or from MLflow's child run
    (``passed`` and ``steps`` then the tags' text)."""

    origin: StageOrigin
    status: str | None
    passed: bool | str | None = None
    steps: int | str | None = None
    final: Metrics | None = None
    checks: Json | None = None
    error: str | None = None
    layer_spec: str | None = None
    mlflow_run: str | None = None
    mixture: Json | None = None  # a mixture's realised shares, result.json's details.mixture (D60)

    @classmethod
    def from_result(cls, result: Json) -> StageEntry:
        """A stage's result.json, its values as written."""
        details = result.get("details")
        mixture = details.get("mixture") if isinstance(details, dict) else None
        return cls(origin="result", status=result.get("status"), passed=result.get("passed"),
                   steps=result.get("steps"), final=result.get("final"), checks=result.get("checks"),
                   error=result.get("error"), layer_spec=result.get("layer_spec"),
                   mixture=mixture if isinstance(mixture, dict) else None)

    def to_dict(self) -> Json:
        if self.origin == "no-result":
            return {"status": self.status}
        if self.origin == "tracking":
            return {"status": self.status, "passed": self.passed, "steps": self.steps, "mlflow_run": self.mlflow_run}
        out = {"status": self.status, "passed": self.passed, "steps": self.steps, "final": self.final,
               "checks": self.checks, "error": self.error, "layer_spec": self.layer_spec}
        if self.mixture is not None:
            out["mixture"] = self.mixture
        return out


@frozen(kw_only=True)
class TrackingState:
    """Where a run is recorded: the local journal's target and what is unsent (``pending_ops`` None for a run
    only the store knows), and the MLflow run's IDs and status once the store was asked (``mlflow_status``)."""

    target: str | None = None
    experiment: str | None = None
    experiment_id: str | None = None
    mlflow_run: str | None = None
    mlflow_url: str | None = None
    pending_ops: int | None = None
    mlflow_status: str | None = None

    def merged(self, store: TrackingState) -> TrackingState:
        """This local state with the store's IDs and status for the same run."""
        return evolve(self, experiment_id=store.experiment_id, mlflow_run=store.mlflow_run,
                      mlflow_status=store.mlflow_status)

    def to_dict(self) -> Json:
        out: Json = {}
        if self.pending_ops is not None:
            out.update(target=self.target, experiment=self.experiment, mlflow_url=self.mlflow_url,
                       pending_ops=self.pending_ops)
        out.update(experiment_id=self.experiment_id, mlflow_run=self.mlflow_run)
        if self.mlflow_status is not None:
            out["mlflow_status"] = self.mlflow_status
        return out


@frozen(kw_only=True)
class StepTimeCheck:
    """The step-time model beside the measured median step (mcx.plan.steptime.PredictionCheck, as recorded)."""

    gpu: str | None
    predicted_s: float
    measured_s: float
    error: float
    host_layer_s: float | None = None  # where the host set the step: its time a layer and micro-batch (D78)

    @classmethod
    def from_dict(cls, data: object) -> StepTimeCheck | None:
        """run.json's ``summary.step_time``; None where it is absent or not one."""
        if not isinstance(data, dict):
            return None
        predicted, measured, error = (_number(data.get(k)) for k in ("predicted_s", "measured_s", "error"))
        if predicted is None or measured is None or error is None:
            return None
        gpu, host = data.get("gpu"), _number(data.get("host_layer_s"))
        return cls(gpu=gpu if isinstance(gpu, str) else None, predicted_s=predicted, measured_s=measured, error=error,
                   host_layer_s=host if host is not None and host > 0 else None)

    def to_dict(self) -> Json:
        out: Json = {"gpu": self.gpu, "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                     "error": self.error}
        if self.host_layer_s is not None:
            out["host_layer_s"] = self.host_layer_s
        return out


@frozen(kw_only=True)
class CheckpointEntry:
    """A stage's final checkpoint: where, whether it is here, and its DVC pointer when one was recorded."""

    path: str
    present: bool
    md5: str | None = None
    pointer: str | None = None
    remote: str | None = None
    remote_url: str | None = None

    def to_dict(self) -> Json:
        return {"path": self.path, "present": self.present, "md5": self.md5, "pointer": self.pointer,
                "remote": self.remote, "remote_url": self.remote_url}


@frozen(kw_only=True)
class CodeProvenance:
    """Where a run's code came from (not part of its ID, D52): commit, branch, the paths that differed from the
    commit, mcx's version, and how many modules the ID hashed (None: a record from before D52)."""

    commit: str | None
    branch: str | None
    dirty: bool | None
    changes: tuple[str, ...]
    mcx_version: str | None
    modules: int | None

    @classmethod
    def of(cls, code: object) -> CodeProvenance | None:
        """From fingerprint.json's code component (the rules of mcx.fingerprint.components.CodeComponent, which
        this layer cannot import: the fingerprint package imports track's paths); None for a record without one."""
        if not isinstance(code, dict) or not isinstance(code.get("info"), dict) or not isinstance(code.get("id"), dict):
            return None
        info, ident = code["info"], code["id"]
        changes = info.get("changes")
        return cls(commit=info.get("commit") or ident.get("commit"), branch=info.get("branch"),
                   dirty=info.get("dirty", ident.get("dirty")),
                   changes=tuple(sorted(changes)) if isinstance(changes, dict) else (),
                   mcx_version=info.get("mcx_version", ident.get("mcx_version")),
                   modules=len(ident["modules"]) if isinstance(ident.get("modules"), dict) else None)

    def to_dict(self) -> Json:
        return {"commit": self.commit, "branch": self.branch, "dirty": self.dirty, "changes": list(self.changes),
                "mcx_version": self.mcx_version, "modules": self.modules}


@frozen(kw_only=True)
class RunEntry:
    """A run as `mcx ls` lists it: from its run directory (``source`` "local") or from the tracking store
    alone ("tracking"). ``state``: "finished", "running", "interrupted", "damaged" (each damaged record
    named in ``damaged``), or "recorded" for a store-only run; ``final``: the main stage's final metrics."""

    run_id: str | None
    name: str | None
    status: str | None
    state: str
    source: Literal["local", "tracking"]
    created: float
    stages: dict[str, StageEntry] = field(factory=dict)
    final: Metrics = field(factory=dict)
    step_time: StepTimeCheck | None = None
    tracking: TrackingState = field(factory=TrackingState)
    holder: str | None = None
    damaged: tuple[str, ...] | None = None  # None for a store-only run (no directory to be damaged)

    def to_dict(self) -> Json:
        out: Json = {"run_id": self.run_id, "name": self.name, "status": self.status, "state": self.state,
                     "holder": self.holder, "created": self.created,
                     "stages": {k: v.to_dict() for k, v in self.stages.items()}, "final": self.final,
                     "step_time": None if self.step_time is None else self.step_time.to_dict(),
                     "source": self.source, "tracking": self.tracking.to_dict()}
        if self.damaged is not None:
            out["damaged"] = list(self.damaged)
        return out


@frozen(kw_only=True)
class ShownRun:
    """A run as `mcx show` prints it: its ``entry`` (what `mcx ls` lists), the spec as MLflow params, the
    fingerprint as tags, and, from a run directory, the code's provenance, run.json as written, the spec
    file and each stage's final checkpoint (``checkpoints_error``: why the DVC pointers could not be read)."""

    entry: RunEntry
    params: dict[str, str] = field(factory=dict)
    tags: dict[str, str] = field(factory=dict)
    code: CodeProvenance | None = None
    run: Json | None = None  # run.json, whole, for --json; None for a run only the store knows
    spec_path: str | None = None
    checkpoints: dict[str, CheckpointEntry] = field(factory=dict)
    checkpoints_error: str | None = None
    slowest_ranks: dict[str, SlowestRank] = field(factory=dict)  # stage -> its slowest rank, where an outlier
    evaluation: Evaluation | None = None  # the run's downstream evaluation (eval.json, D68); None: not evaluated
    profiles: dict[str, str] = field(factory=dict)  # stage -> its profile directory (`mcx run --profile`, D73)
    eval_steps: dict[int, Evaluation] = field(factory=dict)  # [eval] every: each checkpoint's, by step (D71)

    def to_dict(self) -> Json:
        out = {**self.entry.to_dict(), "params": self.params, "tags": self.tags}
        if self.evaluation is not None:
            out["eval"] = self.evaluation.to_dict()
        if self.eval_steps:
            out["eval_steps"] = steps_to_dict(self.eval_steps)["steps"]
        if self.run is None:
            return out
        checkpoints: Json = {} if self.checkpoints_error is None else {"error": {"detail": self.checkpoints_error}}
        checkpoints.update((stage, c.to_dict()) for stage, c in self.checkpoints.items())
        slowest = {"slowest_ranks": {stage: r.to_dict() for stage, r in self.slowest_ranks.items()}} \
            if self.slowest_ranks else {}
        profiles = {"profiles": self.profiles} if self.profiles else {}
        return {**out, "code": None if self.code is None else self.code.to_dict(), "run": self.run,
                "spec_path": self.spec_path, "checkpoints": checkpoints, **slowest, **profiles}
