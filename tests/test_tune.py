"""`mcx tune`: a real micro-batch sweep on the CPU worker writes the best setting into a new spec."""

from __future__ import annotations

import tomllib

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
