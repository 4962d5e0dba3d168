"""The planner: GPU table, layout rules and recommendations, FLOPs, memory, cost/budget, smoke stage."""

from __future__ import annotations

import copy
import math
from pathlib import Path
import json

import attrs
import pytest
import tomli_w
from rich.console import Console

from mcx.errors import BudgetError, SpecError
from mcx.hashing import digest
from mcx.plan import smoketime
from mcx.plan.cost import check_budget, estimate_cost
from mcx.plan.flops import flops_per_iteration, flops_per_token
from mcx.plan.gpus import GPUS, GiB, gpu_from_name, mfu_peak_flops, peak_flops, supports_fp8
from mcx.plan.layout_rules import Layout, resolve_layout
from mcx.plan.memory import estimate_memory, verdict
from mcx.plan.params import count_params
from mcx.plan.planner import make_plan, plan_to_dict
from mcx.plan.steptime import Features, predict
from mcx.plan.shown import ShownPlan
from mcx.report.plan_view import render_plan
from mcx.spec import load_spec, loads_spec
from mcx.spec.load import deep_merge
from mcx.spec.rules import check_spec
from mcx.spec.schema import ModelSpec

BASE = {
    "name": "t",
    "model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 8,
              "ffn_hidden_size": 4096, "seq_length": 2048, "vocab_size": 32000},
    "parallel": {"tensor": 1, "pipeline": 1, "context": 1},
    "train": {"micro_batch_size": 1, "global_batch_size": 64, "train_iters": 100, "lr": 3e-4},
    "data": {"path": "data/quickstart"},
    "hardware": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100"},
}


def spec(**over):
    """A spec from BASE with sections merged in (``model={...}``) and ``drop=[("parallel", "tensor")]``."""
    data = copy.deepcopy(BASE)
    for section, key in over.pop("drop", []):
        data[section].pop(key, None)
    return loads_spec(tomli_w.dumps(deep_merge(data, over)))


def problems_of(s, te=True) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as exc:
        resolve_layout(s, te_available=te)
    return exc.value.problems


def one_problem(s, te=True) -> tuple[str, str]:
    found = problems_of(s, te)
    assert len(found) == 1, found
    return found[0]


# --- hardware -----------------------------------------------------------------------------------


def test_gpu_table_peaks_and_unknowns():
    assert peak_flops("H100", "bf16") == peak_flops("H200", "bf16") == 989e12
    assert peak_flops("H100", "fp8-hybrid") == 1979e12
    assert peak_flops("A100-80GB", "bf16") == 312e12 and peak_flops("A100-80GB", "fp8-e4m3") is None
    # MFU is always against the bf16 dense peak; unknown GPUs have none (MFU "unknown", not a guess).
    assert mfu_peak_flops("B200") == 2250e12
    for gpu in ("any", "cpu", "TPU-v5"):
        assert peak_flops(gpu, "bf16") is None and mfu_peak_flops(gpu) is None
    assert GPUS["H200"].memory_bytes == 150_109_880_320  # torch total_memory on an H200
    assert supports_fp8("H100") and supports_fp8("L40S") and supports_fp8("B200")
    assert supports_fp8("A100-40GB") is False and supports_fp8("cpu") is False and supports_fp8("any") is None


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"), ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None), ("Tesla V100-SXM2-32GB", None),
])
def test_gpu_from_name(name, key):
    assert gpu_from_name(name) == key


# --- parameters and FLOPs -------------------------------------------------------------------------


@pytest.mark.parametrize("preset,total", [
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3.1-405b", 405_853_388_800),
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("mixtral-8x7b", 46_702_792_704),
])
def test_parameter_counts_match_published_models(preset, total):
    from mcx.spec.presets import PRESETS

    m = ModelSpec(**PRESETS[preset])
    assert count_params(m, m.vocab_size).total == total


def test_flops_match_the_upstream_measurement_for_llama3_8b_shapes_with_8_layers():
    # Megatron logged TFLOP/s consistent with 473e12 FLOPs per step for this model at 8 x 4096 tokens.
    m = ModelSpec(num_layers=8, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                  seq_length=4096, vocab_size=128256)
    assert flops_per_iteration(m, padded_vocab=128256, global_batch_size=8) == 472_721_280_466_944
    assert flops_per_iteration(m, padded_vocab=128256, global_batch_size=16) == 2 * 472_721_280_466_944


def test_flops_equal_the_narayanan_formula_with_causal_attention_halved():
    # GPT-3 175B shapes (MHA, GeLU 4h): 72 B s L h^2 (1 + s/(6h) + V/(12 h L)) with the s/(6h)
    # attention-score term halved for the causal mask, as current Megatron-LM counts it.
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    m = ModelSpec(num_layers=L, hidden_size=h, num_attention_heads=96, seq_length=s, swiglu=False)
    expected = 72 * B * s * L * h * h + 6 * B * s * h * V + 6 * B * s * s * L * h
    assert flops_per_iteration(m, padded_vocab=V, global_batch_size=B) == expected
    assert flops_per_token(m, padded_vocab=V) == pytest.approx(expected / (B * s))


def test_flops_count_gqa_projections_and_topk_experts():
    h, q, kv, ffn, L, s, V = 4096, 4096, 1024, 14336, 32, 4096, 32000
    dense = ModelSpec(num_layers=L, hidden_size=h, num_attention_heads=32, num_query_groups=8,
                      ffn_hidden_size=ffn, seq_length=s)
    per_token = 6 * (L * (h * (q + 2 * kv) + q * h + 3 * h * ffn) + h * V) + 6 * s * L * q
    assert flops_per_iteration(dense, padded_vocab=V, global_batch_size=1) == s * per_token
    # Mixtral: 8 experts, top-2 of width 14336 count like one dense MLP of width 2 x 14336.
    moe = attrs.evolve(dense, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=ffn)
    wide = attrs.evolve(dense, ffn_hidden_size=2 * ffn)
    assert flops_per_iteration(moe, padded_vocab=V, global_batch_size=4) == \
        flops_per_iteration(wide, padded_vocab=V, global_batch_size=4)


# --- layout rules: each with its key and fix ------------------------------------------------------


def test_tensor_must_divide_heads_and_query_groups():
    path, msg = one_problem(spec(parallel={"tensor": 3}, hardware={"gpus_per_node": 6}))
    assert path == "parallel.tensor" and "3 does not divide model.num_attention_heads = 16" in msg
    assert "use 1, 2 or 4" in msg  # divisors of 16 heads and 8 groups that fit the 6-GPU node
    path, msg = one_problem(spec(parallel={"tensor": 4}, model={"num_query_groups": 2}))
    assert path == "parallel.tensor" and "model.num_query_groups = 2" in msg and "use 1 or 2" in msg


def test_degrees_must_divide_the_world_size():
    path, msg = one_problem(spec(parallel={"tensor": 4, "pipeline": 4}))
    assert path == "parallel"
    assert "4 x 4 x 1 = 16 does not divide the world size 8 (hardware.nodes = 1 x hardware.gpus_per_node = 8)" in msg


