"""`mcx reproduce --locate` on the GPU (issue 40, D70): a run with non-deterministic kernels against its rerun.

The quickstart MoE model (experiments/tiny_moe.toml: 4 experts, top-2) on the Transformer Engine spec in bf16
with ``train.deterministic = false``: Transformer Engine and PyTorch may then pick kernels that accumulate
with atomics, in an order that changes from launch to launch (the MoE layer's scatter-add of the experts'
outputs back to their tokens; NVTE_ALLOW_NONDETERMINISTIC_ALGO's default for fused attention). Its reproduction
parts from it; the replays over the first differing step name the first operation whose output differs while
its inputs matched, and, everything recorded being equal, a second replay of the original that differs from
the first classifies it as a non-deterministic kernel. CPU kernels are deterministic, so the CPU tests plant
their difference (tests/test_reproduce.py); this is the case users meet. The dense quickstart model
(experiments/tiny.toml) with the same settings reran bitwise on an H100 (2026-12-06): none of its kernels
was non-deterministic at that size, so it cannot serve here.
"""

from __future__ import annotations

import pytest

from gpuwork import gpu_set, make_project, mcx

pytestmark = pytest.mark.gpu

RUN = ["run", "experiments/tiny_moe.toml", "--set", 'train.precision="bf16"', "--set", "train.deterministic=false",
       "--set", "train.train_iters=8", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=4", "--set", "checkpoint.interval=4",
       "--skip-smoke", "--yes", "--json"]  # the smoke stage's resume check is bitwise: not for this run


@pytest.fixture(scope="module")
def project(work):
    return make_project(work / "locate")


def test_a_non_deterministic_run_and_its_rerun_are_located_at_a_non_deterministic_kernel(project):
    res = mcx(project, *RUN, *gpu_set())
    assert res.code == 0, res
    run_id = res.json()["run_id"]
    rep = mcx(project, "reproduce", run_id, "--locate", "--json", timeout=1200)
    assert "Traceback" not in rep.err, rep
    v = rep.json()
    loc = v["locate"]
    print("verdict:", v["verdict"], "| locate:", loc["summary"], "|", loc["kind"], "|", loc["cause"])  # docs/reproduce.md
    assert v["verdict"] != "bitwise", ("the rerun was bitwise equal: no non-deterministic kernel ran; "
                                       f"what ran: {v}")
    assert v["batches"]["same"] is True, v["batches"]  # the same data: the kernels parted, not the batches
    assert loc["differs"] is True and loc["kind"] == "nondeterministic", loc
    first = loc["first"]
    assert first["inputs_identical"] is True and first["phase"] in ("forward", "backward"), first
    assert first["module"] and first["max_abs"] is not None and first["max_abs"] > 0, first
    assert "replayed twice already differs" in loc["cause"], loc["cause"]
