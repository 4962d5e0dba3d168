"""`mcx tune`: a real micro-batch sweep on the CPU worker writes the best setting into a new spec."""

from __future__ import annotations

import tomllib
from pathlib import Path

from conftest import make_e2e_project, mcx_inprocess

from mcx.spec import load_spec

SMALL = ["--set", "model.num_layers=2", "--set", "model.hidden_size=64", "--set", "model.ffn_hidden_size=192",
         "--set", "model.seq_length=64", "--set", "model.max_position_embeddings=64"]


def test_tune_sweeps_micro_batch_and_writes_a_spec(tmp_path, e2e_clean_env):
    project = make_e2e_project(tmp_path / "proj")
    out = tmp_path / "tuned.toml"
    res = mcx_inprocess(project, "tune", str(project / "experiments" / "tiny.toml"), *SMALL, "--steps", "2",
                        "--max-micro-batch", "2", "-o", str(out), "--json")
    assert res.code == 0, res
    doc = res.json()
    assert [t["micro_batch_size"] for t in doc["trials"]] == [1, 2]
    assert all(t["fits"] and t["tokens_per_s_per_gpu"] > 0 and t["mem_peak_bytes"] > 0 for t in doc["trials"])
    best = max(doc["trials"], key=lambda t: t["tokens_per_s_per_gpu"])
    assert doc["best"]["micro_batch_size"] == best["micro_batch_size"]
    text = out.read_text()
    assert tomllib.loads(text)["train"]["micro_batch_size"] == best["micro_batch_size"]
    assert load_spec(out).train.micro_batch_size == best["micro_batch_size"]  # extends resolves


def test_tune_rejects_bad_arguments(tmp_path, e2e_clean_env):
    project = make_e2e_project(tmp_path / "proj")
    res = mcx_inprocess(project, "tune", str(project / "experiments" / "tiny.toml"), "--steps", "1")
    assert res.code == 2 and "--steps" in res.err and "Traceback" not in res.err


def _h200_project(tmp_path):
    """A user's project holding the one-H200 spec: (project, spec path)."""
    project = make_e2e_project(tmp_path / "proj")
    spec = project / "experiments" / "h200_1gpu.toml"
    spec.write_text((Path(__file__).resolve().parents[1] / "experiments" / "h200_1gpu.toml").read_text())
    return project, spec


def test_tune_retries_a_fragmented_out_of_memory_with_expandable_segments(tmp_path, monkeypatch, e2e_clean_env):
    """The sweep's rule for the allocator's fragments, which only a GPU produces: the trials are
    replaced by what an H200 reported on 2026-11-30 (bf16, one-H200 spec: micro-batch 8 ran out of
    memory with 10.7 GiB reserved but unallocated, and fitted with expandable segments; 16 did not fit
    at all). The real trials run on CPU in the test above."""
    from mcx.ops import tune as tune_mod
    from mcx.ops.progress import quiet
    from mcx.report.tune_results import Measured, MicroBatchTrial, Trial

    gib = 2**30
    speed = {1: 30_000.0, 2: 35_000.0, 4: 38_500.0, 8: 38_950.0}
    calls = []

    def h200_trial(spec, mbs, steps, project, work):
        on = spec.train.expandable_segments
        calls.append((mbs, on))
        if mbs == 16 or (mbs == 8 and not on):
            facts = {"device": "cuda", "message": "CUDA out of memory.", "capacity_bytes": int(139.8 * gib),
                     "allocated_bytes": int(105.1 * gib), "expandable_segments": on,
                     "reserved_bytes": int((115.8 if mbs == 8 else 136.0) * gib)}
            return MicroBatchTrial(micro_batch_size=mbs, trial=Trial(expandable_segments=on, measured=None,
                                                                     out_of_memory=facts))
        measured = Measured(tokens_per_s_per_gpu=speed[mbs], mfu=0.56, mem_peak_bytes=int(mbs * 15 * gib), step_time_s=1.0)
        return MicroBatchTrial(micro_batch_size=mbs, trial=Trial(expandable_segments=on, measured=measured))

    monkeypatch.setattr(tune_mod, "_trial", h200_trial)
    monkeypatch.setattr(tune_mod, "check_trials_can_run", lambda spec, pr: None)  # an H200 machine, as recorded
    project, spec = _h200_project(tmp_path)
    out = tmp_path / "tuned.toml"
    res = tune_mod.tune(str(spec), ['model.transformer_impl="transformer_engine"'], project=project, out=str(out),
                        max_mbs=16, steps=3, progress=quiet)
    # 16 ran out with the setting already on (facts say so): no second retry, the sweep stops.
    assert calls == [(1, False), (2, False), (4, False), (8, False), (8, True), (16, True)]
    assert res.best.micro_batch_size == 8 and res.best.trial.expandable_segments is True
    # --json: the trials in the order run, the one that ran out of fragments beside its retry
    doc = res.to_dict()
    assert [(t["micro_batch_size"], t["fits"], t["expandable_segments"]) for t in doc["trials"]] == [
        (1, True, False), (2, True, False), (4, True, False), (8, False, False), (8, True, True), (16, False, True)]
    assert doc["trials"][3]["reason"] == "out of memory" and doc["trials"][3]["out_of_memory"]["reserved_bytes"] > 0
    assert doc["best"] == {"micro_batch_size": 8, "fits": True, "expandable_segments": True,
                           "tokens_per_s_per_gpu": 38_950.0, "mfu": 0.56, "mem_peak_bytes": 8 * 15 * gib, "step_time_s": 1.0}
    tuned = load_spec(out)
    assert tuned.train.micro_batch_size == 8 and tuned.train.expandable_segments is True
    assert "expandable_segments = true" in out.read_text()