def test_pipeline_must_divide_layers_and_virtual_pipeline_rules():
    path, msg = one_problem(spec(model={"num_layers": 6}, parallel={"pipeline": 4}))
    assert path == "parallel.pipeline" and "does not divide model.num_layers = 6; use 1, 2, 3 or 6" in msg
    path, msg = one_problem(spec(parallel={"pipeline": 1, "virtual_pipeline": 2}))
    assert path == "parallel.virtual_pipeline" and "needs parallel.pipeline >= 2" in msg
    path, msg = one_problem(spec(model={"num_layers": 12}, parallel={"pipeline": 4, "virtual_pipeline": 2}))
    assert path == "parallel.virtual_pipeline" and "4 x 2 does not divide model.num_layers = 12" in msg
    path, msg = one_problem(spec(parallel={"pipeline": 4, "virtual_pipeline": 2}, train={"global_batch_size": 6}))
    assert path == "train.global_batch_size" and "3 micro-batches" in msg and "multiple of 8" in msg


def test_global_batch_must_be_a_multiple_of_micro_batch_times_dp():
    path, msg = one_problem(spec(train={"global_batch_size": 20, "micro_batch_size": 2}, parallel={"tensor": 2}))
    assert path == "train.global_batch_size"
    assert "20 is not a multiple of train.micro_batch_size x data parallel = 2 x 4 = 8; use e.g. 16 or 24" in msg


def test_expert_parallel_divides_experts_and_dp_times_cp():
    moe = {"num_experts": 6, "moe_router_topk": 2}
    path, msg = one_problem(spec(model=moe, parallel={"expert": 4}))
    assert path == "parallel.expert" and "does not divide model.num_experts = 6" in msg
    path, msg = one_problem(spec(model={"num_experts": 8}, parallel={"expert": 8, "tensor": 2, "sequence_parallel": True}))
    assert path == "parallel.expert" and "data parallel x context parallel = 4 x 1 = 4" in msg and "use 1, 2 or 4" in msg
    layout, _, _ = resolve_layout(spec(model={"num_experts": 8}, parallel={"expert": 4, "tensor": 2,
                                                                           "sequence_parallel": True}),
                                  te_available=True)
    assert (layout.tp, layout.ep, layout.dp) == (2, 4, 4)


def test_sequence_parallel_rules():
    path, msg = one_problem(spec(parallel={"sequence_parallel": True}))
    assert path == "parallel.sequence_parallel" and "needs parallel.tensor > 1" in msg
    path, msg = one_problem(spec(model={"num_experts": 4}, parallel={"tensor": 2, "expert": 2}))
    assert path == "parallel.sequence_parallel" and "mixture-of-experts" in msg and "set it to true" in msg


def test_context_parallel_sequence_split_and_recompute_layers():
    path, msg = one_problem(spec(model={"seq_length": 2044}, parallel={"context": 4}, hardware={"gpus_per_node": 8}))
    assert path == "model.seq_length" and "multiple of 2 x parallel.context = 8" in msg
    recompute = {"recompute_granularity": "full", "recompute_num_layers": 4}
    path, msg = one_problem(spec(parallel={"pipeline": 4}, train=recompute))
    assert path == "train.recompute_num_layers" and "exceeds the 2 layers of a pipeline stage" in msg


def test_transformer_engine_features_error_warn_or_pass_by_availability():
    cp = spec(parallel={"context": 2})
    path, msg = one_problem(cp, te=False)
    assert path == "parallel.context" and "needs Transformer Engine, which is not available" in msg
    _, warnings, _ = resolve_layout(cp, te_available=None)  # a login node cannot know: a warning
    assert any("context parallel (parallel.context = 2) needs Transformer Engine" in w for w in warnings)
    _, warnings, _ = resolve_layout(cp, te_available=True)
    assert not any("Transformer Engine" in w for w in warnings)
    many = spec(parallel={"context": 2, "tensor": 2, "sequence_parallel": True}, train={"precision": "fp8-hybrid"},
                hardware={"gpu": "H200", "gpus_per_node": 4})
    _, warnings, _ = resolve_layout(many, te_available=None)  # one warning, every feature named in it
    said = [w for w in warnings if "Transformer Engine" in w]
    assert said == ['context parallel (parallel.context = 2), FP8 (train.precision = "fp8-hybrid") and sequence '
                    'parallel with RMSNorm need Transformer Engine; whether the training environment has it cannot be '
                    'checked from here; make sure it does, or set model.transformer_impl = "transformer_engine" to '
                    'fail early'], said
    path, msg = one_problem(spec(parallel={"context": 2}, model={"transformer_impl": "local"}), te=True)
    assert path == "parallel.context" and "model.transformer_impl = \"local\"" in msg
    path, msg = one_problem(spec(parallel={"tensor": 2, "sequence_parallel": True}), te=False)
    assert path == "parallel.sequence_parallel" and "sequence parallel with RMSNorm" in msg
    path, msg = one_problem(spec(model={"transformer_impl": "transformer_engine"}), te=False)
    assert path == "model.transformer_impl" and "cannot run" in msg
    fused = {"te_op_fuser": True}  # Transformer Engine's fused MLP (D29)
    path, msg = one_problem(spec(train=fused, model={"transformer_impl": "local"}), te=True)
    assert path == "train.te_op_fuser" and msg == (
        'the fused MLP (train.te_op_fuser = true) needs Transformer Engine, but model.transformer_impl = "local"; '
        'set it to "auto" or "transformer_engine", or set train.te_op_fuser = false')
    path, msg = one_problem(spec(train=fused), te=False)
    assert path == "train.te_op_fuser" and "which is not available" in msg
    _, warnings, _ = resolve_layout(spec(train=fused), te_available=None)
    assert any("the fused MLP (train.te_op_fuser = true) needs Transformer Engine" in w for w in warnings)
    assert resolve_layout(spec(train=fused), te_available=True)[0].world_size >= 1
    fp8 = make_plan(spec(train={"precision": "fp8-hybrid"}, hardware={"gpu": "H200"}), te_available=True)
    assert any(a.startswith("train.te_op_fuser = true runs each MLP") for a in fp8.recommendations)
    for quiet in ({"precision": "fp8-hybrid", **fused}, {"precision": "bf16"}):
        plan = make_plan(spec(train=quiet, hardware={"gpu": "H200"}), te_available=True)
        assert not any("te_op_fuser" in a for a in plan.recommendations)


