"""Every recipe in experiments/ loads, plans (full and smoke stage) and fits its GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcx.errors import BudgetError
from mcx.plan.cost import check_budget
from mcx.plan.layout_rules import resolve_layout
from mcx.plan.planner import make_plan, plan_to_dict
from mcx.spec import load_spec
from mcx.spec.rules import check_spec

EXPERIMENTS = sorted((Path(__file__).resolve().parent.parent / "experiments").glob("*.toml"))
PUBLISHED = sorted((Path(__file__).resolve().parent.parent / "experiments" / "published").glob("*.toml"))
GPU_SPECS = {"h200_1gpu", "h200_2gpu", "llama3_8b", "llama2_13b", "llama3_70b", "llama405b", "mixtral_8x7b"}


def _te(spec) -> bool | None:
    """As on a login node: Transformer Engine unknown for GPU recipes; CPU recipes run without it."""
    return False if spec.hardware.gpu in ("cpu", "any") else None


def test_the_recipes_are_all_there():
    assert {p.stem for p in EXPERIMENTS} >= GPU_SPECS | {"tiny", "tiny_moe"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_recipe_loads_and_plans(path):
    spec = load_spec(path)
    plan = make_plan(spec, te_available=_te(spec))
    data = plan_to_dict(plan)
    json.dumps(data, allow_nan=False)
    layout = plan.layout
    assert layout.tp * layout.pp * layout.cp * layout.dp == layout.world_size
    assert layout.world_size == spec.hardware.nodes * spec.hardware.gpus_per_node
    if path.stem in GPU_SPECS:
        # Each recipe is sized for its GPUs and pins its layout.
        assert plan.memory.verdict == "fits", (plan.memory.total, plan.memory.capacity)
        assert plan.cost.gpu_hours is not None and plan.cost.gpu_hours > 0
        assert None not in (spec.parallel.tensor, spec.parallel.pipeline, spec.parallel.context)
    assert plan.smoke is not None
    smoke = plan.smoke.spec
    assert check_spec(smoke) == []
    assert resolve_layout(smoke, te_available=_te(spec))[0] == plan.smoke.layout
    assert smoke.model.hidden_size <= 256 and smoke.model.seq_length <= 256 and smoke.train.train_iters <= 50
    assert plan.smoke.layout.world_size <= layout.world_size


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_published_configurations_plan_and_name_their_source(path):
    """NVIDIA's rows the step-time model is checked on (docs/steptime.md): each plans with the model's step on
    its GPUs, and its header cites where its figures come from."""
    head = path.read_text().split("\n[", 1)[0]
    assert "# Source:" in head and "tokens/s/GPU" in head
    spec = load_spec(path)
    plan = make_plan(spec, te_available=True)
    assert plan.cost.mfu_source == "model" and plan.cost.predicted is not None and plan.cost.step_time_s > 0
    assert spec.parallel.tensor is not None and spec.parallel.pipeline is not None


def test_only_the_405b_recipe_needs_confirmation():
    for path in EXPERIMENTS:
        spec = load_spec(path)
        plan = make_plan(spec, te_available=_te(spec))
        if path.stem == "llama405b":
            assert plan.cost.over_budget
            with pytest.raises(BudgetError):
                check_budget(plan, confirmed=False)
        else:
            check_budget(plan, confirmed=False)


def test_recipes_carry_their_documented_layouts():
    def layout(name):
        spec = load_spec(EXPERIMENTS[[p.stem for p in EXPERIMENTS].index(name)])
        return make_plan(spec, te_available=_te(spec)).layout

    assert (layout("llama3_70b").tp, layout("llama3_70b").pp, layout("llama3_70b").world_size) == (4, 4, 64)
    l405 = layout("llama405b")
    assert (l405.tp, l405.pp, l405.cp, l405.world_size) == (8, 8, 2, 128)
    mix = layout("mixtral_8x7b")
    assert (mix.tp, mix.ep, mix.world_size) == (2, 4, 32)
    assert layout("h200_2gpu").dp == 2 and layout("llama2_13b").tp == 2
    moe = load_spec(EXPERIMENTS[[p.stem for p in EXPERIMENTS].index("tiny_moe")])
    assert (moe.model.num_experts, moe.model.moe_router_topk, moe.model.hidden_size) == (4, 2, 128)


def test_every_recipe_fingerprints_to_a_stable_run_id():
    """Each recipe gets a run ID (data from data.dvc's record, before any pull); fingerprinting twice
    gives the same ID; distinct experiments get distinct IDs, while tiny_ddp (torchrun) and tiny_slurm
    (the same 2-rank job through Slurm) share one: the launcher cannot change results."""
    from mcx.fingerprint import collect, run_id

    root = Path(__file__).resolve().parent.parent
    ids = {}
    for path in EXPERIMENTS:
        spec = load_spec(path)
        first = run_id(collect(spec, root, probe_hardware=False, require_data=False))
        again = run_id(collect(spec, root, probe_hardware=False, require_data=False))
        assert first == again and len(first) == 12
        ids[path.stem] = first
    assert ids["tiny_ddp"] == ids["tiny_slurm"]
    del ids["tiny_slurm"]
    assert len(set(ids.values())) == len(ids), ids


def test_the_fp8_seq8192_recipe_plans_its_measured_peak():
    """experiments/h200_2gpu_fp8.toml on two H200s (2026-11-30, 8666713, with the fused MLP): 132,572,651,520
    bytes peak per GPU (788 TFLOP/s/GPU). The planner calls it tight, within 10% above the peak, and its
    allocator setting and fused MLP reach the exported Megatron-LM script."""
    from mcx.interop.exporter import export

    path = EXPERIMENTS[[p.stem for p in EXPERIMENTS].index("h200_2gpu_fp8")]
    spec = load_spec(path)
    plan = make_plan(spec, te_available=True)
    assert (plan.layout.dp, plan.layout.tp, spec.model.seq_length, spec.train.precision) == (2, 1, 8192, "fp8-hybrid")
    assert plan.memory.verdict == "tight" and 1.0 < plan.memory.total / 132_572_651_520 < 1.10
    assert not any("expandable" in w for w in plan.warnings)  # the spec sets it already
    script = export(spec, plan.layout, script=True)
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in script
    assert spec.train.te_op_fuser and "--use-transformer-engine-op-fuser" in script
    from mcx.interop import import_script

    assert import_script(script, name=spec.name).spec.train.te_op_fuser is True  # and back
    base = EXPERIMENTS[[p.stem for p in EXPERIMENTS].index("h200_2gpu")]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in export(load_spec(base), script=True)
