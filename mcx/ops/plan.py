"""`mcx plan`: load -> plan -> fingerprint -> run ID, without running anything."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.spec import ExperimentSpec, load_spec


@frozen
class PlanResult:
    spec: ExperimentSpec
    plan: Any  # mcx.plan.planner.Plan
    plan_dict: dict[str, Any]
    record: Any  # mcx.fingerprint.record.FingerprintRecord
    run_id: str

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, **self.plan_dict, "fingerprint": _component_hashes(self.record),
                "warnings": [*self.plan_dict.get("warnings", []), *self.record.warnings]}


def _component_hashes(record: Any) -> dict[str, str]:
    from mcx.fingerprint.record import component_hashes

    return component_hashes(record)


def te_available(spec: ExperimentSpec) -> bool | None:
    """Whether Transformer Engine will be there where the worker runs; None when it cannot be known here."""
    if spec.launch.kind == "slurm":
        return None  # planned on a login node; the cluster's environment decides
    if importlib.util.find_spec("transformer_engine") is not None:
        return True
    if spec.hardware.gpu not in ("cpu", "any") and shutil.which("nvidia-smi") is None:
        return None  # planned away from the GPU machine the spec targets
    return False


def plan_loaded(spec: ExperimentSpec, project: Path, *, probe_hardware: bool = True,
                require_data: bool = False) -> PlanResult:
    from mcx.fingerprint.record import collect, run_id
    from mcx.plan.planner import make_plan, plan_to_dict

    plan = make_plan(spec, te_available=te_available(spec))
    record = collect(spec, project, probe_hardware=probe_hardware, require_data=require_data)
    return PlanResult(spec=spec, plan=plan, plan_dict=plan_to_dict(plan), record=record, run_id=run_id(record))


def plan_spec(path: str, overrides: list[str], project: Path, *, probe_hardware: bool = True) -> PlanResult:
    return plan_loaded(load_spec(path, overrides), project, probe_hardware=probe_hardware)