def test_cuda_graphs_refuse_what_a_captured_step_cannot_hold_and_stay_out_of_the_hash_when_off():
    """train.cuda_graphs (D75): one GPU, bf16 or fp32, a dense model; refused on CPU, with fp16, MoE, several GPUs
    (each with its fix), and on a machine without a GPU when hardware.gpu = "any"."""
    one = {"hardware": {"gpus_per_node": 1}, "train": {"global_batch_size": 8, "cuda_graphs": True}}
    assert resolve_layout(spec(**one), te_available=True)[0].world_size == 1
    plan = make_plan(spec(**one), te_available=True, local_device="cuda")
    assert plan.full.device == "cuda" and plan.smoke is not None and plan.smoke.spec.train.cuda_graphs
    found = dict(problems_of(spec(train={"cuda_graphs": True})))  # 8 GPUs
    assert list(found) == ["train.cuda_graphs"] and "this layout has 8" in found["train.cuda_graphs"] \
        and "hardware.gpus_per_node = 1" in found["train.cuda_graphs"]
    for over, words in ((dict(train={"precision": "fp16"}), "dynamic loss scaling"),
                        (dict(model={"num_experts": 4}), "mixture-of-experts"),
                        (dict(hardware={"gpu": "cpu"}, train={"precision": "fp32"}), "needs a GPU")):
        merged = deep_merge(copy.deepcopy(one), over)
        found = problems_of(spec(**merged))
        assert [k for k, _ in found] == ["train.cuda_graphs"] and words in found[0][1], found
    anywhere = deep_merge(copy.deepcopy(one), {"hardware": {"gpu": "any"}})
    with pytest.raises(SpecError) as exc:
        make_plan(spec(**anywhere), te_available=False, local_device="cpu")
    assert exc.value.problems[0][0] == "train.cuda_graphs" and "no GPU" not in exc.value.problems[0][1] \
        and "none visible" in exc.value.problems[0][1]
    # a named GPU's spec plans away from its machine (there its worker trains on the GPU)
    assert make_plan(spec(**one), te_available=True, local_device="cpu").full.spec.train.cuda_graphs
    # a GPU smoke stage keeps the graphs (its resume check then compares a graphed run with an eager restart);
    # a CPU one drops them
    cpu_smoke = make_plan(spec(**deep_merge(copy.deepcopy(one), {"smoke": {"gpu": "cpu"}})), te_available=True,
                          local_device="cuda")
    assert cpu_smoke.smoke is not None and not cpu_smoke.smoke.spec.train.cuda_graphs
    # off, the key is not in the hashed spec: every run ID from before it stays
    from mcx.spec import spec_to_dict
    assert "cuda_graphs" not in spec_to_dict(spec()).get("train", {})
    assert spec_to_dict(spec(**one))["train"]["cuda_graphs"] is True
    assert digest(spec_to_dict(spec())) != digest(spec_to_dict(spec(train={"cuda_graphs": True})))
    # `mcx tune` leaves a graphed trial's eager steps and its capture out of the figures
    from mcx.plan.fusions import GRAPH_WARMUP_STEPS, unmeasured_steps
    assert unmeasured_steps(spec(**one).train) == GRAPH_WARMUP_STEPS + 1 and unmeasured_steps(spec().train) == 0


def test_fp8_needs_an_fp8_gpu_and_transformer_engine():
    path, msg = one_problem(spec(train={"precision": "fp8-hybrid"}, hardware={"gpu": "A100-80GB"}))
    assert path == "train.precision" and "A100-80GB (Ampere)" in msg and "use \"bf16\"" in msg
    resolve_layout(spec(train={"precision": "fp8-hybrid"}, hardware={"gpu": "L40S"}), te_available=True)  # Ada: FP8
    _, warnings, _ = resolve_layout(spec(train={"precision": "fp8-e4m3"}, hardware={"gpu": "any"}), te_available=True)
    assert any("does not say which" in w for w in warnings)
    found = problems_of(spec(train={"precision": "fp8-hybrid"}, hardware={"gpu": "cpu"}), te=None)
    assert [p for p, _ in found] == ["train.precision", "train.precision"]  # no FP8 units, no TE on CPU


def test_every_problem_is_reported_at_once():
    s = spec(parallel={"tensor": 3, "pipeline": 3, "sequence_parallel": True, "distributed_optimizer": False},
             model={"num_layers": 8}, train={"global_batch_size": 7})
    paths = [p for p, _ in problems_of(s)]
    # 3 x 3 does not divide 8 GPUs, so DP (and the batch rule) is undefined; the rest is still reported.
    assert paths == ["parallel.overlap_param_gather", "parallel.tensor", "parallel", "parallel.pipeline"]
    with pytest.raises(SpecError) as exc:
        resolve_layout(s, te_available=True)
    assert exc.value.exit_code == 2 and str(exc.value).count("\n") == len(exc.value.problems)


def test_layout_warnings():
    _, warnings, _ = resolve_layout(spec(parallel={"tensor": 8}, hardware={"gpus_per_node": 4, "nodes": 2}),
                                    te_available=True)
    assert any("spans nodes" in w for w in warnings)
    _, warnings, _ = resolve_layout(spec(parallel={"pipeline": 4}, train={"global_batch_size": 4}), te_available=True)
    assert any("pipeline never fills" in w for w in warnings)


# --- recommendations ----------------------------------------------------------------------------


# The layout runs' model (benchmarks/throughput.py --preset layout): 218 and 340 ms a step on two H100 hosts,
# about 62 ms of it kernels; graphed, 68.6 and 72.9 ms (docs/benchmarks.md, "Small shapes").
_HOST_BOUND = ['hardware.gpu="H100"', 'train.precision="bf16"', "model.seq_length=2048",
               "model.max_position_embeddings=2048", "model.num_layers=8", "model.hidden_size=1024",
               "model.num_attention_heads=16", "model.num_query_groups=4", "model.ffn_hidden_size=2816",
               "train.micro_batch_size=2", "train.global_batch_size=16"]


def test_a_host_bound_step_is_named_with_the_lever_that_removes_it():
    tiny = REPO / "experiments" / "tiny.toml"
    eager = make_plan(load_spec(tiny, _HOST_BOUND), te_available=True)
    advice = [r for r in eager.recommendations if "the host sets this step" in r]
    assert len(advice) == 1 and advice[0].startswith("train.cuda_graphs = true: the host sets this step (244 ms "
                                                     "predicted for 77 ms of GPU work"), advice
    graphed = make_plan(load_spec(tiny, [*_HOST_BOUND, "train.cuda_graphs=true"]), te_available=True)
    assert not any("the host sets this step" in r for r in graphed.recommendations)
    assert graphed.cost.predicted.step_s < eager.cost.predicted.step_s / 3
    # Where a graph cannot hold the step (a mixture of experts): the experts as one grouped GEMM (Transformer
    # Engine's), then fewer micro-batches.
    moe = make_plan(load_spec(REPO / "experiments" / "tiny_moe.toml", _HOST_BOUND), te_available=True)
    advice = [r for r in moe.recommendations if "the host sets this step" in r]
    assert len(advice) == 2 and advice[0].startswith("model.moe_grouped_gemm = true: the host sets this step"), advice
    assert "each MoE layer's wait on its token counts" in advice[0]
    assert advice[1].startswith("a larger train.micro_batch_size, if memory allows"), advice
    assert advice[1].endswith("the 8 micro-batches a step")
    for overrides, te in (([*_HOST_BOUND, "model.moe_grouped_gemm=true"], True), (_HOST_BOUND, False)):
        other = make_plan(load_spec(REPO / "experiments" / "tiny_moe.toml", overrides), te_available=te)
        advice = [r for r in other.recommendations if "the host sets this step" in r]
        assert [r.split(":")[0] for r in advice] == ["a larger train.micro_batch_size, if memory allows"], advice
    # A step the GPU sets (the one-H200 spec) and a CPU plan (no step-time model) say nothing of the host.
    h200 = make_plan(load_spec(REPO / "experiments" / "h200_1gpu.toml"), te_available=True)
    cpu = make_plan(load_spec(tiny), te_available=True)
    assert not any("the host sets this step" in r for p in (h200, cpu) for r in p.recommendations)


def _unset(**over):
    return spec(drop=[("parallel", "tensor"), ("parallel", "pipeline"), ("parallel", "context")], **over)


