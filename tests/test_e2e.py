"""End to end: the mcx verbs on a real project, with nothing replaced.

One project for the module: a git repository holding the quickstart specs, data.dvc, the CPU
lockfile and the prepared dataset. The runs are real: Megatron-Core workers on CPU (smoke stage,
then full stage), the embedded MLflow store (.mcx/mlflow.db), DVC with the embedded remote
(.mcx/dvc-remote). Trainings are shared between tests (module fixtures), in this order:

    A   tiny, FAST                  smoke + full   (the `mcx run` under test, as a subprocess)
    B   tiny, FAST, train.lr=1e-3   full only (--skip-smoke); compared with A
    F   tiny, FAST, train.lr=0      smoke only: it fails, nothing can be learnt
    B'  B again with --force        full only; the first attempt archived; judged against A; steps 5-6
                                    under torch.profiler (--profile 5:6)
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from pathlib import Path

import pytest

from mcx import hashing

from conftest import git_head, make_e2e_project, mcx_inprocess, mcx_subprocess

# A quickstart small enough for two CPU cores: 10 smoke steps, 12 full steps, evaluations and
# checkpoints at 6 and 12. The smoke stage's mean loss still falls by about 0.5 (lr 3e-3).
FAST = ["--set", "train.train_iters=12", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=6",
        "--set", "checkpoint.interval=6", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
        "--set", "smoke.resume_check_iters=2"]
SPEC = "experiments/tiny.toml"
LR_B = ["--set", "train.lr=1e-3"]
# A spec that cannot learn: lr 0 (and min_lr 0, so the schedule is valid). The smoke check asks the
# mean loss to fall by 0.05, which batch-to-batch noise of an untrained model does not reach.
CANNOT_LEARN = ["--set", "train.lr=0.0", "--set", "train.min_lr=0.0", "--set", "smoke.min_loss_drop=0.05"]
GATED = ["--set", "baseline.run=main", "--set", "baseline.tolerances.valid_loss=0.01"]
SMOKE_CHECKS = {"loss_finite", "loss_falling", "checkpoint_roundtrip", "resume_bitwise", "throughput"}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


# -- helpers --------------------------------------------------------------------------------------

def metrics_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(path: Path, kind: str = "train") -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in metrics_lines(path) if r["kind"] == kind]


def client(project: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")


def parent_runs(project: Path, run_id: str) -> list:
    c = client(project)
    exps = [e.experiment_id for e in c.search_experiments()]
    return c.search_runs(exps, f"tags.`mcx.run_id` = '{run_id}' and tags.`mcx.record` = 'run'")


def children(project: Path, parent) -> dict[str, object]:
    c = client(project)
    kids = c.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return {k.data.tags.get("mcx.stage"): k for k in kids}


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.relative_to(root).parts}


# -- the shared project and trainings ---------------------------------------------------------------

@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("e2e") / "project")


@pytest.fixture(scope="module")
def run_a(project: Path):
    """A, through the real command line: the summary on stdout, worker progress on stderr."""
    return mcx_subprocess(project, "run", SPEC, *FAST, "--json")


@pytest.fixture(scope="module")
def a(run_a) -> dict:
    assert run_a.code == 0, run_a
    return run_a.json()


@pytest.fixture(scope="module")
def b(project: Path, a: dict) -> dict:
    res = mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, "--skip-smoke", "--json", "--quiet")
    assert res.code == 0, res
    return res.json()


@pytest.fixture(scope="module")
def failing(project: Path, a: dict):
    return mcx_inprocess(project, "run", SPEC, *FAST, *CANNOT_LEARN, "--json", "--quiet")


# -- mcx run: smoke, then full ---------------------------------------------------------------------

def test_run_trains_smoke_then_full_and_prints_one_json_summary(run_a, a):
    assert run_a.code == 0, run_a
    assert "Traceback" not in run_a.err
    assert len(a["run_id"]) == 12 and int(a["run_id"], 16) >= 0
    assert a["status"] == "finished" and a["cached"] is False and a["exit_code"] == 0 and a["error"] is None
    assert list(a["stages"]) == ["full", "smoke"]  # sorted keys
    smoke, full = a["stages"]["smoke"], a["stages"]["full"]
    assert smoke["status"] == "finished" and smoke["passed"] is True and smoke["steps"] == 10
    assert set(smoke["checks"]) == SMOKE_CHECKS
    assert all(c["passed"] for c in smoke["checks"].values()), smoke["checks"]
    fell = smoke["checks"]["loss_falling"]
    assert fell["last_window_mean"] < fell["first_window_mean"] - 0.1
    assert smoke["checks"]["resume_bitwise"]["steps"] == [9, 10]
    assert full["status"] == "finished" and full["steps"] == 12
    for key in ("train_loss", "valid_loss", "test_loss", "valid_ppl"):
        assert math.isfinite(a["final"][key]), key
    assert a["final"]["valid_loss"] < math.log(4096)  # below an untrained model's loss (vocab 4096)
    assert a["tracking"]["state"] == "synced" and a["tracking"]["target"] == "embedded"
    # --json: stdout holds the summary alone; the worker's metrics went to stderr, one JSON line each.
    assert len(run_a.out.strip().splitlines()) == 1
    assert "smoke stage" in run_a.err and "smoke stage" not in run_a.out  # progress is not the result
    before = [json.loads(line) for line in run_a.err.splitlines() if line.startswith("{")]
    assert [r["step"] for r in before if r["kind"] == "train"] == [*range(1, 11), *range(1, 13)]


def test_run_directory_holds_spec_fingerprint_plan_and_both_stages(project, a):
    rdir = project / ".mcx" / "runs" / a["run_id"]
    for name in ("spec.toml", "fingerprint.json", "plan.json", "run.json"):
        assert (rdir / name).is_file(), name
    assert json.loads((rdir / "fingerprint.json").read_text())["run_id"] == a["run_id"]
    run_json = json.loads((rdir / "run.json").read_text())
    assert run_json["status"] == "finished" and run_json["stages_planned"] == ["smoke", "full"]
    import tomllib

    spec = tomllib.loads((rdir / "spec.toml").read_text())
    assert spec["train"]["train_iters"] == 12 and spec["smoke"]["train_iters"] == 10
    plan = json.loads((rdir / "plan.json").read_text())
    assert plan["train_iters"] == 12

    for stage, steps in (("smoke", 10), ("full", 12)):
        sdir = rdir / stage
        result = json.loads((sdir / "result.json").read_text())
        assert result["status"] == "finished" and result["steps"] == steps
        lines = metrics_lines(sdir / "metrics.jsonl")
        assert [r["step"] for r in lines if r["kind"] == "train"] == list(range(1, steps + 1))
        assert all(math.isfinite(r["loss"]) for r in lines)
        assert [r["step"] for r in lines if r["kind"] == "test"] == [steps]
        tail = [v for _, v in losses(sdir / "metrics.jsonl")][-10:]  # docs/metrics.md: the last 1%, at least 10
        assert result["final"]["train_loss"] == pytest.approx(math.fsum(tail) / 10, rel=1e-12)
        job = json.loads((sdir / "job.json").read_text())
        assert job["stage"] == stage and job["run_id"] == a["run_id"] and job["device"] == "cpu"
    full_lines = metrics_lines(rdir / "full" / "metrics.jsonl")
    assert [r["step"] for r in full_lines if r["kind"] == "valid"] == [6, 12]
    # The smoke stage trained the shrunk model of [smoke]; the full stage the spec's.
    assert json.loads((rdir / "smoke" / "job.json").read_text())["spec"]["model"]["num_layers"] == 2
    assert json.loads((rdir / "full" / "job.json").read_text())["spec"]["model"]["num_layers"] == 4
    assert a["final"]["valid_loss"] == full_lines[-2]["loss"]  # the final validation, then the test pass


def test_mlflow_holds_the_parent_run_and_its_stage_runs(project, a):
    rid = a["run_id"]
    found = parent_runs(project, rid)
    assert len(found) == 1
    parent = found[0]
    assert parent.info.status == "FINISHED" and parent.info.run_id == a["tracking"]["mlflow_run"]
    tags, params = parent.data.tags, parent.data.params
    assert tags["mcx.status"] == "finished"
    # Parameters: the resolved spec, flattened.
    assert params["train.lr"] == "0.003" and params["train.train_iters"] == "12"
    assert params["model.num_layers"] == "4" and params["smoke.train_iters"] == "10"
    # Fingerprint tags agree with fingerprint.json and with the project's commit.
    fp = json.loads((project / ".mcx" / "runs" / rid / "fingerprint.json").read_text())
    for comp, digest in fp["component_hashes"].items():
        assert tags[f"mcx.fp.{comp}.hash"] == digest, comp
    # The code's provenance beside the ID (D52); its modules, the hashed part, as one tag.
    assert tags["mcx.fp.code.info.commit"] == git_head(project) and tags["mcx.fp.code.info.branch"] == "main"
    assert tags["mcx.fp.code.info.dirty"] == "false" and tags["mcx.fp.code.info.changes"] == "0 paths"
    modules = fp["code"]["id"]["modules"]
    assert tags["mcx.fp.code.modules"] == f"{len(modules)} files, sha256 {hashing.digest(modules)}"
    # The full stage's finals on the parent; the smoke stage's under smoke/.
    assert parent.data.metrics["valid_loss"] == a["final"]["valid_loss"]
    assert parent.data.metrics["smoke/valid_loss"] == a["stages"]["smoke"]["metrics"]["valid_loss"]

    kids = children(project, parent)
    assert set(kids) == {"smoke", "full"}
    assert kids["smoke"].info.run_name == f"{rid}/smoke" and kids["full"].info.run_name == f"{rid}/full"
    assert all(k.info.status == "FINISHED" for k in kids.values())
    assert {k[len("mcx.check."):]: v for k, v in kids["smoke"].data.tags.items()
            if k.startswith("mcx.check.")} == dict.fromkeys(SMOKE_CHECKS, "pass")
    assert kids["smoke"].data.params["model.num_layers"] == "2"  # the stage's own (shrunk) spec
    c = client(project)
    for stage, steps in (("smoke", 10), ("full", 12)):
        history = sorted((m.step, m.value) for m in c.get_metric_history(kids[stage].info.run_id, "train/loss"))
        recorded = losses(project / ".mcx" / "runs" / rid / stage / "metrics.jsonl")
        assert history == recorded, stage  # every step, bit for bit
    valid = sorted((m.step, m.value) for m in c.get_metric_history(kids["full"].info.run_id, "valid/loss"))
    assert [s for s, _ in valid] == [6, 12]


def test_final_checkpoint_is_added_to_dvc_and_pushed_to_the_embedded_remote(project, a):
    rid = a["run_id"]
    ckdir = project / ".mcx" / "runs" / rid / "full" / "checkpoints"
    assert (ckdir / "latest").read_text().strip() == "iter_0000012"
    import yaml

    pointer = project / ".mcx" / "checkpoints" / rid / "full.dvc"  # the pointer git carries (D38)
    dvc = yaml.safe_load(pointer.read_text())
    assert dvc["outs"][0]["path"] == f"../../runs/{rid}/full/checkpoints/iter_0000012"
    md5 = dvc["outs"][0]["md5"]
    assert md5.endswith(".dir")
    tags = parent_runs(project, rid)[0].data.tags
    assert tags["mcx.checkpoint.full.md5"] == md5
    assert "mcx.checkpoint.smoke.md5" in tags  # the smoke stage's final checkpoint too
    remote = project / ".mcx" / "dvc-remote" / "files" / "md5"
    manifest = remote / md5[:2] / md5[2:]
    assert manifest.is_file(), sorted(p.name for p in remote.rglob("*"))
    entries = json.loads(manifest.read_text())
    assert {e["relpath"] for e in entries} >= {"meta.json"}
    for e in entries:  # every file of the checkpoint is in the remote
        assert (remote / e["md5"][:2] / e["md5"][2:]).is_file(), e
    # Recording changed nothing in the git tree but the pointers for the user to commit, which the
    # code fingerprint leaves out with the rest of .mcx/ (test_second_run_is_cached_and_trains_nothing).
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain", "-uall"], capture_output=True,
                            text=True)
    assert {f".mcx/checkpoints/{rid}/full.dvc", f".mcx/checkpoints/{rid}/smoke.dvc"} <= {
        line[3:] for line in status.stdout.splitlines()}
    assert all(line.startswith("?? .mcx/checkpoints/") for line in status.stdout.splitlines()), status.stdout


def test_second_run_is_cached_and_trains_nothing(project, a):
    run = project / ".mcx" / "runs" / a["run_id"]
    metrics = run / "full" / "metrics.jsonl"

    def stage_files() -> dict[str, int]:  # what a worker writes: job, logs, metrics, checkpoints, result
        return {str(p.relative_to(run)): p.stat().st_mtime_ns for s in ("smoke", "full") for p in (run / s).rglob("*")}

    before = stage_files()
    res = mcx_inprocess(project, "run", SPEC, *FAST, "--json")
    assert res.code == 0, res
    again = res.json()
    assert again["run_id"] == a["run_id"] and again["cached"] is True and again["status"] == "finished"
    assert again["final"] == a["final"]
    assert "already finished" in res.err and "--force" in res.err
    assert stage_files() == before and str(metrics.relative_to(run)) in before  # no stage started: nothing rewritten
    table = mcx_inprocess(project, "run", SPEC, *FAST, "--quiet")  # no --json: the result table on stdout
    assert table.code == 0 and f"run {a['run_id']}" in table.out and "run directory" in table.out, table
    assert "already finished" not in table.out and "already finished" in table.err
    assert "\x1b[" not in table.out and all(len(line) < 200 for line in table.out.splitlines())
    assert len(parent_runs(project, a["run_id"])) == 1
    # A finished run has no step left to profile: said (exit 2, nothing rewritten), not silently ignored (D73).
    profiled = mcx_inprocess(project, "run", SPEC, *FAST, "--profile", "3", "--quiet")
    assert profiled.code == 2 and "already finished" in profiled.err and "--force" in profiled.err, profiled
    assert stage_files() == before


def test_ls_and_show_list_the_run(project, a):
    res = mcx_inprocess(project, "ls", "--json")
    assert res.code == 0, res
    rows = {r["run_id"]: r for r in res.json()}
    assert rows[a["run_id"]]["status"] == "finished" and rows[a["run_id"]]["name"] == "tiny"
    res = mcx_inprocess(project, "show", a["run_id"], "--json")
    assert res.code == 0, res
    shown = res.json()
    assert shown["run_id"] == a["run_id"] and shown["status"] == "finished"
    assert set(shown["stages"]) == {"smoke", "full"}
    assert shown["final"]["valid_loss"] == a["final"]["valid_loss"]
    # Where its spec and checkpoints are, with the DVC hash each stage's committed pointer records.
    rdir = project / ".mcx" / "runs" / a["run_id"]
    assert Path(shown["spec_path"]) == rdir / "spec.toml" and (rdir / "spec.toml").is_file()
    for stage, steps in (("smoke", 10), ("full", 12)):
        ck = shown["checkpoints"][stage]
        pointer = project / ".mcx" / "checkpoints" / a["run_id"] / f"{stage}.dvc"
        assert Path(ck["path"]) == rdir / stage / "checkpoints" / f"iter_{steps:07d}" and ck["present"] is True
        assert Path(ck["pointer"]) == pointer and f"md5: {ck['md5']}" in pointer.read_text()
    assert shown["tracking"]["mlflow_run"] == a["tracking"]["mlflow_run"] and shown["tracking"]["mlflow_url"] is None
    text = " ".join(mcx_inprocess(project, "show", a["run_id"]).out.split())
    assert str(rdir / "spec.toml") in text and shown["checkpoints"]["full"]["md5"] in text
    assert a["tracking"]["mlflow_run"] in text and "…" not in text  # off a terminal nothing is cut


def test_a_mixture_of_experts_run_shows_its_routing(project, a):
    """mcx run of the quickstart MoE spec: each step's expert load and load-balancing loss (D82) reach
    metrics.jsonl and MLflow, and `mcx show` gives the expert load beside the loss; a dense run has no such row."""
    res = mcx_inprocess(project, "run", "experiments/tiny_moe.toml", *FAST, "--skip-smoke", "--json", "--quiet")
    assert res.code == 0, res
    moe = res.json()
    train = [json.loads(line) for line in (project / ".mcx" / "runs" / moe["run_id"] / "full" / "metrics.jsonl")
             .read_text().splitlines() if '"train"' in line]
    assert all(1.0 <= r["moe_expert_load"] <= 2.0 and 0.9 < r["moe_balance_loss"] < 2.0 for r in train)
    assert moe["final"]["moe_expert_load"] == pytest.approx(sum(r["moe_expert_load"] for r in train[-10:]) / 10)
    kids = children(project, parent_runs(project, moe["run_id"])[0])
    assert len(client(project).get_metric_history(kids["full"].info.run_id, "train/moe_balance_loss")) == len(train)
    shown = " ".join(mcx_inprocess(project, "show", moe["run_id"]).out.split())
    assert re.search(rf"expert load \(final\) \W+ {moe['final']['moe_expert_load']:.2f}x", shown), shown
    assert "expert load" not in mcx_inprocess(project, "show", a["run_id"]).out
    # `mcx compare` of the MoE run against a dense one: the expert load's row and chart hold the MoE run alone.
    cmp = mcx_inprocess(project, "compare", a["run_id"], moe["run_id"], "--format", "json")
    assert cmp.code == 0, cmp
    doc = json.loads(cmp.out)  # indented: not one line
    load = doc["metrics"]["moe_expert_load"]["runs"]
    assert load[a["run_id"]]["value"] is None and load[moe["run_id"]]["value"] == moe["final"]["moe_expert_load"]
    assert list(doc["curves"]["train/moe_expert_load"]) == [moe["run_id"]]


# -- a smoke stage that fails -----------------------------------------------------------------------

def test_a_model_that_cannot_learn_fails_the_smoke_stage_and_never_starts_the_full_stage(project, failing):
    assert failing.code == 1, failing
    s = failing.json()
    assert s["status"] == "failed" and s["exit_code"] == 1 and s["cached"] is False
    assert list(s["stages"]) == ["smoke"]
    smoke = s["stages"]["smoke"]
    assert smoke["passed"] is False and smoke["status"] == "failed"
    assert smoke["checks"]["loss_falling"]["passed"] is False
    assert {k for k, c in smoke["checks"].items() if not c["passed"]} == {"loss_falling"}
    assert "loss_falling" in s["error"] and "did not fall" in s["error"] and "train.lr" in s["error"]
    assert "loss_falling" in failing.err  # and said so on the terminal
    rdir = project / ".mcx" / "runs" / s["run_id"]
    assert not (rdir / "full").exists()
    assert json.loads((rdir / "run.json").read_text())["status"] == "failed"
    parent = parent_runs(project, s["run_id"])[0]
    assert parent.info.status == "FAILED" and parent.data.tags["mcx.status"] == "failed"
    kids = children(project, parent)
    assert set(kids) == {"smoke"}
    assert kids["smoke"].data.tags["mcx.check.loss_falling"] == "fail"


# -- bad input: exit 2, nothing written -------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project no command has written to."""
    return make_e2e_project(tmp_path_factory.mktemp("e2e-pristine") / "project")


