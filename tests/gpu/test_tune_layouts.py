"""`mcx tune --layouts` on one GPU (H200 or H100): the step-time model's top layouts of the one-H200 spec measured with short
trials, the fastest written into a new spec, each trial beside its prediction.

The bound: the model is calibrated within 10% of this spec's measured steps (docs/steptime.md); its pick is
within 2% of the fastest measured micro-batch (`mcx tune` on 2026-11-30, benchmarks/calibration/, tests/test_steptime.py).
"""

from __future__ import annotations

import json
import shutil

import pytest

from gpuwork import ROOT, gpu_set, make_project, mcx

pytestmark = pytest.mark.gpu


def test_tune_layouts_measures_the_models_top_picks(work, out_dir):
    project = make_project(work / "tune-layouts")
    shutil.copyfile(ROOT / "experiments" / "h200_1gpu.toml", project / "experiments" / "h200_1gpu.toml")
    res = mcx(project, "tune", "--layouts", "experiments/h200_1gpu.toml", "--set",
              'model.transformer_impl="transformer_engine"', *gpu_set(), "--top", "2", "--steps", "4", "-o", "tuned.toml",
              "--json", timeout=1200)
    assert res.code == 0, res
    doc = res.json()
    if out_dir is not None:  # the trials beside their predictions, for docs/benchmarks.md
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "tune-layouts.json").write_text(json.dumps({k: doc[k] for k in ("trials", "best", "current")}, indent=1))
    assert doc["measured_here"] and [t["rank"] for t in doc["trials"]] == [1, 2], doc
    for trial in doc["trials"]:
        if trial["fits"]:
            error = trial["tokens_per_s_per_gpu"] / trial["predicted"]["tokens_per_s_per_gpu"] - 1  # of the step
            assert abs(error) <= 0.10, (trial["rank"], error)
    best = doc["best"]
    assert best["measured"]["tokens_per_s_per_gpu"] == max(t["tokens_per_s_per_gpu"] for t in doc["trials"] if t["fits"])
    from mcx.spec import load_spec

    tuned = load_spec(project / "tuned.toml")
    assert tuned.train.micro_batch_size == best["settings"]["train.micro_batch_size"]