def test_unset_degrees_take_the_most_data_parallel_layout_that_fits():
    small = _unset()
    layout, _, recs = resolve_layout(small, te_available=True)
    assert (layout.tp, layout.pp, layout.cp, layout.dp) == (1, 1, 1, 8)
    llama = _unset(model={"preset": "llama3-8b", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                          "ffn_hidden_size": 14336, "seq_length": 8192, "vocab_size": 128256},
                   train={"global_batch_size": 512})
    layout, _, recs = resolve_layout(llama, te_available=True)
    # DP 8 needs ~97 GiB per GPU on an 80 GB H100; TP 2 is the least model parallelism that fits.
    assert (layout.tp, layout.pp, layout.cp, layout.dp) == (2, 1, 1, 4)
    assert any(r.startswith("parallel.tensor = 2, parallel.pipeline = 1, parallel.context = 1: chosen") for r in recs)
    assert any(r.startswith("parallel.sequence_parallel = true") for r in recs)
    assert layout.tp * layout.pp * layout.cp * layout.dp == layout.world_size
    big = attrs.evolve(llama, hardware=attrs.evolve(llama.hardware, gpu="H200"))
    assert resolve_layout(big, te_available=True)[0].tp == 1  # 141 GB holds DP 8


def test_rules_of_thumb_pipeline_above_70b_and_context_above_8k():
    big = _unset(model={"preset": "llama3-70b", "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                        "ffn_hidden_size": 28672, "seq_length": 8192, "vocab_size": 128256},
                 hardware={"nodes": 8, "gpu": "H200"}, train={"global_batch_size": 512})
    layout, _, _ = resolve_layout(big, te_available=True)
    assert layout.pp >= 2 and layout.tp <= 8
    long = _unset(model={"seq_length": 32768}, hardware={"gpu": "H100"})
    assert resolve_layout(long, te_available=True)[0].cp == 4
    assert resolve_layout(long, te_available=False)[0].cp == 1  # CP needs TE: never recommended without it


def test_expert_parallel_is_recommended_for_moe():
    moe = spec(model={"num_experts": 8}, drop=[("parallel", "tensor")])
    layout, _, recs = resolve_layout(moe, te_available=True)
    assert layout.ep == 8 and layout.tp == 1 and "parallel.expert = 8" in recs[0]


# --- memory -------------------------------------------------------------------------------------

LLAMA3_LAYER = {"preset": "llama3-8b", "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
                "ffn_hidden_size": 14336, "vocab_size": 128256, "seq_length": 4096}

# Peaks measured on H200 (bf16, seq 4096, distributed optimizer, global batch 16), GiB: mcx's own
# runs (docs/benchmarks.md, 2026-11-30: first without the fusions, then with the fused cross entropy
# and gradient-accumulation fusion). The estimate is within 2% of each.
CALIBRATION = [
    ("2.8B SDPA mbs 2", {"num_layers": 8}, 2, 1, 1, "local", False, 66668722688 / GiB),
    ("2.8B SDPA mbs 4", {"num_layers": 8}, 4, 1, 1, "local", False, 77.2),
    ("2.8B TE mbs 2", {"num_layers": 8}, 2, 1, 1, "transformer_engine", False, 65997631488 / GiB),
    ("8B DP 2 TE mbs 1", {"num_layers": 32}, 1, 2, 1, "transformer_engine", False, 117957791744 / GiB),
    ("2.8B TE mbs 2 fused", {"num_layers": 8}, 2, 1, 1, "transformer_engine", True, 71687139328 / GiB),
    ("2.8B TE mbs 4 fused", {"num_layers": 8}, 4, 1, 1, "transformer_engine", True, 91464304640 / GiB),
    ("2.8B SDPA mbs 2 fused", {"num_layers": 8}, 2, 1, 1, "local", True, 72358230528 / GiB),
    ("2.8B SDPA mbs 4 fused", {"num_layers": 8}, 4, 1, 1, "local", True, 92806484480 / GiB),
    ("8B DP 2 TE mbs 1 fused", {"num_layers": 32}, 1, 2, 1, "transformer_engine", True, 121545986048 / GiB),
]
# docs/gpu.md's bare loops ("Reference figures", no fusions): another loop, 3-7% above mcx's peaks for the same
# shapes; the bound (10%) holds.
OTHER_LOOP = [
    ("2.8B SDPA mbs 2", {"num_layers": 8}, 2, 1, 1, "local", False, 65.0),
    ("2.8B SDPA mbs 4", {"num_layers": 8}, 4, 1, 1, "local", False, 84.0),
    ("1.5B SDPA mbs 2", {"num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192}, 2, 1, 1, "local", False, 44.0),
    ("8B DP 2 SDPA mbs 1", {"num_layers": 32}, 1, 2, 1, "local", False, 117.0),
    ("2.8B TP 2 SDPA mbs 2", {"num_layers": 8}, 2, 2, 2, "local", False, 35.0),
    ("16 layers TE mbs 2", {"num_layers": 16}, 2, 1, 1, "transformer_engine", False, 99.0),
]


def _planned_gib(model, mbs, gpus, tp, impl, fused) -> float:
    s = spec(model={**LLAMA3_LAYER, **model, "transformer_impl": impl}, parallel={"tensor": tp},
             train={"micro_batch_size": mbs, "global_batch_size": 16, "cross_entropy_fusion": fused},
             hardware={"gpus_per_node": gpus, "gpu": "H200"})
    plan = make_plan(s, te_available=impl == "transformer_engine")
    assert plan.transformer_impl == impl and plan.memory.verdict == "fits"
    return plan.memory.total / GiB


@pytest.mark.parametrize("name,model,mbs,gpus,tp,impl,fused,measured", CALIBRATION, ids=[c[0] for c in CALIBRATION])
def test_memory_matches_h200_measurements(name, model, mbs, gpus, tp, impl, fused, measured):
    estimate = _planned_gib(model, mbs, gpus, tp, impl, fused)
    assert estimate == pytest.approx(measured, rel=0.02), f"{name}: {estimate:.1f} GiB vs {measured} GiB"


@pytest.mark.parametrize("name,model,mbs,gpus,tp,impl,fused,measured", OTHER_LOOP, ids=[c[0] for c in OTHER_LOOP])
def test_memory_is_within_ten_percent_of_another_loops_peaks(name, model, mbs, gpus, tp, impl, fused, measured):
    estimate = _planned_gib(model, mbs, gpus, tp, impl, fused)
    assert estimate == pytest.approx(measured, rel=0.10), f"{name}: {estimate:.1f} GiB vs {measured} GiB"


def _mem(s, layout_over=None, impl="transformer_engine"):
    layout, _, _ = resolve_layout(s, te_available=True)
    if layout_over:
        layout = attrs.evolve(layout, **layout_over)
    return estimate_memory(s, layout, vocab_size=s.model.vocab_size, transformer_impl=impl)


def test_model_state_bytes_per_parameter():
    s = spec(model=LLAMA3_LAYER | {"num_layers": 4}, hardware={"gpu": "H200"})
    n = count_params(s.model, 128256).total
    full = _mem(s)  # DP 8, distributed optimizer: 2 + 4 + 12 / 8 bytes per parameter
    assert (full.weights, full.gradients, full.optimizer) == (2 * n, 4 * n, 12 * n // 8)
    no_dist = _mem(attrs.evolve(s, parallel=attrs.evolve(s.parallel, distributed_optimizer=False,
                                                         overlap_param_gather=False)))
    assert no_dist.optimizer == 12 * n
    bf16_grads = _mem(attrs.evolve(s, train=attrs.evolve(s.train, grad_reduce_in_bf16=True)))
    assert bf16_grads.gradients == 2 * n
    cp = _mem(spec(model=LLAMA3_LAYER | {"num_layers": 4}, parallel={"context": 2}, hardware={"gpu": "H200"}))
    assert cp.optimizer == 12 * n // 8  # sharded over DP x CP = 4 x 2
    assert cp.activations == pytest.approx(full.activations / 2, rel=1e-6)


def test_activation_savings_sequence_parallel_recompute_and_pipeline():
    base = spec(model=LLAMA3_LAYER | {"num_layers": 8}, parallel={"tensor": 2}, train={"global_batch_size": 64},
                hardware={"gpu": "H200"})
    plain = _mem(base)
    sp = _mem(attrs.evolve(base, parallel=attrs.evolve(base.parallel, sequence_parallel=True)))
    assert sp.activations < plain.activations and sp.weights == plain.weights
    full = _mem(attrs.evolve(base, train=attrs.evolve(base.train, recompute_granularity="full", recompute_num_layers=1)))
    # Full recompute keeps one h-wide input per layer (8 layers) plus one layer being recomputed.
    assert full.activations == pytest.approx(plain.activations / 8 + 8 * 4096 * 4096 * 2, rel=1e-6)
    # (without the fused cross entropy's fp32 logits copy, the first stage is the fuller one)
    pipe = spec(model=LLAMA3_LAYER | {"num_layers": 8}, parallel={"pipeline": 4},
                train={"global_batch_size": 64, "cross_entropy_fusion": False}, hardware={"gpu": "H200"})
    first = _mem(pipe)
    assert first.stage == "first" and first.in_flight_microbatches == 4  # 1F1B: PP micro-batches in flight
    assert first.logits == 0 and first.activations == pytest.approx(_mem(base, {"tp": 1, "dp": 8}).activations, rel=1e-6)
    interleaved = _mem(attrs.evolve(pipe, parallel=attrs.evolve(pipe.parallel, virtual_pipeline=2)))
    assert interleaved.in_flight_microbatches == pytest.approx(4 * (1 + 3 / 8))


def test_verdicts_and_fixes():
    s = spec(model=LLAMA3_LAYER | {"num_layers": 32, "seq_length": 8192}, train={"global_batch_size": 512},
             hardware={"gpu": "H100"})
    mem = _mem(s)
    assert mem.verdict == "does not fit" and mem.total > mem.capacity
    assert mem.fixes and "parallel.tensor = 2" in mem.fixes[0] and "(fits)" in mem.fixes[0]
    plan = make_plan(s, te_available=True)
    assert any(w.startswith("memory:") and "does not fit" in w for w in plan.warnings)
    assert _mem(attrs.evolve(s, hardware=attrs.evolve(s.hardware, gpu="any"))).verdict == "unknown"
    # With the allocator's expandable segments a plan fits up to 90% of the GPU; without them up to 85%.
    assert [verdict(n, 100, expandable=True) for n in (90, 91, 100, 101)] == ["fits", "tight", "tight", "does not fit"]
    assert [verdict(n, 100, expandable=False) for n in (85, 86, 90, 101)] == ["fits", "tight", "tight", "does not fit"]
    # bf16 at micro-batch 8 on the one-H200 spec (121.5 GiB planned, 87%) ran out of memory on H200 from
    # fragmentation and ran with expandable segments (D23): without the setting the plan is tight and names it.
    h200 = Path(__file__).resolve().parents[1] / "experiments" / "h200_1gpu.toml"
    te = ['model.transformer_impl="transformer_engine"']
    mbs8 = make_plan(load_spec(h200, ["train.micro_batch_size=8", *te]), te_available=True)
    assert mbs8.memory.verdict == "tight"
    assert [w for w in mbs8.warnings if w.startswith("memory:")] == [
        "memory: 121.5 GiB per GPU is tight in (over 85% of) the 139.8 GiB of each H200: without "
        "train.expandable_segments = true the allocator's fragments can run it out of memory; set it, or try "
        + mbs8.memory.fixes[0]]
    on = make_plan(load_spec(h200, ["train.micro_batch_size=8", "train.expandable_segments=true", *te]), te_available=True)
    assert on.memory.verdict == "fits"
    assert [w for w in on.warnings if w.startswith("memory:")] == [
        "memory: 121.5 GiB per GPU fits, but is over 85% of the 139.8 GiB of each H200"]  # already set: no hint
    # Full recomputation at micro-batch 4 on an H100 (70.8 GiB planned, 89.6%) ran out of memory (issue 41):
    # tight without the setting, as the H200 case.
    recompute = ['hardware.gpu="H100"', "train.micro_batch_size=4", 'train.recompute_granularity="full"',
                 'train.recompute_method="uniform"', "train.recompute_num_layers=1", *te]
    h100 = make_plan(load_spec(h200, recompute), te_available=True)
    assert h100.memory.verdict == "tight" and round(h100.memory.total / GiB, 1) == 70.8
    assert make_plan(load_spec(h200, [*recompute, "train.expandable_segments=true"]), te_available=True).memory.verdict == "fits"
    mbs4 = make_plan(load_spec(h200, ["train.micro_batch_size=4", *te]), te_available=True)
    assert not [w for w in mbs4.warnings if w.startswith("memory:")]


def test_out_of_memory_advice_sets_the_allocator_beside_the_plan():
    """What H200 reported when bf16 at micro-batch 8 ran out (2026-11-30): 10.7 GiB of fragments."""
    from mcx.plan.memory import memory_fixes, oom_advice

    h200 = Path(__file__).resolve().parents[1] / "experiments" / "h200_1gpu.toml"
    p = make_plan(load_spec(h200, ["train.micro_batch_size=8", 'model.transformer_impl="transformer_engine"']),
                  te_available=True)
    fixes = memory_fixes(p.spec, p.layout, p.memory, p.vocab_size, p.transformer_impl)
    facts = {"device": "cuda", "message": "CUDA out of memory. Tried to allocate 15.66 GiB.",
             "allocated_bytes": int(105.1 * GiB), "reserved_bytes": int(115.8 * GiB), "capacity_bytes": int(139.8 * GiB)}
    tips = oom_advice(p.memory, facts, fixes)
    assert tips[0] == ("the planner estimated 121.5 GiB per GPU; when the worker ran out, 105.1 GiB were allocated "
                       "and 115.8 GiB reserved of the GPU's 139.8 GiB")
    assert tips[1] == ("10.7 GiB were reserved but unallocated (the allocator's fragments): set "
                       "train.expandable_segments = true and run again")
    already = oom_advice(p.memory, {**facts, "expandable_segments": True}, fixes)  # fragments despite the setting
    assert not any("expandable_segments" in t for t in already) and already[1].startswith("lower the peak")
    assert tips[2].startswith("lower the peak: train.micro_batch_size = 1") and tips[2].endswith("(fits)")
    packed = oom_advice(p.memory, {**facts, "reserved_bytes": int(105.6 * GiB)}, fixes)  # no fragments to speak of
    assert not any("expandable_segments" in t for t in packed) and packed[1].startswith("lower the peak")
    host = oom_advice(p.memory, {"device": "cpu", "message": "DefaultCPUAllocator: can't allocate memory"}, [])
    assert host == ["the planner estimated 121.5 GiB per GPU of 139.8 GiB"]
    assert verdict(1, None, expandable=False) == "unknown"


# --- cost and budget -----------------------------------------------------------------------------


def test_step_time_gpu_hours_and_cost():
    s = spec(hardware={"gpu": "H100"}, budget={"assumed_mfu": 0.5, "gpu_hour_price": 2.0},
             train={"eval_interval": 1000})
    c = estimate_cost(s, flops_per_step=989e12 * 8, world_size=8)
    assert c.step_time_s == pytest.approx(2.0) and c.mfu_source == "assumed"
    assert c.gpu_hours == pytest.approx(100 * 2.0 * 8 / 3600) and c.cost == pytest.approx(2 * c.gpu_hours)
    measured = estimate_cost(s, flops_per_step=989e12 * 8, world_size=8, mfu=0.25)
    assert measured.step_time_s == pytest.approx(4.0) and measured.mfu_source == "measured"
    with_eval = estimate_cost(attrs.evolve(s, train=attrs.evolve(s.train, eval_interval=50, eval_iters=30)),
                              flops_per_step=989e12 * 8, world_size=8)
    assert with_eval.eval_time_s == pytest.approx(2 * 30 * 2.0 / 3)  # forward-only: a third of a step
    unknown = estimate_cost(attrs.evolve(s, hardware=attrs.evolve(s.hardware, gpu="any")), flops_per_step=1, world_size=8)
    assert unknown.step_time_s is None and unknown.gpu_hours is None and unknown.over_budget is None


def test_budget_gate():
    over = make_plan(spec(budget={"max_gpu_hours": 0.01}, train={"train_iters": 100000}), te_available=True)
    assert over.cost.over_budget
    with pytest.raises(BudgetError) as exc:
        check_budget(over, confirmed=False)
    assert exc.value.exit_code == 2
    assert "budget.max_gpu_hours = 0" in str(exc.value) and "--yes" in str(exc.value)
    check_budget(over, confirmed=True)
    check_budget(make_plan(spec(budget={"max_gpu_hours": 1e9}), te_available=True), confirmed=False)
    check_budget(make_plan(spec(budget={"max_gpu_hours": 0.01}, hardware={"gpu": "any"}), te_available=True),
                 confirmed=False)  # unknown GPU-hours: nothing to gate on (the plan warns instead)


def _smoke(s):
    """The smoke stage make_plan plans for ``s`` (Transformer Engine present): its spec and layout."""
    smoke = make_plan(s, te_available=True).smoke
    return smoke.spec, smoke.layout


# --- smoke stage ----------------------------------------------------------------------------------


def test_smoke_stage_shrinks_the_model_and_passes_its_own_rules():
    s = spec(model=LLAMA3_LAYER | {"num_layers": 32}, parallel={"tensor": 2, "sequence_parallel": True},
             train={"lr_warmup_iters": 2000, "global_batch_size": 512, "train_iters": 100000})
    plan = make_plan(s, te_available=True)
    layout = resolve_layout(s, te_available=True)[0]
    assert plan.full.spec is s and plan.full.layout == layout and plan.stage("full") is plan.full
    smoke, smoke_layout = plan.smoke.spec, plan.smoke.layout
    m = smoke.model
    assert (m.num_layers, m.hidden_size, m.seq_length, m.num_attention_heads, m.num_query_groups) == (2, 256, 256, 4, 2)
    assert m.ffn_hidden_size == 896 and m.vocab_size == 128256 and m.preset is None
    assert (smoke.train.train_iters, smoke.train.lr_warmup_iters, smoke.train.eval_interval) == (30, 3, 30)
    assert smoke.train.deterministic and not s.train.deterministic  # its bitwise resume check needs it on GPUs
    assert smoke.train.global_batch_size == smoke_layout.dp  # smallest valid: micro batch 1 x DP
    assert (smoke_layout.tp, smoke_layout.sequence_parallel) == (2, True)
    assert check_spec(smoke) == [] and resolve_layout(smoke, te_available=True)[0] == smoke_layout


def test_smoke_stage_shrinks_degrees_to_one_node():
    s = spec(model={"preset": "llama3.1-405b", "num_layers": 128, "hidden_size": 16384, "num_attention_heads": 128,
                    "ffn_hidden_size": 53248, "seq_length": 8192, "vocab_size": 128256},
             parallel={"tensor": 8, "pipeline": 8, "context": 2, "sequence_parallel": True},
             train={"global_batch_size": 256}, hardware={"nodes": 16, "gpu": "H200"}, smoke={"nodes": 1})
    smoke, sl = _smoke(s)
    assert (sl.tp, sl.pp, sl.cp, sl.dp, sl.world_size) == (2, 2, 2, 1, 8)  # every parallel kind still exercised
    assert smoke.hardware.nodes == 1 and smoke.parallel.tensor == 2 and smoke.train.global_batch_size == 2


def test_smoke_of_a_64_gpu_job_is_one_node_with_its_own_time_limit():
    """8 nodes x 8 GPUs through Slurm: the smoke stage asks for one node and a time limit from its own
    estimate (start-up, its steps at the predicted step time with margin, the signal grace), not the
    full job's four days; the plan shows both."""
    s = spec(model=LLAMA3_LAYER | {"num_layers": 32}, parallel={"tensor": 4, "pipeline": 4},
             hardware={"nodes": 8, "gpu": "H100"}, train={"global_batch_size": 512},
             launch={"kind": "slurm", "slurm": {"time": "4-00:00:00", "signal_grace_seconds": 300}})
    plan = make_plan(s, te_available=None)
    assert plan.layout.world_size == 64 and s.smoke.nodes is None and s.smoke.time_limit is None
    smoke, sl = plan.smoke.spec, plan.smoke.layout
    assert (smoke.hardware.nodes, smoke.hardware.gpus_per_node, sl.world_size) == (1, 8, 8)
    assert (sl.tp, sl.pp) == (4, 2)  # the layout shrank to the smaller model and world
    # 30 steps + 3 replayed + 4 evaluation steps at a third: 34.3 steps of at least 1 s, twice, after
    # 5 min of start-up is 6.1 min: the 10-minute floor, then the 300 s grace on top.
    limit = plan.smoke.time
    assert (limit.seconds, limit.slurm, limit.source) == (smoketime.FLOOR_S + 300, "00:15:00", "estimate")
    assert smoke.launch.slurm.time == "00:15:00" and smoke.launch.slurm.signal_grace_seconds == 300
    assert plan.full.spec.launch.slurm.time == "4-00:00:00"  # the full stage keeps its own
    d = plan_to_dict(plan)["smoke"]
    assert (d["nodes"], d["gpus"], d["launcher"]) == (1, 8, "slurm")
    assert d["time_limit"]["slurm"] == "00:15:00" and d["time_limit"]["source"] == "estimate"
    assert "5 min start-up + 2 x 34.3 steps x 1 s" in d["time_limit"]["detail"]
    console = Console(width=100, record=True, force_terminal=False)
    console.print(render_plan(ShownPlan(plan), None))
    text = " ".join(console.export_text().split())
    assert "on 1x8 GPUs" in text and "time limit 00:15:00 (its sbatch --time): estimate:" in text


def test_smoke_time_estimate_follows_the_predicted_step_time():
    """A large smoke model is timed at the planner's step time; without a known peak each step gets
    the conservative allowance; the estimate never exceeds launch.slurm.time."""
    big = spec(model=LLAMA3_LAYER | {"num_layers": 32}, hardware={"gpu": "H100"},
               smoke={"hidden_size": 4096, "seq_length": 4096, "num_layers": 8, "global_batch_size": 512,
                      "train_iters": 300, "num_attention_heads": 32})
    plan = make_plan(big, te_available=True)
    sm = plan.smoke
    flops = flops_per_iteration(sm.spec.model, padded_vocab=count_params(sm.spec.model, 128256, sm.layout.tp).padded_vocab,
                                global_batch_size=512)
    model = predict(sm.spec, sm.layout, padded_vocab=count_params(sm.spec.model, 128256, sm.layout.tp).padded_vocab,
                    features=Features(impl=plan.transformer_impl))
    step = model.step_s  # the step-time model's, as the full stage's (budget.assumed_mfu unset)
    assert step > smoketime.MIN_STEP_S and flops / (8 * mfu_peak_flops("H100") * model.mfu) == pytest.approx(step)
    steps = 300 + 3 + 4 / 3
    expected = 60 * math.ceil((smoketime.STARTUP_S + smoketime.SAFETY * steps * step) / 60)
    assert sm.time.seconds == expected > smoketime.FLOOR_S and sm.time.source == "estimate"
    cpu = make_plan(spec(smoke={"gpu": "cpu", "gpus_per_node": 2, "train_iters": 100}), te_available=True).smoke.time
    assert cpu.seconds == 60 * math.ceil((smoketime.STARTUP_S + smoketime.SAFETY * (100 + 3 + 4 / 3) * 10) / 60)
    assert "no known peak" in cpu.detail
    short = make_plan(spec(smoke={"gpu": "cpu", "train_iters": 100},
                           launch={"kind": "slurm", "slurm": {"time": "00:20:00"}}), te_available=True).smoke.time
    assert (short.slurm, short.source) == ("00:20:00", "launch.slurm.time")


def test_explicit_smoke_nodes_and_time_limit_win():
    s = spec(hardware={"nodes": 8, "gpu": "H100"}, parallel={"tensor": 8},
             smoke={"nodes": 2, "time_limit": "45"}, launch={"kind": "slurm"})
    plan = make_plan(s, te_available=None)
    assert plan.smoke.spec.hardware.nodes == 2 and plan.smoke.layout.world_size == 16
    assert (plan.smoke.time.seconds, plan.smoke.time.source) == (45 * 60, "smoke.time_limit")
    assert plan.smoke.spec.launch.slurm.time == "00:45:00"
    days = make_plan(attrs.evolve(s, smoke=attrs.evolve(s.smoke, time_limit="1-2:03")), te_available=None)
    assert days.smoke.spec.launch.slurm.time == "1-02:03:00"  # written back in Slurm's own form


@pytest.mark.parametrize(("value", "said"), [
    ("four hours", "is not a Slurm time limit"), ("0", "is not a Slurm time limit"),
    ("UNLIMITED", "needs a limit"), ("2", "not longer than launch.slurm.signal_grace_seconds = 120"),
])
def test_a_bad_smoke_time_limit_exits_2_naming_the_key(value, said):
    s = spec(smoke={"time_limit": value}, launch={"kind": "slurm"})
    with pytest.raises(SpecError) as exc:
        make_plan(s, te_available=True)
    assert exc.value.exit_code == 2
    found = dict(exc.value.problems)
    assert set(found) == {"smoke.time_limit"} and said in found["smoke.time_limit"], found
    if "grace" in said:  # the grace counts only for a Slurm job that is warned before its limit
        make_plan(attrs.evolve(s, launch=attrs.evolve(s.launch, kind="torchrun")), te_available=True)


def test_smoke_pins_and_its_errors_name_smoke_keys():
    s = spec(smoke={"tensor": 4})
    _, sl = _smoke(s)
    assert sl.tp == 4
    bad = spec(smoke={"tensor": 3, "num_attention_heads": 4})
    with pytest.raises(SpecError) as exc:
        _smoke(bad)
    assert "smoke.tensor" in {p for p, _ in exc.value.problems}
    assert all(msg.startswith("smoke stage: ") for _, msg in exc.value.problems)


def test_smoke_moe_keeps_experts_within_ep():
    s = spec(model={"num_experts": 8}, parallel={"expert": 8})
    smoke, sl = _smoke(s)
    assert smoke.model.num_experts == 4 and sl.ep == 4 and smoke.model.num_experts % sl.ep == 0


def test_smoke_on_cpu_trains_what_the_cpu_backend_runs():
    """smoke.gpu = "cpu" (a cluster without GPUs): data parallel over smoke.gpus_per_node processes,
    fp32, the local layer spec; the full stage keeps its GPUs, layout and precision."""
    s = spec(model={"transformer_impl": "transformer_engine"}, parallel={"tensor": 8, "sequence_parallel": True},
             train={"precision": "bf16", "recompute_granularity": "full", "te_op_fuser": True},
             hardware={"nodes": 2, "gpu": "H200"}, smoke={"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"})
    smoke, sl = _smoke(s)
    assert (sl.tp, sl.pp, sl.cp, sl.ep, sl.dp, sl.world_size, sl.sequence_parallel) == (1, 1, 1, 1, 2, 2, False)
    assert (smoke.hardware.gpu, smoke.hardware.nodes, smoke.hardware.gpus_per_node) == ("cpu", 1, 2)
    assert (smoke.train.precision, smoke.train.recompute_granularity, smoke.train.te_op_fuser,
            smoke.model.transformer_impl) == ("fp32", "none", False, "auto")
    assert check_spec(smoke) == [] and resolve_layout(smoke, te_available=False)[0] == sl
    planned = make_plan(s, te_available=True)
    plan = plan_to_dict(planned)
    assert plan["layout"]["tp"] == 8 and plan["smoke"]["shapes"]["gpu"] == "cpu"
    console = Console(width=100, record=True, force_terminal=False)
    console.print(render_plan(ShownPlan(planned), None))
    text = console.export_text()
    assert "on 1x2 CPU processes (fp32): TP 1 PP 1 CP 1 EP 1 DP 2" in " ".join(text.split())
    pinned = spec(hardware={"gpu": "H200"}, smoke={"gpu": "cpu", "tensor": 2, "pipeline": 2})
    with pytest.raises(SpecError) as exc:
        _smoke(pinned)
    found = dict(exc.value.problems)
    assert {"smoke.tensor", "smoke.pipeline"} <= set(found) and 'smoke.gpu = "cpu"' in found["smoke.tensor"]


# --- the plan as a whole -----------------------------------------------------------------------------


def test_plan_dict_is_json_ready_deterministic_and_complete():
    s = spec(model=LLAMA3_LAYER | {"num_layers": 8}, hardware={"gpu": "H200"}, budget={"max_gpu_hours": 10.0})
    d1 = plan_to_dict(make_plan(s, te_available=False))
    d2 = plan_to_dict(make_plan(s, te_available=False))
    assert d1 == d2 and digest(d1) == digest(d2)
    json.dumps(d1, allow_nan=False)
    assert set(d1["layout"]) >= {"tp", "pp", "cp", "ep", "dp", "world_size", "vpp", "sequence_parallel"}
    for key in ("params", "memory_per_gpu_bytes", "flops_per_step", "flops_per_token", "tokens_per_step",
                "step_time_s", "wall_time_h", "gpu_hours", "cost", "warnings", "recommendations", "smoke"):
        assert key in d1
    assert d1["memory_per_gpu_bytes"] == sum(d1["memory"]["breakdown"].values())
    assert set(d1["smoke"]) == {"layout", "shapes", "memory_per_gpu_bytes", "nodes", "gpus", "launcher", "time_limit"}
    assert d1["smoke"]["shapes"]["num_layers"] == 2
    assert set(d1["smoke"]["time_limit"]) == {"slurm", "seconds", "source", "detail"}
    assert d1["params"]["total"] == count_params(s.model, 128256).total
    assert d1["tokens_per_step"] == 64 * 4096
    assert Layout(**{k: v for k, v in d1["layout"].items()}).job_dict() == \
        {k: d1["layout"][k] for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "world_size", "sequence_parallel")}


def test_vocab_size_unknown_is_an_error_not_a_guess():
    s = spec(data={"tokenizer": {"kind": "huggingface", "path": "tok.json"}}, drop=[("model", "vocab_size")])
    with pytest.raises(SpecError) as exc:
        make_plan(s)
    assert exc.value.problems[0][0] == "model.vocab_size"
    assert make_plan(s, vocab_size=50000, te_available=True).vocab_size == 50000


def test_render_plan_fits_100_columns():
    s = spec(model=LLAMA3_LAYER | {"num_layers": 32, "seq_length": 8192}, train={"global_batch_size": 512},
             hardware={"gpu": "H100"}, budget={"max_gpu_hours": 1.0, "gpu_hour_price": 2.5})
    console = Console(width=100, record=True, force_terminal=False)
    console.print(render_plan(ShownPlan(make_plan(s, te_available=True)), "3f9c0a12b4de"))
    text = console.export_text()
    assert all(len(line) <= 100 for line in text.splitlines())
    for needle in ("run 3f9c0a12b4de", "Parallel layout", "Memory per GPU", "does not fit", "fix: parallel.tensor = 2",
                   "over budget: needs --yes", "Smoke stage:", "Warnings"):
        assert needle in text, needle


# Peaks measured on H200 by `mcx run` (docs/benchmarks.md, 2026-11-30): smoke stage, then full stage.
REPO = Path(__file__).resolve().parents[1]
H200_PEAKS = {"h200_1gpu.toml": (1722171392, 65997631488), "h200_2gpu.toml": (1115399680, 117957791744)}


@pytest.mark.parametrize("name", sorted(H200_PEAKS))
def test_smoke_measurement_predicts_the_full_stage_peak_measured_on_h200(name):
    """The smoke stage's check: the planner's full-model estimate corrected by its error on the
    smoke model. On the two H200 specs it predicted the measured full-stage peaks within 0.1%."""
    from mcx.contract.result import StageResult
    from mcx.ops.stage import memory_prediction as _memory_prediction

    smoke_peak, full_peak = H200_PEAKS[name]
    # Measured before the fused cross entropy existed (d003192): planned as it ran.
    plan = make_plan(load_spec(REPO / "experiments" / name, ["train.cross_entropy_fusion=false"]), te_available=True)
    check = _memory_prediction(plan, StageResult.from_json({"final": {"mem_peak_bytes": smoke_peak},
                                                            "details": {"device": "cuda"}}))
    assert check.passed and check.predicted_full_bytes is not None, check
    assert abs(check.predicted_full_bytes / full_peak - 1) < 0.001, check
    assert abs(plan.memory.total / full_peak - 1) < 0.10  # the planner alone: within 10%
    # As the smoke stage's control checks record it (result.json, the run record)
    assert list(check.to_dict()) == ["passed", "measured_smoke_bytes", "planned_smoke_bytes", "planned_full_bytes",
                                     "predicted_full_bytes", "capacity_bytes", "detail"]
    assert check.to_dict()["measured_smoke_bytes"] == smoke_peak
    cpu = _memory_prediction(plan, StageResult.from_json({"final": {"mem_peak_bytes": smoke_peak},
                                                                "details": {"device": "cpu"}}))
    assert cpu.to_dict() == {"passed": True, "detail": "not comparable on this device (CPU memory is not GPU memory)"}


def test_expandable_segments_keeps_the_other_allocator_settings():
    """``train.expandable_segments``: what the worker writes into PYTORCH_CUDA_ALLOC_CONF."""
    from mcx.plan.memory import with_expandable_segments

    assert with_expandable_segments(None) == "expandable_segments:True"
    assert with_expandable_segments("max_split_size_mb:128") == "max_split_size_mb:128,expandable_segments:True"
    assert with_expandable_segments("expandable_segments:False, garbage_collection_threshold:0.6") == \
        "garbage_collection_threshold:0.6,expandable_segments:True"


def test_the_job_file_carries_the_planners_layout_and_reads_it_back():
    """One Layout: the job file's layout section is the planner's Layout's degrees (the contract's
    eight keys, as before), and the worker reads back the very Layout the planner chose, its nodes,
    GPUs per node and distributed optimizer taken from the stage's spec."""
    from attrs import evolve

    from mcx.plan.layout import JOB_FIELDS
    from mcx.contract.job import DEGREE_KEYS, Job, job_from_dict, job_to_dict

    for name, vocab in (("llama3_70b.toml", 128256), ("mixtral_8x7b.toml", 32000), ("tiny.toml", 512)):
        spec = load_spec(REPO / "experiments" / name)
        plan = make_plan(spec, te_available=True, vocab_size=vocab)
        for stage in ("full", "smoke"):
            sspec, slayout = plan.stage(stage).spec, plan.stage(stage).layout
            job = Job(run_id="0123456789ab", stage=stage, spec=sspec, layout=slayout, data_dir="/d",
                      checkpoint_dir="/c", device="cuda")
            data = json.loads(json.dumps(job_to_dict(job)))
            assert sorted(data["layout"]) == sorted(JOB_FIELDS)
            assert not set(DEGREE_KEYS) & set(data["spec"]["parallel"])  # each degree once: in the layout
            degrees = {key: getattr(slayout, field) for key, field in DEGREE_KEYS.items()}
            assert job_from_dict(data) == evolve(job, spec=evolve(sspec, parallel=evolve(sspec.parallel, **degrees))), \
                (name, stage)
    with pytest.raises(SpecError, match="layout.nodes"):
        job_from_dict({**data, "layout": {**data["layout"], "nodes": 2}})
    # a job file of an older control plane wrote the degrees in the spec too: they must agree
    parallel = data["spec"]["parallel"]
    assert job_from_dict({**data, "spec": {**data["spec"], "parallel": {**parallel, "tensor": data["layout"]["tp"]}}})
    with pytest.raises(SpecError, match=r"spec.parallel.tensor: 3 disagrees with layout.tp"):
        job_from_dict({**data, "spec": {**data["spec"], "parallel": {**parallel, "tensor": 3}}})
