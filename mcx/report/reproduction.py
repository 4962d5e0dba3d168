"""What `mcx reproduce` returns: the verdict and everything it compared, typed.

``mcx.ops.reproduce`` builds a :class:`Reproduction`; the CLI renders it (``run_view.render_verdict``) or prints
:meth:`Reproduction.to_dict`, which is also the reproduction's ``verdict.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from mcx.report.verdict import Verdict, verdict_to_dict


@frozen
class Drift:
    """A hashed key of a fingerprint component that is not, here, what the run recorded."""

    key: str
    recorded: object
    now: object

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "recorded": self.recorded, "now": self.now}


@frozen
class CodeUsed:
    """The code the rerun ran: this project's (``rebuilt`` false) or a worktree at the recorded commit, with the
    recorded diff applied where ``patched``; ``drift``: mcx's module files that are not the recorded ones."""

    commit: str | None
    patched: bool
    worktree: str | None
    rebuilt: bool
    drift: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "patched": self.patched, "worktree": self.worktree, "rebuilt": self.rebuilt,
                "drift": list(self.drift)}


@frozen
class DataChange:
    """A data path of the spec that is not, here, the version the run trained on."""

    key: str
    path: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "path": self.path, "reason": self.reason}


@frozen
class RestoredData:
    """A DVC-tracked output brought back by hash into the reproduction's worktree."""

    key: str
    path: str
    md5: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "path": self.path, "md5": self.md5}


@frozen
class ParentCheckpoint:
    """The weights the run started from ([init] from), checked against the record: its recorded identity, where
    it is now, and whether it was fetched from DVC for this reproduction."""

    id: Mapping[str, object]
    path: str | None
    pulled: bool

    def to_dict(self) -> dict[str, Any]:
        return {**self.id, "path": self.path, "pulled": self.pulled}


@frozen
class SeedRef:
    run_id: str
    seed: object


@frozen
class Reproduction:
    run_id: str
    reproduction: str  # the label, r1, r2, ...
    reproduction_dir: str
    mlflow_run: str | None
    verdict: Verdict
    status: str  # the rerun's Status value
    code: CodeUsed
    environment_drift: tuple[Drift, ...] = ()
    hardware_drift: tuple[Drift, ...] = ()
    data_changes: tuple[DataChange, ...] = ()
    data_restored: tuple[RestoredData, ...] = ()
    parent: ParentCheckpoint | None = None
    seed_runs: tuple[SeedRef, ...] = ()  # the runs whose spread gave the band (none unless it did)
    debug: tuple[str, ...] = ()  # the faults injected into the rerun

    @property
    def kind(self) -> str:
        return self.verdict.kind

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `mcx reproduce --json` and of the reproduction's verdict.json."""
        out: dict[str, Any] = {
            "run_id": self.run_id, "reproduction": self.reproduction, "reproduction_dir": self.reproduction_dir,
            "mlflow_run": self.mlflow_run, **verdict_to_dict(self.verdict),
            "environment_drift": [d.to_dict() for d in self.environment_drift],
            "hardware_drift": [d.to_dict() for d in self.hardware_drift], "code": self.code.to_dict(),
            "data_identical": True, "data_changes": [c.to_dict() for c in self.data_changes],
            "data_restored": [r.to_dict() for r in self.data_restored],
            "parent": self.parent.to_dict() if self.parent else None,
            "seed_runs": [{"run_id": s.run_id, "seed": s.seed} for s in self.seed_runs], "status": self.status}
        if self.debug:
            out["debug"] = list(self.debug)
        d = self.verdict.divergence
        if d is not None:
            out["diverged_at"] = {"step": d.step, "metric": d.metric, "original": d.original, "reproduction": d.rerun}
        return out