@pytest.mark.parametrize("args, shown", [
    ([SPEC, "--set", "train.bogus=1"], "train.bogus"),
    ([SPEC, "--set", "parallel.tensor=3"], "parallel.tensor"),
    (["experiments/missing.toml"], "missing.toml"),
    # Found only when the stage is launched, unless checked first: the local launcher runs one process.
    ([SPEC, "--set", "hardware.gpus_per_node=2"], "launch.kind = 'local'"),
    ([SPEC, "--set", "smoke.gpus_per_node=2"], "smoke.nodes x smoke.gpus_per_node"),
    ([SPEC, "--set", "tracking.uri=http://user:secret@127.0.0.1:9/"], "tracking.uri holds credentials"),
    ([SPEC, "--set", "data.split=1,1000000,1"], "holds no sample"),  # the smoke stage's share of the data
], ids=["unknown-key", "impossible-layout", "missing-spec", "launcher-too-small", "smoke-launcher", "uri-secret",
        "no-train-data"])
def test_bad_input_exits_2_and_writes_nothing(pristine, args, shown):
    before = tree(pristine)
    res = mcx_subprocess(pristine, "run", *args, *FAST, "--json")
    assert res.code == 2, res
    assert shown in res.err and res.err.startswith("mcx: error:")
    assert "Traceback" not in res.err and "secret" not in res.err
    assert res.out == ""
    assert tree(pristine) == before
    assert not (pristine / ".mcx").exists()


