"""What `mcx run` returns: the run's summary (run.json's ``summary``, the object ``--json`` prints), typed.

Built once when the run ends (``RunSummary``), or read back from run.json for a run already trained (a dry run
returns mcx.plan.shown's ``DryRun``). ``to_dict`` writes the JSON every reader has always seen: the same keys, a key left out
where the run never had it (no ``baseline`` unless a baseline was judged, no ``step_time`` off the GPU).
"""

from __future__ import annotations

from typing import Any

from attrs import evolve, field, frozen

Json = dict[str, Any]


@frozen(kw_only=True)
class StageSummary:
    """One stage's outcome: status, the smoke checks, its final metrics."""

    status: str | None = None
    passed: bool = False
    checks: Json = field(factory=dict)
    control_checks: Json = field(factory=dict)
    metrics: Json = field(factory=dict)
    steps: int | None = None
    layer_spec: str | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Json) -> StageSummary:
        """A stage as run.json holds it; what is missing or of another type takes its default."""
        def obj(key: str) -> Json:
            value = data.get(key)
            return dict(value) if isinstance(value, dict) else {}

        steps, warnings = data.get("steps"), data.get("warnings")
        return cls(status=_text(data.get("status")), passed=bool(data.get("passed")), checks=obj("checks"),
                   control_checks=obj("control_checks"), metrics=obj("metrics"),
                   steps=steps if isinstance(steps, int) else None, layer_spec=_text(data.get("layer_spec")),
                   error=_text(data.get("error")),
                   warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else ())

    def to_dict(self) -> Json:
        return {"status": self.status, "passed": self.passed, "checks": self.checks,
                "control_checks": self.control_checks, "metrics": self.metrics, "steps": self.steps,
                "layer_spec": self.layer_spec, "error": self.error, "warnings": list(self.warnings)}


@frozen(kw_only=True)
class Tracking:
    """Where the run's records went: the MLflow target, "synced" or "pending" (spooled), the MLflow run."""

    target: str | None
    state: str | None
    error: str | None
    mlflow_run: str | None

    def to_dict(self) -> Json:
        return {"target": self.target, "state": self.state, "error": self.error, "mlflow_run": self.mlflow_run}


@frozen(kw_only=True)
class RunSummary:
    """A trained (or already trained) run: its ID, status, each stage, the final metrics, what went wrong."""

    run_id: str | None
    name: str | None
    status: str
    cached: bool = False
    stages: dict[str, StageSummary] = field(factory=dict)
    final: Json = field(factory=dict)
    error: str | None = None
    exit_code: int = 0
    wall_time_s: float | None = None
    run_dir: str | None = None
    judged: bool = False  # a baseline was looked for: ``baseline`` is written (None where the spec names none)
    baseline: Json | None = None
    step_time: Json | None = None  # the step-time model beside the measured step (a GPU run)
    tracking: Tracking | None = None  # set after run.json is written: its upload is part of the record
    extra: Json = field(factory=dict)  # keys of a stored summary this mcx does not write, kept as they were

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def judge(self, baseline: Json | None) -> RunSummary:
        """This summary with the baseline verdict: a regression makes the exit code 1."""
        if baseline is not None and baseline.get("verdict") == "regress":
            return evolve(self, judged=True, baseline=baseline, exit_code=1,
                          error="held-out metrics regressed against the baseline: " + str(baseline.get("detail")))
        return evolve(self, judged=True, baseline=baseline)

    @classmethod
    def from_dict(cls, data: Json) -> RunSummary:
        """run.json's summary as an earlier run wrote it."""
        known = {"run_id", "name", "status", "cached", "stages", "final", "error", "exit_code", "wall_time_s",
                 "run_dir", "baseline", "step_time", "tracking"}
        stages, final, wall, code = data.get("stages"), data.get("final"), data.get("wall_time_s"), data.get("exit_code")
        baseline, step_time, tracking = data.get("baseline"), data.get("step_time"), data.get("tracking")
        return cls(run_id=_text(data.get("run_id")), name=_text(data.get("name")), status=str(data.get("status")),
                   cached=bool(data.get("cached")),
                   stages={str(k): StageSummary.from_dict(v) for k, v in stages.items() if isinstance(v, dict)}
                   if isinstance(stages, dict) else {},
                   final=dict(final) if isinstance(final, dict) else {}, error=_text(data.get("error")),
                   exit_code=code if isinstance(code, int) else 0,
                   wall_time_s=float(wall) if isinstance(wall, (int, float)) else None,
                   run_dir=_text(data.get("run_dir")), judged="baseline" in data,
                   baseline=dict(baseline) if isinstance(baseline, dict) else None,
                   step_time=dict(step_time) if isinstance(step_time, dict) else None,
                   tracking=Tracking(target=_text(tracking.get("target")), state=_text(tracking.get("state")),
                                     error=_text(tracking.get("error")), mlflow_run=_text(tracking.get("mlflow_run")))
                   if isinstance(tracking, dict) else None,
                   extra={k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> Json:
        out: Json = {**self.extra, "run_id": self.run_id, "name": self.name, "status": self.status,
                     "cached": self.cached, "stages": {k: v.to_dict() for k, v in self.stages.items()},
                     "final": self.final, "error": self.error, "exit_code": self.exit_code,
                     "wall_time_s": self.wall_time_s}
        if self.run_dir is not None:
            out["run_dir"] = self.run_dir
        if self.judged:
            out["baseline"] = self.baseline
        if self.step_time is not None:
            out["step_time"] = self.step_time
        if self.tracking is not None:
            out["tracking"] = self.tracking.to_dict()
        return out


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
