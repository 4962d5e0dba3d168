"""mcx's CUDA worker on one GPU: training, checkpoints, determinism, faults, asynchronous saves, FP8.

The model is the layout runs' small LLaMA-style model (gpu_validation.DENSE: 8 layers, hidden 1024,
seq 2048, global batch 16, 40 steps, bf16; docs/benchmarks.md "Two-GPU layouts against one-GPU
references"), as a smoke-stage job (loss falling, checkpoint round trip, bitwise resume) or a full-stage
job. Jobs whose timing is not measured share the GPU (``run_together``); deterministic jobs give the
same bits either way, which the reruns check.
"""

from __future__ import annotations

import json
import os
import signal
import statistics

import pytest

from gpuwork import DENSE, LOCAL, SPEC, TE, Stage, run_together, tail_mean

pytestmark = pytest.mark.gpu

SMOKE_CHECKS = {"loss_finite", "loss_falling", "checkpoint_roundtrip", "resume_bitwise", "throughput"}
DET = [*DENSE, "train.deterministic=true"]
IMPLS = {"local": LOCAL, "te": TE}
LAYER_SPEC = {"local": "local", "te": "transformer_engine"}
# The last-10-step mean loss of this model on one H200, deterministic, Transformer Engine spec (2026-11-30,
# docs/results/gpu_layouts_te_2xh200.json: 5.9518; local spec 5.9625), and the layouts' tolerance around it (2%).
DENSE_LAST10, DENSE_BAND = 5.9518, 0.02


@pytest.fixture(scope="module")
def smoke(work):
    """Each layer spec's smoke-stage job, deterministic, run twice: four workers at once on the GPU."""
    runs = {(impl, rep): Stage(work / f"smoke-{impl}-{rep}", SPEC, [*DET, flag], stage="smoke")
            for impl, flag in IMPLS.items() for rep in "ab"}
    run_together(list(runs.values()))
    return runs


@pytest.mark.parametrize("impl", IMPLS)
def test_smoke_stage_trains_and_passes_every_check(smoke, impl):
    """The loss falls, the checkpoint saved at step 20 loads back exactly (checkpoint_roundtrip: every
    tensor equal) and the resumed last 3 steps equal the uninterrupted ones bit for bit (resume_bitwise)."""
    s = smoke[impl, "a"]
    s.assert_finished()
    result = s.result
    assert result["passed"] and set(result["checks"]) == SMOKE_CHECKS, result["checks"]
    failed = {k: c["detail"] for k, c in result["checks"].items() if not c["passed"]}
    assert not failed, failed
    assert result["layer_spec"] == LAYER_SPEC[impl] and s.job["device"] == "cuda"
    steps = [r["step"] for r in s.records()]
    assert steps == list(range(1, 41)), steps
    losses = s.losses()
    assert tail_mean(losses) < losses[0] - 2, losses  # 8.63 -> 5.95 on one H200 (docs/benchmarks.md, GPU suite)
    mean = tail_mean(losses)
    assert abs(mean - DENSE_LAST10) / DENSE_LAST10 <= DENSE_BAND, (mean, DENSE_LAST10)
    assert all(r["mfu"] is not None and r["mfu"] > 0 and r["mem_peak_bytes"] > 0 for r in s.records())


@pytest.mark.parametrize("impl", IMPLS)
def test_deterministic_rerun_is_bitwise(smoke, impl):
    a, b = smoke[impl, "a"], smoke[impl, "b"]
    a.assert_finished()
    b.assert_finished()
    assert len(a.curve()["train"]) == 40 and a.curve()["valid"]
    assert a.curve() == b.curve()


# -- faults: SIGKILL after a checkpoint, SIGTERM mid-run; each resumed against an uninterrupted run ----------

# The H200 runs of 2026-11-30 (gpu_validation.py faults): Transformer Engine spec, deterministic,
# asynchronous saves every 10 steps; SIGKILL at step 25 (5/8 of 40), SIGTERM at step 13 (1/3).
FAULT = [*DET, TE, "checkpoint.interval=10", "checkpoint.async_save=true"]
KILL_AT, TERM_AT = 25, 13


@pytest.fixture(scope="module")
def faults(work):
    ref = Stage(work / "faults-uninterrupted", SPEC, FAULT)
    killed = Stage(work / "faults-sigkill", SPEC, FAULT)
    termed = Stage(work / "faults-sigterm", SPEC, FAULT)
    for s in (ref, killed, termed):
        s.start()
    first = {}
    termed.wait_for_step(TERM_AT)
    termed.proc.send_signal(signal.SIGTERM)  # as a launcher forwards it: to the worker, not its helpers
    killed.wait_for_step(KILL_AT)
    os.killpg(killed.proc.pid, signal.SIGKILL)  # the worker and its checkpoint writer
    for name, s in (("sigkill", killed), ("sigterm", termed)):
        s.wait(300)
        latest = s.dir / "checkpoints" / "latest"
        first[name] = {"rc": s.rc, "status": s.result.get("status"), "steps": len(s.records()),
                       "latest": latest.read_text().strip() if latest.is_file() else None}
    ref.wait()
    run_together([killed, termed])  # the same job again: resumes from `latest`
    return {"reference": ref, "sigkill": killed, "sigterm": termed, "first": first}