def test_the_full_stage_alone_needs_a_passed_smoke_stage_and_writes_nothing(pristine):
    before = tree(pristine)
    res = mcx_subprocess(pristine, "run", SPEC, *FAST, "--stage", "full")
    assert res.code == 1, res
    assert "smoke stage of this run has not passed" in res.err and "--skip-smoke" in res.err
    assert "Traceback" not in res.err
    assert tree(pristine) == before


def test_a_stage_that_cannot_be_started_is_recorded_as_failed_not_running(project, a):
    """Slurm refuses the job (or is absent): found only when the stage is submitted, after the run's
    records exist; they must end, not stay "running"."""
    res = mcx_inprocess(project, "run", SPEC, *FAST, "--set", "launch.kind=slurm",
                        "--set", "launch.slurm.partition=no-such-partition", "--json", "--quiet")
    assert res.code == 2, res
    s = res.json()
    assert s["status"] == "failed" and "sbatch" in s["error"] and s["stages"] == {}
    rdir = project / ".mcx" / "runs" / s["run_id"]
    assert json.loads((rdir / "run.json").read_text())["status"] == "failed"
    parent = parent_runs(project, s["run_id"])[0]
    assert parent.info.status == "FAILED" and parent.data.tags["mcx.status"] == "failed"
    assert {stage: k.info.status for stage, k in children(project, parent).items()} == {"smoke": "KILLED"}


