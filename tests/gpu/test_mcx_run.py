"""`mcx run` and `mcx reproduce` of a small spec on the GPU, as a user types them.

The H200 runs of 2026-11-30 (0d48b2b; the benchmark notebook's "Faults and reproduce on the Transformer Engine path",
git show d8cbee0:docs/benchmarks-history.md) ran exactly this:
experiments/tiny.toml on an H200 in bf16, 40 steps; the smoke stage passed its 5 checks, Transformer Engine
was chosen automatically, and the reproduction said "bitwise". The GPU machine has neither MLflow nor DVC,
so the run's tracking records stay in its journal (.mcx/runs/<id>/track/journal.jsonl); the suite leaves the
project (without checkpoints) in its output folder, and `mcx sync` sends the records on the CPU side
afterwards (tests/gpu/test_sync_back.py).
"""

from __future__ import annotations

import importlib.util
import json
import tarfile

import pytest

from gpuwork import ROOT, gpu_set, make_project, mcx, present_gpu

pytestmark = pytest.mark.gpu

RUN = ["run", "experiments/tiny.toml", "--set", 'train.precision="bf16"', "--set", "train.train_iters=40", "--yes",
       "--json"]
SMOKE_CHECKS = {"loss_finite", "loss_falling", "checkpoint_roundtrip", "resume_bitwise", "throughput"}
ARCHIVE = "mcx-run-project.tar.gz"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def project(work):
    return make_project(work / "project")


@pytest.fixture(scope="module")
def run(project):
    res = mcx(project, *RUN, *gpu_set())
    assert res.code == 0, res
    summary = res.json()
    return {"res": res, "summary": summary, "dir": project / ".mcx" / "runs" / summary["run_id"]}


@pytest.fixture(scope="module")
def reproduced(project, run, out_dir):
    res = mcx(project, "reproduce", run["summary"]["run_id"], "--json")
    if out_dir is not None:  # for `mcx sync` on the CPU side, and the suite's summary
        out_dir.mkdir(parents=True, exist_ok=True)
        skip = ("checkpoints", "cache", ".git")
        with tarfile.open(out_dir / ARCHIVE, "w:gz") as tar:
            tar.add(project, arcname="project",
                    filter=lambda ti: None if any(part in skip for part in ti.name.split("/")) else ti)
        (out_dir / "mcx-run.json").write_text(json.dumps(
            {"run": run["summary"], "reproduce": res.json() if res.code == 0 else None,
             "reproduce_stderr": res.err[-3000:]}, indent=1))
    return res


