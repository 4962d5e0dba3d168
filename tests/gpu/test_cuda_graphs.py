"""`train.cuda_graphs` on one GPU (issue 41, D75): the step's forward and backward as one CUDA graph.

The layout runs' model (gpuwork.DENSE: 8 layers, hidden 1024, seq 2048, 8 micro-batches of 2, 40 steps, bf16) on
the Transformer Engine spec in deterministic mode, as a smoke-stage job twice at once on the GPU: eager, and with
Megatron-Core's full-iteration graph (3 eager steps, the 4th captured, every later step a replay). What the graph
changes is how the host launches the kernels, never which kernels run: every step's loss, gradient norm and
learning rate, and every evaluation, equal the eager run's bit for bit. The graphed smoke stage's own checks then
hold too: its checkpoint loads back exactly, and the resume check replays the last steps eagerly on a fresh model
against the graphed steps it recorded. The speed is the benchmark's (`suite.sh OUT --only throughput-layout`:
the `graphs` runner), never a test's.
"""

from __future__ import annotations

import pytest

from gpuwork import DENSE, SPEC, TE, Stage, run_together

pytestmark = pytest.mark.gpu

DET = [*DENSE, "train.deterministic=true", TE]


@pytest.fixture(scope="module")
def pair(work):
    eager = Stage(work / "graphs-eager", SPEC, DET, stage="smoke")
    graphed = Stage(work / "graphs-on", SPEC, [*DET, "train.cuda_graphs=true"], stage="smoke")
    run_together([eager, graphed])
    return eager, graphed


def test_a_graphed_smoke_stage_passes_every_check_and_says_it_captured(pair):
    _, g = pair
    g.assert_finished()
    failed = {k: c["detail"] for k, c in g.result["checks"].items() if not c["passed"]}
    assert g.result["passed"] and not failed, failed
    assert g.result["details"]["cuda_graphs"] == "full_iteration", g.result["details"]
    captured = g.log_lines(r"CUDA graph captured: .* over (\d+) micro-batches, in ([\d.]+) s; ([\d.]+) GiB reserved")
    print("captures:", [m.group(0) for m in captured])  # docs/benchmarks.md
    assert len(captured) == 1 and captured[0].group(1) == "8", g.tail()  # the resume check's 3 steps stay eager


def test_graphed_steps_equal_eager_steps_bit_for_bit(pair):
    e, g = pair
    e.assert_finished()
    g.assert_finished()
    assert e.result["details"]["cuda_graphs"] == "off"
    curve_e, curve_g = e.curve(), g.curve()
    assert len(curve_g["train"]) == 40 and curve_g["valid"] and curve_g["test"]
    first = next((a, b) for a, b in zip(curve_e["train"], curve_g["train"]) if a != b) \
        if curve_e["train"] != curve_g["train"] else None
    assert first is None, f"first differing step (eager, graphed): {first}"
    assert curve_e == curve_g