def test_a_stage_out_of_memory_fails_with_the_planners_view_and_fixes(project, a, monkeypatch):
    """A real allocation failure in the worker (a 64 GiB embedding on a 24 GiB machine): the run fails
    with the allocator's message, the planner's estimate for the stage and the fixes it computes."""
    # Its checkpoint would not fit this machine's disk either, which `mcx run` refuses before anything
    # starts (tests/test_preflight.py); this test is about the worker's allocation failure, so that check is off.
    monkeypatch.setattr("mcx.launch.preflight.free_space", lambda *args, **kwargs: [])
    res = mcx_inprocess(project, "run", SPEC, *FAST, "--set", "model.hidden_size=33554432", "--skip-smoke", "--yes",
                        "--json", "--quiet")
    assert res.code == 1, res
    s = res.json()
    assert s["status"] == "failed" and "can't allocate memory" in s["error"], s["error"]
    assert "  - the planner estimated " in s["error"] and "  - lower the peak: " in s["error"]
    full = json.loads((project / ".mcx" / "runs" / s["run_id"] / "full" / "result.json").read_text())
    assert full["out_of_memory"]["device"] == "cpu"


# -- compare, explain, baselines --------------------------------------------------------------------

def test_compare_shows_exactly_the_changed_hyperparameter_and_both_curves(project, a, b, tmp_path):
    ra, rb = a["run_id"], b["run_id"]
    assert ra != rb and list(b["stages"]) == ["full"]
    out = {fmt: tmp_path / f"cmp.{fmt}" for fmt in ("md", "json", "html")}
    for fmt, path in out.items():
        res = mcx_inprocess(project, "compare", ra, rb, "--format", fmt, "-o", str(path))
        assert res.code == 0 and res.out == "", res
    doc = json.loads(out["json"].read_text())
    assert [r["run_id"] for r in doc["runs"]] == [ra, rb]
    assert doc["config_diff"] == [{"key": "train.lr", "values": {ra: 0.003, rb: 0.001}}]
    assert [row["key"] for row in doc["fingerprint_diff"]["component_hashes"]] == ["config"]
    for run, path in ((ra, "full"), (rb, "full")):
        curve = doc["curves"]["train/loss"][run]
        recorded = losses(project / ".mcx" / "runs" / run / path / "metrics.jsonl")
        assert list(zip(curve["steps"], curve["values"])) == recorded
    md = out["md"].read_text()
    assert "train.lr" in md and ra in md and rb in md and "train.min_lr" not in md
    html = out["html"].read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "<svg" in html and ra in html and rb in html