def test_tune_layouts_measures_the_top_layouts_and_writes_the_fastest(tmp_path, monkeypatch, e2e_clean_env):
    """`mcx tune --layouts`' measured path, which only a GPU reaches: the trials are replaced by what one H100 measured
    on 2026-12-05 (docs/results/2026-12-05-h100/tune_layouts_1gpu.json, the one-H200 spec with hardware.gpu = "H100":
    the model's pick, micro-batch 2, measured fastest). The typed result's --json is the file the GPU run wrote."""
    import json

    from mcx.ops import tune_layouts as layouts_mod
    from mcx.ops.progress import quiet
    from mcx.report.tune_results import MEASURED_KEYS, Measured, Trial

    recorded = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results" / "2026-12-05-h100"
                           / "tune_layouts_1gpu.json").read_text())
    by_rank = {t["rank"]: t for t in recorded["trials"]}
    labels = []

    def h100_trial(spec, steps, project, stage_path, label):
        labels.append(label)
        t = by_rank[int(label.removeprefix("layout "))]
        return Trial(expandable_segments=spec.train.expandable_segments,
                     measured=Measured(**{k: t[k] for k in MEASURED_KEYS}))

    monkeypatch.setattr(layouts_mod, "measure_trial", h100_trial)
    monkeypatch.setattr(layouts_mod, "_where_trials_run", lambda spec, planned: None)  # an H100 machine, as recorded
    project, spec = _h200_project(tmp_path)
    out = tmp_path / "tuned.toml"
    res = layouts_mod.tune_layouts(str(spec), ['model.transformer_impl="transformer_engine"', 'hardware.gpu="H100"'],
                                   project=project, out=str(out), top=2, show=3, steps=4, measure=True, progress=quiet)
    assert labels == ["layout 1", "layout 2"] and res.measured_here and res.best is not None
    doc = res.to_dict()
    assert set(doc) == {"spec", "considered", "too_big", "fitting", "capacity_bytes", "ranking", "current", "trials",
                        "best", "measured_here", "trials_gpu_hours"}
    for key in ("trials", "best", "current"):  # the GPU run's file, keys alike; its settings and figures
        assert _keys(doc[key]) == _keys(recorded[key]), key
    assert doc["best"]["settings"] == recorded["best"]["settings"]
    assert doc["best"]["measured"] == recorded["best"]["measured"] and doc["best"]["rank"] == 1
    assert [(t["rank"], t["tokens_per_s_per_gpu"]) for t in doc["trials"]] == [(1, 37581.77252951267), (2, 35954.96685553575)]
    assert load_spec(out).train.micro_batch_size == 2 and "layout 1 of the model's ranking measured 37,582" in out.read_text()


def _keys(doc):
    """The nested keys of a JSON document, values left out."""
    if isinstance(doc, dict):
        return {k: _keys(v) for k, v in doc.items()}
    return [_keys(v) for v in doc] if isinstance(doc, list) else None
