"""Downstream evaluation (D68) with the real lm-evaluation-harness on CPU: the quickstart's held-out next-line
task (evals/quickstart_next_line) run on a tiny quickstart run after its full stage, read back from its cache,
recomputed from scratch to the same scores, run on a Hugging Face model directory, shown beside another run's
and gated by a baseline. One trained and evaluated run is shared by the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import E2E_ROOT, make_e2e_project, mcx_inprocess

pytestmark = pytest.mark.slow

TASK = "mcx_quickstart_next_line"
ACC = f"eval/{TASK}/acc"
SHORT = ["--skip-smoke", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=10", "--set",
         "train.eval_iters=1"]
EVAL = ["--set", 'eval.tasks=["evals/quickstart_next_line"]', "--set", "eval.limit=24"]


@pytest.fixture(scope="module")
def project(tmp_path_factory, e2e_clean_env) -> Path:
    root = make_e2e_project(tmp_path_factory.mktemp("eval"))
    shutil.copytree(E2E_ROOT / "evals", root / "evals")
    return root


@pytest.fixture(scope="module")
def trained(project):
    """The quickstart spec, 20 steps, with [eval]: trained, exported and evaluated by one `mcx run`."""
    run = mcx_inprocess(project, "run", "experiments/tiny.toml", *SHORT, "--set", "train.train_iters=20", *EVAL,
                        "--json")
    assert run.code == 0, run
    return run.json()


def test_the_run_is_evaluated_after_its_full_stage_and_its_id_does_not_change(project, trained):
    final = trained["final"]
    assert 0.0 <= final[ACC] <= 1.0 and final[ACC + "_stderr"] > 0
    assert f"eval/{TASK}/acc_norm" in final and "eval/" + TASK + "/sample_len" not in final
    recorded = json.loads((Path(trained["run_dir"]) / "eval.json").read_text())
    assert recorded["tasks"][TASK]["samples"] == 24 and recorded["model"] == {"run": trained["run_id"]}
    # [eval] is not part of the run ID: the spec without it plans to the same run
    plain = mcx_inprocess(project, "plan", "experiments/tiny.toml", *SHORT, "--set", "train.train_iters=20", "--json")
    assert plain.json()["run_id"] == trained["run_id"]
    from mcx.track.mlflow_store import MlflowStore
    from mcx.track.target import resolve_target

    metrics = MlflowStore(resolve_target(project, None)).find_parent_run(trained["run_id"]).data.metrics
    assert metrics[ACC] == final[ACC] and metrics[ACC + "_stderr"] == final[ACC + "_stderr"]


def test_a_repeated_evaluation_comes_from_its_cache_and_a_fresh_one_scores_the_same(project, trained):
    run_id = trained["run_id"]
    again = mcx_inprocess(project, "eval", run_id, "--json")
    assert again.code == 0, again
    cached = again.json()
    log = Path(cached["directory"]) / "eval.log"
    assert cached["cached"] is True and "from the cache" in again.err
    before = log.stat().st_mtime_ns  # no harness ran: its log is untouched
    scores = {(s["task"], s["metric"]): (s["value"], s["stderr"]) for s in cached["scores"]}
    assert scores[(TASK, "acc")] == (trained["final"][ACC], trained["final"][ACC + "_stderr"])
    fresh = mcx_inprocess(project, "eval", run_id, "--fresh", "--json")
    assert fresh.code == 0, fresh
    recomputed = fresh.json()
    assert recomputed["cached"] is False and recomputed["key"] == cached["key"] and log.stat().st_mtime_ns != before
    assert {(s["task"], s["metric"]): (s["value"], s["stderr"]) for s in recomputed["scores"]} == scores


def test_a_hugging_face_directory_is_evaluated_and_keyed_by_its_content(project, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model = tmp_path / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
                     ).save_pretrained(model)
    PreTrainedTokenizerFast(tokenizer_file=str(project / "data" / "quickstart" / "tokenizer.json"),
                            eos_token="<|endoftext|>", pad_token="<|pad|>").save_pretrained(model)
    first = mcx_inprocess(project, "eval", f"hf:{model}", "--tasks", "evals/quickstart_next_line", "--limit", "8")
    assert first.code == 0, first
    assert f"hf:{model}: lm-evaluation-harness" in first.out and TASK in first.out and " ± " in first.out
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)  # the same bytes elsewhere: the same evaluation, from the cache
    second = mcx_inprocess(project, "eval", f"hf:{copy}", "--tasks", "evals/quickstart_next_line", "--limit", "8",
                           "--json")
    assert second.json()["cached"] is True
    assert [s["value"] for s in second.json()["scores"]] == [float(x.split()[2]) for x in first.out.splitlines()[1:]]


def test_bad_evaluations_are_refused_with_exit_2(project, tmp_path):
    for args, words in ((["hf:" + str(tmp_path)], "no Hugging Face model directory"),
                        (["0123456789ab", "--tasks", "x"], "no run 0123456789ab"),
                        (["hf:" + str(E2E_ROOT / "evals"), "--tasks", "no/such/dir"], "config.json")):
        got = mcx_inprocess(project, "eval", *args)
        assert got.code == 2 and words in got.err, got