def _by_hand(metrics_file: Path) -> dict[str, float]:
    """The summary metrics computed here from metrics.jsonl, as docs/metrics.md defines them."""
    lines = metrics_lines(metrics_file)
    train = [r for r in lines if r["kind"] == "train"]
    valid = [r for r in lines if r["kind"] == "valid"]
    w = min(len(train), max(10, len(train) // 100))
    steady = train[max(1, len(train) // 20):]
    return {
        "train_loss": math.fsum(r["loss"] for r in train[-w:]) / w,
        "valid_loss": valid[-1]["loss"],
        "step_time_s": math.fsum(r["step_time_s"] for r in steady) / len(steady),
        "tokens_per_s_per_gpu": len(steady) / math.fsum(1 / r["tokens_per_s_per_gpu"] for r in steady),
        "mem_peak_bytes": float(max(r["mem_peak_bytes"] for r in train)),
    }


def test_every_surface_prints_the_same_summary_metrics(project, a, b, tmp_path):
    """One definition per metric: show, ls, compare (JSON, Markdown, HTML, table), the baseline gate and
    MLflow's summary metrics all carry the values computed by hand from each run's metrics.jsonl."""
    from mcx.metrics.summary import BY_KEY
    from mcx.report.fmt import value

    ids = (a["run_id"], b["run_id"])
    truth = {rid: _by_hand(project / ".mcx" / "runs" / rid / "full" / "metrics.jsonl") for rid in ids}
    shown = {rid: mcx_inprocess(project, "show", rid, "--json").json() for rid in ids}
    listed = {r["run_id"]: r for r in mcx_inprocess(project, "ls", "--json").json()}
    doc = json.loads(mcx_inprocess(project, "compare", *ids, "--format", "json").out)
    for rid in ids:
        parent = parent_runs(project, rid)[0]
        for key, want in truth[rid].items():
            assert shown[rid]["stages"]["full"]["final"][key] == pytest.approx(want, rel=1e-12), (rid, key)
            assert shown[rid]["final"][key] == listed[rid]["final"][key] == shown[rid]["stages"]["full"]["final"][key]
            assert doc["metrics"][key]["runs"][rid]["value"] == shown[rid]["final"][key], (rid, key)
            assert parent.data.metrics[key] == shown[rid]["final"][key], (rid, key)
    # The text surfaces print the same numbers the same way.
    show_text = mcx_inprocess(project, "show", ids[0]).out
    texts = {fmt: mcx_inprocess(project, "compare", *ids, "--format", fmt).out for fmt in ("md", "table", "html")}
    texts["ls"] = mcx_inprocess(project, "ls").out
    texts["run"] = mcx_inprocess(project, "run", SPEC, *FAST, "--quiet").out + \
        mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, "--skip-smoke", "--quiet").out  # cached: the result tables
    for key in ("train_loss", "valid_loss", "tokens_per_s_per_gpu", "step_time_s"):
        for rid in ids:
            printed = value(BY_KEY[key].unit, truth[rid][key])
            for fmt, text in texts.items():
                if fmt in ("ls", "run") and key == "step_time_s":
                    continue  # not a column of theirs
                assert printed in text, (fmt, rid, key, printed)
        assert value(BY_KEY[key].unit, truth[ids[0]][key]) in show_text, key
    # The baseline gate judges the same values.
    mcx_inprocess(project, "baseline", "set", "main", ids[0])
    gate = mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, *GATED, "--skip-smoke", "--json").json()["baseline"]
    for key in truth[ids[0]]:
        assert gate["metrics"][key]["baseline"] == shown[ids[0]]["final"][key], key
        assert gate["metrics"][key]["value"] == shown[ids[1]]["final"][key], key


def test_explain_two_run_ids_lists_exactly_the_changed_key(project, a, b):
    res = mcx_inprocess(project, "explain", a["run_id"], b["run_id"], "--json")
    assert res.code == 0, res
    doc = res.json()
    assert doc["same"] is False
    assert [c["component"] for c in doc["components"]] == ["config"]
    assert doc["components"][0]["changes"] == [{"key": "train.lr", "kind": "changed", "a": 0.003, "b": 0.001}]


def test_skip_smoke_is_recorded(project, b):
    rdir = project / ".mcx" / "runs" / b["run_id"]
    assert not (rdir / "smoke").exists()
    assert json.loads((rdir / "run.json").read_text())["skip_smoke"] is True
    assert parent_runs(project, b["run_id"])[0].data.tags["mcx.skip_smoke"] == "true"


def test_baseline_set_and_a_run_judged_against_it(project, a, b):
    res = mcx_inprocess(project, "baseline", "set", "main", a["run_id"], "--json")
    assert res.code == 0, res
    assert res.json()["run_id"] == a["run_id"]
    res = mcx_inprocess(project, "baseline", "ls", "--json")
    assert {r["name"]: r["run_id"] for r in res.json()} == {"main": a["run_id"]}
    assert b["final"]["valid_loss"] > a["final"]["valid_loss"] * 1.01  # B learns more slowly

    # [baseline] is not part of the run ID: B with a baseline is B, cached, and judged now.
    res = mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, *GATED, "--skip-smoke", "--json")
    assert res.code == 1, res
    s = res.json()
    assert s["run_id"] == b["run_id"] and s["cached"] is True and s["status"] == "finished"
    assert s["baseline"]["baseline_run_id"] == a["run_id"] and s["baseline"]["verdict"] == "regress"
    assert s["baseline"]["regressed"] == ["valid_loss"] and "valid_loss" in s["error"]
    entry = s["baseline"]["metrics"]["valid_loss"]
    assert entry["value"] == b["final"]["valid_loss"] and entry["baseline"] == a["final"]["valid_loss"]


def test_by_default_a_worse_held_out_loss_regresses(project, a, b):
    mcx_inprocess(project, "baseline", "set", "main", a["run_id"])
    res = mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, "--set", "baseline.run=main", "--skip-smoke", "--json")
    assert res.json()["baseline"]["verdict"] == "regress"