def test_mcx_run_trains_smoke_then_full_on_the_gpu(run):
    s = run["summary"]
    assert s["status"] == "finished" and s["exit_code"] == 0, s
    smoke, full = s["stages"]["smoke"], s["stages"]["full"]
    assert smoke["status"] == "finished" and set(smoke["checks"]) == SMOKE_CHECKS, smoke
    assert all(c["passed"] for c in smoke["checks"].values()), smoke["checks"]
    assert full["status"] == "finished" and full["steps"] == 40, full
    assert smoke["layer_spec"] == full["layer_spec"] == "transformer_engine"  # "auto" where TE is importable
    for stage in ("smoke", "full"):
        assert json.loads((run["dir"] / stage / "job.json").read_text())["device"] == "cuda"
    train = [json.loads(line) for line in (run["dir"] / "full" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in train if r["kind"] == "train"]
    assert len(losses) == 40 and losses[-1] < losses[0] - 1, losses
    assert list((run["dir"] / "full").glob("system*.jsonl")), "no system metrics (NVML / nvidia-smi)"


def test_the_run_records_the_step_time_models_check(project, run):
    """Predicted beside measured after the GPU run (mcx.ops.run._prediction): in the summary, the journal for
    MLflow, and `mcx show`. A 40-step tiny model is launch-bound, far from the model's calibration: no bound on
    its error here (tests/gpu/test_tune_layouts.py bounds it on the one-H200 spec)."""
    check = run["summary"]["step_time"]
    assert check["gpu"] == present_gpu() and check["predicted_s"] > 0 and check["measured_s"] > 0, check
    assert check["error"] == pytest.approx(check["predicted_s"] / check["measured_s"] - 1)
    journal = (run["dir"] / "track" / "journal.jsonl").read_text()
    assert "step_time_model_s" in journal and "mcx.step_time.gpu" in journal
    shown = mcx(project, "show", run["summary"]["run_id"])
    assert shown.code == 0 and f"predicted on {present_gpu()}: the model is" in flat(shown.out), shown
    # The tiny model's step is the host's: the check says what this host took a layer and micro-batch, and the
    # next plan on this GPU model prices its floor with it (mcx.plan.hostfloor, D78).
    assert check["host_layer_s"] > 0, check
    planned = mcx(project, "plan", "experiments/tiny.toml", *gpu_set(), "--json")
    assert planned.code == 0, planned
    floor = planned.json()["host_floor"]
    assert floor["gpu"] == present_gpu() and run["summary"]["run_id"] in floor["runs"], floor


def test_tracking_records_are_journaled_where_mlflow_is_absent(run):
    """The training machine's records wait in the run's journal for `mcx sync` (the H200 runs of 2026-11-30)."""
    from mcx.track.journal import Journal

    journal = Journal(run["dir"] / "track")
    ops = journal.ops()
    assert ops, "the run journaled nothing"
    if importlib.util.find_spec("mlflow") is None:
        err = flat(run["res"].err)
        assert "MLflow is not importable here" in err and "records are spooled: run `mcx sync`" in err, err
        assert journal.acked() == 0 and len(journal.pending()) == len(ops)
    else:  # a GPU machine with the tracking extra records as it goes
        assert journal.pending() == []
    if importlib.util.find_spec("dvc") is None:
        assert "checkpoint not added to DVC: DVC is not importable here" in flat(run["res"].err)


def test_mcx_reproduce_of_the_gpu_run_is_bitwise(run, reproduced):
    assert reproduced.code == 0, reproduced
    v = reproduced.json()
    assert v["run_id"] == run["summary"]["run_id"] and v["status"] == "finished", v
    assert v["verdict"] == "bitwise" and v["first_difference"] is None and v["divergence"] is None, v
    assert v["steps"] == 40 and "train/loss" in v["compared"], v
    assert v["data_identical"] is True and v["hardware_drift"] == [], v
    assert v["batches"]["same"] is True and v["batches"]["steps"] == 40, v["batches"]  # hashed on the host (D69)


def _test_loss(run_dir) -> float:
    lines = (run_dir / "full" / "metrics.jsonl").read_text().splitlines()
    return next(json.loads(x)["loss"] for x in lines if json.loads(x)["kind"] == "test")


@pytest.mark.parametrize("impl", ["transformer_engine", "local"])
def test_a_child_run_starts_from_the_gpu_runs_checkpoint(project, run, impl):
    """[init] from = "run:<id>" on the GPU (docs/lineage.md): the parent's distributed checkpoint loads into
    the child, whose lr 0 keeps it, so the child's test loss (the same first test samples) is the parent's:
    bit for bit with the parent's layer spec (dist_checkpointing), within bf16 rounding of other kernels
    with the local spec (the full tensors, mcx.train.fullstate)."""
    pid = run["summary"]["run_id"]
    res = mcx(project, "run", "experiments/tiny.toml", *gpu_set(), "--set", 'train.precision="bf16"',
              "--set", "train.train_iters=5", "--set", "train.lr=0.0", "--set", "train.min_lr=0.0",
              "--set", "train.lr_warmup_iters=1", "--set", f'model.transformer_impl="{impl}"',
              "--set", f'init.from="run:{pid}"', "--skip-smoke", "--yes", "--json")
    assert res.code == 0, res
    child = project / ".mcx" / "runs" / res.json()["run_id"]
    init = json.loads((child / "fingerprint.json").read_text())["init"]
    assert init["id"]["run_id"] == pid and init["info"]["format"] == "dist", init
    parent_loss, child_loss = _test_loss(run["dir"]), _test_loss(child)
    if impl == "transformer_engine":
        assert child_loss == parent_loss
    else:
        assert abs(child_loss - parent_loss) < 0.01 * parent_loss, (child_loss, parent_loss)


GPU_CHILD = ["--set", 'train.precision="bf16"', "--set", "train.train_iters=5",
             "--set", "train.lr=0.0", "--set", "train.min_lr=0.0", "--set", "train.lr_warmup_iters=1",
             "--skip-smoke", "--yes", "--json"]


def test_the_gpu_run_leaves_as_hugging_face_and_a_run_starts_from_the_export(project, run):
    """`mcx export-hf` reads the GPU run's distributed checkpoint (Transformer Engine spec, bf16) layer by layer
    (mcx.weights.dist); a run from the export (`mcx import-hf`, lr 0) loads it into the Transformer Engine model
    through fullstate.load_full and computes the parent's test loss: the same bf16 weights in the same kernels,
    so any difference beyond 1e-4 relative is a mapping error, not rounding (docs/huggingface.md)."""
    pid = run["summary"]["run_id"]
    made = mcx(project, "export-hf", pid, "-o", "hf/gpu", "--json")
    assert made.code == 0, made
    out = made.json()
    assert (out["architecture"], out["dtype"], out["step"]) == ("LlamaForCausalLM", "bf16", 40), out
    spec = mcx(project, "import-hf", "hf/gpu", "-o", "experiments/from_gpu.toml", "--extends", "experiments/tiny.toml")
    assert spec.code == 0, spec
    child = mcx(project, "run", "experiments/from_gpu.toml", *GPU_CHILD, *gpu_set())
    assert child.code == 0, child
    child_dir = project / ".mcx" / "runs" / child.json()["run_id"]
    init = json.loads((child_dir / "fingerprint.json").read_text())["init"]
    assert init["id"]["kind"] == "hf" and init["info"]["exported_from"]["run_id"] == pid, init
    parent_loss, child_loss = _test_loss(run["dir"]), _test_loss(child_dir)
    assert abs(child_loss - parent_loss) <= 1e-4 * parent_loss, (child_loss, parent_loss)


EVAL_TASK, EVAL_LIMIT = "mcx_quickstart_next_line", 60


def test_the_gpu_run_is_evaluated_on_the_gpu_through_both_interfaces(project, run):
    """`mcx eval` of the GPU run (Transformer Engine spec, bf16, a distributed checkpoint) on its own hardware
    (issue 39): the harness's model interface over the run's Megatron-Core model (D72) loads the checkpoint as
    canonical weights into the local layer spec on CUDA; HFLM on the run's export scores the same items. Both
    are bf16 on different kernels, so the scores agree within a few items, not to the last digit (the CPU test,
    fp32, asserts them identical); a mapping error would put the Megatron-Core interface near chance."""
    import shutil

    from attrs import evolve

    from mcx.ops.evaluate import EvalOverrides, evaluate_run
    from mcx.spec import loads_spec

    shutil.copytree(ROOT / "evals", project / "evals", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    pid = run["summary"]["run_id"]
    res = mcx(project, "eval", pid, "--tasks", "evals/quickstart_next_line", "--limit", str(EVAL_LIMIT), "--json")
    assert res.code == 0, res
    mega = res.json()
    assert (mega["device"], mega["settings"]["interface"], mega["settings"]["dtype"]) == (
        "cuda", "megatron", "bfloat16"), mega
    assert mega["tasks"][EVAL_TASK]["samples"] == EVAL_LIMIT
    spec_eval = loads_spec((run["dir"] / "spec.toml").read_text(), str(run["dir"] / "spec.toml")).eval
    hf = evaluate_run(pid, project, overrides=EvalOverrides(tasks=("evals/quickstart_next_line",), limit=EVAL_LIMIT,
                                                           fresh=True),
                      spec_eval=evolve(spec_eval, model="hf")).to_dict()
    assert (hf["device"], hf["settings"]["interface"], hf["cached"]) == ("cuda", "hf", False), hf
    assert hf["key"] == mega["key"]  # the interface is not part of the key: the same evaluation
    a = {(s["task"], s["metric"]): s["value"] for s in mega["scores"]}
    b = {(s["task"], s["metric"]): s["value"] for s in hf["scores"]}
    print("eval on the GPU: megatron", a, "| hf", b, "| wall", mega["wall_s"], hf["wall_s"])  # docs/benchmarks.md
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 3 / EVAL_LIMIT for k in a), (a, b)
