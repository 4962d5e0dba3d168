"""Downstream evaluation (D68) with the real lm-evaluation-harness on CPU: the quickstart's held-out next-line
task (evals/quickstart_next_line) run on a tiny quickstart run after its full stage, read back from its cache,
recomputed from scratch to the same scores, run on a Hugging Face model directory, shown beside another run's
and gated by a baseline; its checkpoint at step 10 evaluated too ([eval] every, D71) and the scores listed by `mcx ls
--columns`. One trained and evaluated run is shared by the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import E2E_ROOT, make_e2e_project, mcx_inprocess

pytestmark = pytest.mark.slow

TASK = "mcx_quickstart_next_line"
ACC = f"eval/{TASK}/acc"
# The quickstart spec, 20 steps, evaluated on 24 items after its full stage and at step 10 (every); its [sweep] (the sweep test's) tries
# 3 and 20 steps, the two runs the module trains, so the sweep finds both finished. Written and committed before
# any run: the project's files are part of every run ID.
SPEC = {"extends": "tiny.toml", "name": "evaluated",
        "train": {"train_iters": 20, "lr_warmup_iters": 2, "eval_interval": 10, "eval_iters": 1},
        "smoke": {"enabled": False},
        "eval": {"tasks": ["evals/quickstart_next_line"], "limit": 24, "every": 10},
        "sweep": {"method": "grid", "objective": ACC, "parameters": {"train.train_iters": [3, 20]}}}


@pytest.fixture(scope="module")
def project(tmp_path_factory, e2e_clean_env) -> Path:
    import subprocess

    import tomli_w

    root = make_e2e_project(tmp_path_factory.mktemp("eval"))
    shutil.copytree(E2E_ROOT / "evals", root / "evals", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "experiments" / "evaluated.toml").write_text(tomli_w.dumps(SPEC))
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "evaluated"], cwd=root, check=True)
    return root


@pytest.fixture(scope="module")
def trained(project):
    """Trained, exported and evaluated by one `mcx run` (the spec's base point: 20 steps)."""
    run = mcx_inprocess(project, "run", "experiments/evaluated.toml", "--json")
    assert run.code == 0, run
    return run.json()


@pytest.fixture(scope="module")
def worse(project, trained):
    """Three steps, gated against the 20-step run with no tolerance on the next-line accuracy."""
    run = mcx_inprocess(project, "run", "experiments/evaluated.toml", "--set", "train.train_iters=3", "--set",
                        f'baseline.run="{trained["run_id"]}"', "--set", f'baseline.tolerances={{"{ACC}" = 0.0}}',
                        "--json")
    assert run.code in (0, 1), run
    return run.json()


def test_the_run_is_evaluated_after_its_full_stage_and_its_id_does_not_change(project, trained):
    final = trained["final"]
    assert 0.0 <= final[ACC] <= 1.0 and final[ACC + "_stderr"] > 0
    assert f"eval/{TASK}/acc_norm" in final and "eval/" + TASK + "/sample_len" not in final
    recorded = json.loads((Path(trained["run_dir"]) / "eval.json").read_text())
    assert recorded["tasks"][TASK]["samples"] == 24 and recorded["model"] == {"run": trained["run_id"]}
    # [eval] is not part of the run ID: the spec without it plans to the same run
    plain = mcx_inprocess(project, "plan", "experiments/evaluated.toml", "--set", "eval.tasks=[]", "--json")
    assert plain.json()["run_id"] == trained["run_id"]
    from mcx.track.mlflow_store import MlflowStore
    from mcx.track.target import resolve_target

    metrics = MlflowStore(resolve_target(project, None)).find_parent_run(trained["run_id"]).data.metrics
    assert metrics[ACC] == final[ACC] and metrics[ACC + "_stderr"] == final[ACC + "_stderr"]
    shown = mcx_inprocess(project, "show", trained["run_id"])
    assert "evaluation (lm-evaluation-harness" in shown.out and f"{final[ACC]:.4f} ± " in shown.out


def test_every_n_steps_the_checkpoint_is_evaluated_and_recorded_at_its_step(project, trained):
    run_dir, final = Path(trained["run_dir"]), trained["final"]
    steps = json.loads((run_dir / "eval-steps.json").read_text())["steps"]
    assert sorted(steps, key=int) == ["10", "20"]  # 20: the final evaluation's weights, not evaluated twice
    assert steps["20"] == json.loads((run_dir / "eval.json").read_text())
    assert steps["10"]["model"] == {"run": trained["run_id"], "step": "10"} and steps["10"]["key"] != steps["20"]["key"]
    at10 = {s["metric"]: (s["value"], s["stderr"]) for s in steps["10"]["scores"]}
    assert not (run_dir / "eval-hf-steps").exists()  # the checkpoint's export is removed once it is evaluated
    from mcx.track.mlflow_store import MlflowStore
    from mcx.track.target import resolve_target

    store = MlflowStore(resolve_target(project, None))
    parent = store.find_parent_run(trained["run_id"])
    history = sorted((m.step, m.value) for m in store.client.get_metric_history(parent.info.run_id, ACC))
    assert history == [(10, at10["acc"][0]), (20, final[ACC])]
    shown = mcx_inprocess(project, "show", trained["run_id"])
    table = shown.out[shown.out.index("evaluation at checkpoints"):]
    assert f"{TASK}/acc" in table and f"{at10['acc'][0]:.4f} ± {at10['acc'][1]:.4f}" in table
    assert sorted(mcx_inprocess(project, "show", trained["run_id"], "--json").json()["eval_steps"], key=int) == ["10", "20"]
    unsaved = mcx_inprocess(project, "eval", trained["run_id"], "--every", "5")  # step 5 was never kept
    assert unsaved.code == 2 and "--every" in unsaved.err and "no checkpoint of step 5" in unsaved.err, unsaved


def test_ls_columns_lists_scores_and_metrics_and_refuses_an_unknown_one(project, trained):
    run_id, final = trained["run_id"], trained["final"]
    plain = mcx_inprocess(project, "ls")
    assert plain.out.splitlines()[0].split("\t")[-1] == "tracking"  # without --columns: as before
    listed = mcx_inprocess(project, "ls", "--columns", "valid_loss,eval/*")
    assert listed.code == 0, listed
    head, *rows = (line.split("\t") for line in listed.out.splitlines())
    extra = head[head.index("tracking") + 1:]
    assert extra[0] == "valid_loss" and ACC in extra and f"eval/{TASK}/acc_norm" in extra
    assert not any(c.endswith("_stderr") for c in extra)  # a score's standard error is shown in its cell
    row = dict(zip(head[head.index("tracking") + 1:], next(r for r in rows if r[0] == run_id)[head.index("tracking") + 1:]))
    assert row[ACC] == f"{final[ACC]:.4f} ± {final[ACC + '_stderr']:.4f}" and row["valid_loss"] == f"{final['valid_loss']:.4f}"
    got = mcx_inprocess(project, "ls", "--columns", ACC, "--columns", "valid_loss", "--json")
    columns = next(r for r in got.json() if r["run_id"] == run_id)["columns"]
    assert columns == {ACC: {"value": final[ACC], "stderr": final[ACC + "_stderr"]},
                       "valid_loss": {"value": final["valid_loss"], "stderr": None}}
    for bad in ("eval/no_such_task/acc", "eval/x*"):
        refused = mcx_inprocess(project, "ls", "--columns", f"valid_loss,{bad}")
        assert refused.code == 2 and refused.out == "" and bad in refused.err and ACC in refused.err, refused


def test_the_baseline_gate_and_compare_read_the_scores(project, trained, worse):
    base, value = trained["final"][ACC], worse["final"][ACC]
    gate = worse["baseline"]
    entry = gate["metrics"][ACC]
    assert (entry["baseline"], entry["value"], entry["tolerance"]) == (base, value, 0.0)
    assert gate["verdict"] == ("regress" if value < base else "pass")
    assert (ACC in gate["regressed"]) == (value < base) and (worse["exit_code"] != 0) == (value < base)
    both = mcx_inprocess(project, "compare", trained["run_id"], worse["run_id"], "--format", "json")
    scores = json.loads(both.out)["eval"][f"{TASK}/acc"]
    assert scores[trained["run_id"]]["value"] == base and scores[worse["run_id"]]["value"] == value
    noise = scores[worse["run_id"]]["within_noise_of_first"]
    first, second = scores[trained["run_id"]], scores[worse["run_id"]]
    assert noise == (abs(base - value) <= (first["stderr"] ** 2 + second["stderr"] ** 2) ** 0.5)
    table = mcx_inprocess(project, "compare", trained["run_id"], worse["run_id"])
    assert "Evaluation: score ± standard error" in table.out and f"{value:.4f} ± " in table.out


def test_a_sweep_on_an_eval_objective_picks_its_best_trial(project, trained, worse):
    swept = mcx_inprocess(project, "sweep", "experiments/evaluated.toml", "--json")
    assert swept.code == 0, swept
    result = swept.json()
    assert result["direction"] == "maximize"
    best = max((trained, worse), key=lambda r: r["final"][ACC])
    assert result["best"]["value"] == best["final"][ACC]
    assert result["best"]["run_id"] in {r["run_id"] for r in (trained, worse) if r["final"][ACC] == best["final"][ACC]}


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
    assert sorted(cached["steps"], key=int) == ["10", "20"] and cached["steps"]["10"]["cached"] is True
    fresh = mcx_inprocess(project, "eval", run_id, "--fresh", "--every", "0", "--json")  # the final weights only
    assert fresh.code == 0, fresh
    recomputed = fresh.json()
    assert recomputed["cached"] is False and recomputed["key"] == cached["key"] and log.stat().st_mtime_ns != before
    assert "steps" not in recomputed
    assert {(s["task"], s["metric"]): (s["value"], s["stderr"]) for s in recomputed["scores"]} == scores


def test_a_checkpoint_that_fails_its_evaluation_leaves_the_final_scores_standing(project, trained):
    """After the cache tests: step 10's evaluation forgotten and its checkpoint damaged (a byte changed, its size
    kept), `mcx eval` prints the final scores from the cache, names the failed step and exits 1."""
    run_dir = Path(trained["run_dir"])
    steps = json.loads((run_dir / "eval-steps.json").read_text())["steps"]
    shutil.rmtree(project / ".mcx" / "evals" / steps["10"]["key"])
    weights = max((p for p in (run_dir / "full" / "checkpoints" / "iter_0000010").rglob("*") if p.is_file()
                   and p.name not in ("checksums.json", "meta.json")), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    got = mcx_inprocess(project, "eval", trained["run_id"])
    assert got.code == 1 and "checkpoint of step 10 failed" in got.err and "is damaged" in got.err, got
    assert f"{trained['final'][ACC]:.4f} ± " in got.out and "from the cache" in got.err
    assert json.loads((run_dir / "eval-steps.json").read_text())["steps"] == steps  # what was recorded stands


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
                        (["hf:" + str(tmp_path), "--every", "5"], "with no checkpoints"),
                        (["0123456789ab", "--tasks", "x"], "no run 0123456789ab"),
                        (["hf:" + str(E2E_ROOT / "evals"), "--tasks", "no/such/dir"], "config.json")):
        got = mcx_inprocess(project, "eval", *args)
        assert got.code == 2 and words in got.err, got


# float32 carries 24 bits: a log-probability of magnitude L computed through another summation order (HF's
# separate q/k/v and gate/up projections against Megatron-Core's fused ones) differs by a few ulps of each partial
# sum; over this model's 4 layers and the <= 20 scored tokens of a request that is well under 1e-5 relative
# (2^-24 = 6e-8 per rounding). Measured: see D72.
LOGPROB_RTOL = 1e-5


def test_the_megatron_core_interface_scores_as_hflm_on_the_export(project, trained):
    """The harness's model interface over the run's own Megatron-Core model (mcx.eval.megatron_lm) against HFLM
    on the run's export: the same log-likelihood per request (multiple choice, rolling, greedy generation), and
    `mcx eval` through the other interface gives the identical scores under the same key."""
    import math

    import lm_eval
    import torch
    from attrs import evolve
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from mcx.eval.megatron_lm import MegatronLM
    from mcx.ops.evaluate import EvalOverrides, evaluate_run
    from mcx.spec import loads_spec
    from mcx.train.eval_model import load_model, one_process

    run_dir = Path(trained["run_dir"])
    export = run_dir / "eval-hf"  # the hf interface's export; made here when the run was evaluated without one
    if not (export / "config.json").is_file():
        assert mcx_inprocess(project, "export-hf", trained["run_id"], "-o", str(export)).code == 0
    manager = TaskManager(include_path=str(project / "evals" / "quickstart_next_line"), include_defaults=False)
    hf = HFLM(pretrained=str(export), dtype="float32", device="cpu", batch_size=8)
    with one_process("cpu"):
        model, tokenizer, vocab, _ = load_model(run_dir / "full", "cpu")
        mega = MegatronLM(model, tokenizer, vocab_size=vocab, max_length=128, batch_size=8,
                          device=torch.device("cpu"))
        per_request = {}
        for name, lm in (("hf", hf), ("megatron", mega)):
            out = lm_eval.simple_evaluate(model=lm, tasks=[TASK], limit=24, task_manager=manager, log_samples=True)
            per_request[name] = [float(r[0][0]) for s in out["samples"][TASK] for r in s["resps"]]
        a, b = per_request["hf"], per_request["megatron"]
        assert len(a) == len(b) > 24 and all(math.isclose(x, y, rel_tol=LOGPROB_RTOL) for x, y in zip(a, b)), \
            max(abs(x - y) / abs(x) for x, y in zip(a, b))
        text = (project / "evals" / "quickstart_next_line" / "test.jsonl").read_text()[:1500]  # > 128 tokens: 2+ windows
        rolling = [Instance("loglikelihood_rolling", {}, (t,), 0) for t in (text, text[:200])]
        assert all(math.isclose(x, y, rel_tol=LOGPROB_RTOL)
                   for x, y in zip(hf.loglikelihood_rolling(rolling), mega.loglikelihood_rolling(rolling)))
        gen = [Instance("generate_until", {}, (t, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}), 0)
               for t in (text[:300], text[:90])]
        assert hf.generate_until(gen) == mega.generate_until(gen)
    # `mcx eval` through the other interface: the same key (it is not part of it) and the identical scores
    spec_eval = loads_spec((run_dir / "spec.toml").read_text(), str(run_dir / "spec.toml")).eval
    other = "hf" if spec_eval.model == "megatron" else "megatron"
    again = evaluate_run(trained["run_id"], project, overrides=EvalOverrides(fresh=True),
                         spec_eval=evolve(spec_eval, model=other))
    recorded = json.loads((run_dir / "eval.json").read_text())
    assert again.evaluation.settings["interface"] == other == recorded["settings"]["interface"]
    assert {s.name: (s.value, s.stderr) for s in again.evaluation.scores} == {
        k: (v, trained["final"][k + "_stderr"]) for k, v in trained["final"].items() if k.startswith(f"eval/{TASK}/")
        and not k.endswith("_stderr")}
    assert again.evaluation.key == recorded["key"]