# -- --force ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def forced(project: Path, a: dict, b: dict):
    """B trained again with --force (the full stage only, as B was), judged against baseline "main" (A), its steps
    5 and 6 profiled (D73: the profiler observes, so the run ID and the losses are B's)."""
    res = mcx_inprocess(project, "baseline", "set", "main", a["run_id"])
    assert res.code == 0, res
    archived_before = set((project / ".mcx" / "archive").glob(f"{b['run_id']}-*"))
    res = mcx_inprocess(project, "run", SPEC, *FAST, *LR_B, *GATED, "--skip-smoke", "--force", "--profile", "5:6",
                        "--json", "--quiet")
    return res, archived_before


def test_force_retrains_archives_the_previous_attempt_and_judges_the_new_one(project, a, b, forced):
    res, archived_before = forced
    assert res.code == 1, res  # B regresses against A
    s = res.json()
    assert s["run_id"] == b["run_id"] and s["cached"] is False and s["status"] == "finished"
    assert list(s["stages"]) == ["full"] and s["stages"]["full"]["steps"] == 12
    archived = set((project / ".mcx" / "archive").glob(f"{b['run_id']}-*")) - archived_before
    assert len(archived) == 1
    old = archived.pop()
    assert json.loads((old / "run.json").read_text())["status"] == "finished"
    new = project / ".mcx" / "runs" / b["run_id"] / "full" / "metrics.jsonl"
    # Retrained (a new file), and on CPU bit for bit the same losses as the archived, unprofiled attempt.
    assert new.stat().st_mtime > (old / "full" / "metrics.jsonl").stat().st_mtime
    assert losses(new) == losses(old / "full" / "metrics.jsonl")
    assert not (old / "full" / "profile").exists()
    profile = new.parent / "profile"
    assert sorted(f.name for f in profile.iterdir()) == ["ops-rank0.txt", "trace-rank0.json.gz"]
    assert "steps 5-6 (2 profiled" in (profile / "ops-rank0.txt").read_text()
    shown = mcx_inprocess(project, "show", b["run_id"], "--json").json()
    assert shown["profiles"] == {"full": str(profile)}
    assert f"full profile {profile}" in " ".join(mcx_inprocess(project, "show", b["run_id"]).out.split())
    assert s["final"]["valid_loss"] == b["final"]["valid_loss"]
    assert s["baseline"]["baseline"] == "main" and s["baseline"]["baseline_run_id"] == a["run_id"]
    assert s["baseline"]["verdict"] == "regress" and "valid_loss" in s["error"]
    assert "regressed against the baseline" in res.err


