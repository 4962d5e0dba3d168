"""The plan as `mcx plan` shows it and ``plan.json`` holds it: the planner's plan, what the machine it was made
on lacks or cannot know, and a mixture's components as the run reads them; and `mcx run --dry-run`'s answer."""

from __future__ import annotations

from typing import Any

from attrs import frozen

Json = dict[str, Any]

from mcx.plan.layout_rules import Layout
from mcx.plan.mixture import DataRow
from mcx.plan.planner import Plan, plan_to_dict


@frozen
class ShownPlan:
    plan: Plan
    notes: tuple[str, ...] = ()  # said beside the plan's own warnings
    data: tuple[DataRow, ...] = ()  # empty: one dataset, not a mixture

    @property
    def warnings(self) -> tuple[str, ...]:
        return (*self.plan.warnings, *self.notes)

    def to_dict(self) -> dict[str, Any]:
        """plan.json: the planner's view with the notes among its warnings and the mixture's rows."""
        return {**plan_to_dict(self.plan), "warnings": list(self.warnings),
                **({"data": [row.to_dict() for row in self.data]} if self.data else {})}


@frozen
class StageLaunch:
    """What a stage would launch: its launcher and the layout its job runs."""

    kind: str  # launch.kind
    layout: Layout

    def to_dict(self) -> Json:
        return {"kind": self.kind, "layout": self.layout.job_dict()}


@frozen(kw_only=True)
class DryRun:
    """`mcx run --dry-run`: the plan and what each stage would launch (its sbatch script on Slurm)."""

    run_id: str | None
    stages: tuple[str, ...]
    launch: dict[str, StageLaunch]
    scripts: dict[str, str]  # a Slurm stage's sbatch script
    plan: ShownPlan
    exit_code: int = 0
    status: str = "dry-run"

    def to_dict(self) -> Json:
        return {"run_id": self.run_id, "status": self.status, "cached": False, "stages": {s: {} for s in self.stages},
                "scripts": self.scripts, "launch": {s: launch.to_dict() for s, launch in self.launch.items()},
                "plan": self.plan.to_dict(), "exit_code": self.exit_code}
