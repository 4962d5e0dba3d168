"""`mcx run`'s summary as a typed record (mcx.track.run_summary): the JSON it writes keeps the keys run.json and
`--json` always had, a stored one reads back to the same JSON, and the baseline's verdict sets the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from mcx.contract.result import StageResult
from mcx.ops.run import _stage_summary
from mcx.plan.planner import make_plan, plan_to_dict
from mcx.plan.shown import DryRun, ShownPlan, StageLaunch
from mcx.spec import load_spec
from mcx.track.run_summary import RunSummary, Tracking

SMOKE = StageResult(status="finished", passed=True, checks={"loss_drop": {"passed": True, "detail": "ok"}},
                    final={"train_loss": 7.1}, steps=6, layer_spec="local", warnings=("slow disk",),
                    control_checks={"resume": {"passed": True}})
KEYS = {"run_id", "name", "status", "cached", "stages", "final", "error", "exit_code", "wall_time_s", "run_dir"}


def _trained(**kw):
    base = dict(run_id="0123456789ab", name="tiny", status="finished", stages={"smoke": _stage_summary(SMOKE)},
                final={"train_loss": 7.1}, wall_time_s=3.5, run_dir="/p/.mcx/runs/0123456789ab")
    return RunSummary(**{**base, **kw})


def test_a_stage_is_written_with_the_keys_it_always_had():
    assert _stage_summary(SMOKE).to_dict() == {
        "status": "finished", "passed": True, "checks": {"loss_drop": {"passed": True, "detail": "ok"}},
        "control_checks": {"resume": {"passed": True}}, "metrics": {"train_loss": 7.1}, "steps": 6,
        "layer_spec": "local", "error": None, "warnings": ["slow disk"]}


def test_keys_appear_only_where_the_run_had_them():
    """No baseline unless one was judged (null where the spec names none), no step_time off the GPU, tracking
    only in what the command returns (run.json is written before the records are)."""
    assert set(_trained().to_dict()) == KEYS
    judged = _trained().judge(None).to_dict()
    assert set(judged) == KEYS | {"baseline"} and judged["baseline"] is None
    tracked = _trained(step_time={"predicted_s": 1.0}, tracking=Tracking(target="http://127.0.0.1:5000",
                                                                         state="synced", error=None, mlflow_run="u1"))
    assert set(tracked.to_dict()) == KEYS | {"step_time", "tracking"}
    assert tracked.to_dict()["tracking"] == {"target": "http://127.0.0.1:5000", "state": "synced", "error": None,
                                             "mlflow_run": "u1"}


def test_a_regression_against_the_baseline_fails_the_run():
    out = _trained().judge({"baseline": "abc", "verdict": "regress", "detail": "valid_loss +3%"})
    assert out.exit_code == 1 and out.error == "held-out metrics regressed against the baseline: valid_loss +3%"
    within = _trained().judge({"baseline": "abc", "verdict": "within", "detail": "within tolerance"})
    assert within.exit_code == 0 and within.error is None and within.baseline["verdict"] == "within"


def test_a_stored_summary_reads_back_to_the_same_json():
    """run.json of a trained run, with a key this mcx does not write (an older or newer one's): kept."""
    stored = json.loads(json.dumps({**_trained().judge(None).to_dict(), "listed": ["mlflow"]}))
    assert RunSummary.from_dict(stored).to_dict() == stored
    assert RunSummary.from_dict(stored).stages["smoke"].passed is True


def test_a_dry_run_is_written_as_before():
    plan = make_plan(load_spec(Path(__file__).parent.parent / "experiments" / "tiny.toml"), te_available=False)
    dry = DryRun(run_id=None, stages=("smoke", "full"), launch={"full": StageLaunch("local", plan.full.layout)},
                 scripts={}, plan=ShownPlan(plan, notes=("no GPU here",)))
    layout = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1, "world_size": 1, "sequence_parallel": False}
    assert dry.to_dict() == {"run_id": None, "status": "dry-run", "cached": False, "stages": {"smoke": {}, "full": {}},
                             "scripts": {}, "launch": {"full": {"kind": "local", "layout": layout}},
                             "plan": {**plan_to_dict(plan), "warnings": [*plan.warnings, "no GPU here"]}, "exit_code": 0}