def test_a_forced_attempt_is_fully_recorded_beside_the_first(project, b, forced):
    s = forced[0].json()
    assert s["tracking"]["state"] == "synced", s["tracking"]
    parents = {p.data.tags.get("mcx.attempt", "1"): p for p in parent_runs(project, b["run_id"])}
    assert set(parents) == {"1", "2"}
    assert parents["2"].info.run_id == s["tracking"]["mlflow_run"] and parents["2"].info.status == "FINISHED"
    assert parents["2"].data.tags["mcx.baseline.verdict"] == "regress"
    assert parents["2"].data.params["baseline.run"] == "main"
    # The first attempt's record is kept as it was.
    assert parents["1"].info.run_id == b["tracking"]["mlflow_run"] and parents["1"].info.status == "FINISHED"
    assert parents["1"].data.params["baseline.run"] == "null"
    c = client(project)
    for parent in parents.values():
        kids = children(project, parent)
        assert set(kids) == {"full"}
        assert len(c.get_metric_history(kids["full"].info.run_id, "train/loss")) == 12  # not both attempts' steps


# -- export -----------------------------------------------------------------------------------------

def test_export_prints_pretrain_gpt_arguments(pristine):
    before = tree(pristine)
    res = mcx_inprocess(pristine, "export", SPEC, "--megatron-args", "--set", "train.lr=1e-3")
    assert res.code == 0, res
    args = res.out.split()
    for flag, value in (("--num-layers", "4"), ("--hidden-size", "128"), ("--num-attention-heads", "4"),
                        ("--num-query-groups", "2"), ("--seq-length", "128"), ("--micro-batch-size", "4"),
                        ("--global-batch-size", "8"), ("--train-iters", "200"), ("--lr", "0.001"),
                        ("--tensor-model-parallel-size", "1")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--swiglu" in args and "--group-query-attention" in args
    assert "torchrun" not in res.out and not res.out.startswith("#!")
    assert tree(pristine) == before