def test_sigkill_after_a_checkpoint_resumes_bitwise(faults):
    ref, s, first = faults["reference"], faults["sigkill"], faults["first"]["sigkill"]
    ref.assert_finished()
    assert first["rc"] == -signal.SIGKILL and first["status"] is None, first
    assert first["latest"] in ("iter_0000010", "iter_0000020"), first  # the last committed save before step 25
    s.assert_finished()
    assert len(ref.curve()["train"]) == 40
    assert s.curve() == ref.curve()
    resumed = s.log_lines(r"resumed from (iter_\d+)")
    assert resumed and resumed[-1][1] == first["latest"], [m.string for m in resumed]


def test_sigterm_saves_within_the_grace_and_resumes_bitwise(faults):
    """On an H200 (2026-11-30): SIGTERM at step 13 saved iter_0000014 and exited 0 as "preempted" 21.9 s after it."""
    ref, s, first = faults["reference"], faults["sigterm"], faults["first"]["sigterm"]
    assert first["rc"] == 0 and first["status"] == "preempted", (first, s.tail())
    step = int(first["latest"].removeprefix("iter_"))
    assert TERM_AT <= step < 40, first
    s.assert_finished()
    assert s.curve() == ref.curve()


# -- asynchronous saves: the pause a save costs training ---------------------------------------------------

# docs/benchmarks.md, "Asynchronous checkpoint saves", calls C-E (ckpt-stall --spec dense --steps 121 --every 40, Transformer
# Engine spec): every asynchronous save paused training 0.07-0.09 s, the first included; the target of
# issue 7 is a tenth of a synchronous save, which took 2.0-2.3 s there (median): 0.2 s.
PAUSE_BOUND_S = 0.2
STALL = [*DENSE, TE, "train.train_iters=81", "train.lr_warmup_iters=16", "train.eval_interval=81",
         "checkpoint.interval=40", "checkpoint.keep=1", "checkpoint.final=false", "checkpoint.async_save=true"]


def test_asynchronous_save_pauses_training_under_the_documented_bound(work):
    s = Stage(work / "async-pause", SPEC, STALL).run()  # alone on the GPU: a timing
    s.assert_finished()
    pauses = [(int(m[1]), float(m[2]), m[3]) for m in s.log_lines(r"checkpoint save (\d+) paused training ([\d.]+) s: (.*)")]
    writer = [m.group(0) for m in s.log_lines(r"checkpoint save \d+ in the writer: .*")]
    assert [n for n, _, _ in pauses] == [1, 2], (pauses, writer)
    assert all("copy to host" in phases for _, _, phases in pauses), pauses
    assert all(p < PAUSE_BOUND_S for _, p, _ in pauses), (pauses, writer)
    assert len(writer) == 2, writer  # each save was written (and timed) in the writer process
    assert (s.dir / "checkpoints" / "latest").read_text().strip() == "iter_0000080"


# -- FP8 against bf16 ------------------------------------------------------------------------------------

# docs/benchmarks.md "FP8 against bf16 over 300 steps": the one-H200 spec on Transformer Engine, global batch 2,
# 300 steps (warm-up 30, validation every 100). At this batch a run's curve depends on its seed as much as on
# its precision: a second seed moves bf16's own mean loss over steps 150-300 by 1.7%, and FP8's gap to bf16 at
# the same seed is -2.2% at one seed and +2.9% at another (one H100, 2026-12-05). So one pair of runs cannot
# hold FP8 to 2% (the band this test held until then, and missed by 3.5-4.9%). FP8 is held instead to no bias:
# both precisions at two seeds, the signed gaps' mean within BIAS_BAND and each seed's within SEED_BAND.
FP8_COMMON = ["train.train_iters=300", "train.global_batch_size=2", "train.micro_batch_size=2",
              "train.lr_warmup_iters=30", "train.eval_interval=100", "checkpoint.final=false", TE]
STEPS, LATE, SEEDS, BIAS_BAND, SEED_BAND = 300, 150, (1234, 4321), 0.015, 0.04


def test_fp8_trains_and_its_loss_has_no_bias_against_bf16(work):
    spec, gaps, valid_gaps = "experiments/h200_1gpu.toml", [], []
    for seed in SEEDS:
        runs = {p: Stage(work / f"fp8-{p}-{seed}", spec, [*FP8_COMMON, f'train.precision="{p}"', f"train.seed={seed}"]).run(300)
                for p in ("bf16", "fp8-hybrid")}
        for r in runs.values():
            r.assert_finished()
        a, b = runs["bf16"].losses(), runs["fp8-hybrid"].losses()
        assert len(a) == len(b) == STEPS, (len(a), len(b), runs["fp8-hybrid"].tail())
        assert tail_mean(b, 20) < b[0] - 3, b  # FP8 trains: 12.6 -> about 3.6 by step 300
        gaps.append(statistics.fmean(b[LATE:]) / statistics.fmean(a[LATE:]) - 1)
        va, vb = ({r["step"]: r["loss"] for r in runs[p].records("valid")} for p in ("bf16", "fp8-hybrid"))
        assert {100, 200, 300} <= set(va) & set(vb), (va, vb)
        valid_gaps.append(statistics.fmean(vb[k] / va[k] - 1 for k in (200, 300)))
    assert all(abs(g) <= SEED_BAND for g in gaps), gaps
    assert abs(statistics.fmean(gaps)) <= BIAS_BAND, gaps
    assert abs(statistics.fmean(valid_gaps)) <= BIAS_BAND, valid_gaps
    fp8 = runs["fp8-hybrid"]
    built = [json.loads(m[1]) for m in fp8.log_lines(r"built: (\{.*)")]
    assert built and built[-1]["precision"] == "fp8-hybrid" and built[-1]["layer_spec"] == "transformer_engine", built
