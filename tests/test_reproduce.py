"""`mcx reproduce` end to end: the recorded code re-created as a git worktree, the recorded spec and
data, a real rerun (Megatron-Core on CPU), a verdict; nothing replaced.

The module's project records one run, O, made with an uncommitted change (an untracked file), and
then moves on (a new commit), so a reproduction has to restore the recorded commit *and* patch.
O is reproduced twice: as it is (bitwise on CPU), and with a fault injected into the rerun
(mcx/train/loop.py's test hook MCX_TEST_PERTURB_PARAMS_AT_STEP), which must be reported as a
divergence at that step.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import _git, e2e_env, make_e2e_project, mcx_inprocess, mcx_subprocess

FAST = ["--set", "train.train_iters=12", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=6",
        "--set", "checkpoint.interval=6", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
        "--set", "smoke.resume_check_iters=2"]
PERTURB_STEP = 11  # after the smoke stage's 10 steps: only the full stage is perturbed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


def losses(path: Path, kind: str = "train") -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if ".git" not in p.relative_to(root).parts}


def worktrees(project: Path) -> int:
    listing = subprocess.run(["git", "-C", str(project), "worktree", "list", "--porcelain"], capture_output=True,
                             text=True, check=True).stdout
    return listing.count("worktree ")


def client(project: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")


def head(project: Path) -> str:
    return subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("repro") / "project")


@pytest.fixture(scope="module")
def original(project: Path) -> dict:
    """O: trained from commit C plus an untracked file; then the project moves on to a new commit."""
    commit = head(project)
    (project / "NOTES.md").write_text("uncommitted work that O was trained with\n")
    res = mcx_inprocess(project, "run", "experiments/tiny.toml", *FAST, "--json", "--quiet")
    assert res.code == 0, res
    summary = res.json()
    assert summary["status"] == "finished"
    spec = project / "experiments" / "tiny.toml"
    spec.write_text(spec.read_text().replace("lr = 3e-3", "lr = 1e-3"))
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "moved on")
    return {**summary, "commit": commit, "dir": project / ".mcx" / "runs" / summary["run_id"]}


@pytest.fixture(scope="module")
def bitwise(project: Path, original: dict):
    return mcx_inprocess(project, "reproduce", original["run_id"], "--json")


@pytest.fixture(scope="module")
def perturbed(project: Path, original: dict, bitwise):
    env = e2e_env(MCX_TEST_PERTURB_PARAMS_AT_STEP=str(PERTURB_STEP))
    return mcx_subprocess(project, "reproduce", original["run_id"], "--json", env=env)


def test_the_original_was_recorded_with_its_uncommitted_change(original):
    fp = json.loads((original["dir"] / "fingerprint.json").read_text())
    assert fp["code"]["id"]["commit"] == original["commit"] and fp["code"]["id"]["dirty"] is True
    assert "NOTES.md" in fp["side"]["patch"]


def test_a_reproduction_on_the_same_machine_is_bitwise(project, original, bitwise):
    assert bitwise.code == 0, bitwise
    v = bitwise.json()
    assert v["run_id"] == original["run_id"] and v["verdict"] == "bitwise" and v["status"] == "finished"
    assert v["divergence"] is None and v["first_difference"] is None
    assert v["steps"] == 12 and {"train/loss", "valid/loss", "test/loss", "train/grad_norm", "train/lr"} <= set(v["compared"])
    assert v["data_identical"] is True and v["environment_drift"] == [] and v["hardware_drift"] == []
    # The recorded commit (not today's HEAD) with the recorded patch, in a worktree that is gone again.
    assert v["code"]["commit"] == original["commit"] != head(project) and v["code"]["patched"] is True
    assert v["code"]["drift"] == []  # the same mcx as recorded
    assert not Path(v["code"]["worktree"]).exists()
    assert worktrees(project) == 1
    # Its own run directory, beside (not over) the original's.
    rep = Path(v["reproduction_dir"])
    assert v["reproduction"] == "r1" and rep == original["dir"] / "reproductions" / "r1"
    assert json.loads((rep / "verdict.json").read_text())["verdict"] == "bitwise"
    for stage in ("smoke", "full"):
        assert losses(rep / stage / "metrics.jsonl") == losses(original["dir"] / stage / "metrics.jsonl")
    assert losses(rep / "full" / "metrics.jsonl", "valid") == losses(original["dir"] / "full" / "metrics.jsonl", "valid")
    assert json.loads((original["dir"] / "run.json").read_text())["status"] == "finished"


def test_the_reproduction_is_its_own_mlflow_run_under_the_original(project, original, bitwise):
    v = bitwise.json()
    c = client(project)
    rep = c.get_run(v["mlflow_run"])
    tags = rep.data.tags
    assert tags["mcx.record"] == "reproduction" and tags["mcx.reproduces"] == original["run_id"]
    assert tags["mcx.reproduction"] == "r1" and tags["mcx.status"] == "finished"
    assert rep.info.status == "FINISHED" and rep.info.run_id != original["tracking"]["mlflow_run"]
    assert tags["mlflow.parentRunId"] == original["tracking"]["mlflow_run"]
    kids = c.search_runs([rep.info.experiment_id], f"tags.`mlflow.parentRunId` = '{rep.info.run_id}'")
    assert {k.data.tags["mcx.stage"] for k in kids} == {"smoke", "full"}
    full = next(k for k in kids if k.data.tags["mcx.stage"] == "full")
    history = sorted((m.step, m.value) for m in c.get_metric_history(full.info.run_id, "train/loss"))
    assert history == losses(original["dir"] / "full" / "metrics.jsonl")
    # The original's record is untouched: still one parent run for its ID.
    exps = [e.experiment_id for e in c.search_experiments()]
    parents = c.search_runs(exps, f"tags.`mcx.run_id` = '{original['run_id']}' and tags.`mcx.record` = 'run'")
    assert [p.info.run_id for p in parents] == [original["tracking"]["mlflow_run"]]


def test_a_perturbed_rerun_diverges_at_the_perturbed_step(original, perturbed):
    assert perturbed.code == 1, perturbed
    assert "Traceback" not in perturbed.err
    v = perturbed.json()
    assert v["verdict"] == "diverged" and v["reproduction"] == "r2" and v["status"] == "finished"
    at = v["diverged_at"]
    assert at["step"] == PERTURB_STEP and at["metric"] == "train/loss"
    want = dict(losses(original["dir"] / "full" / "metrics.jsonl"))
    got = dict(losses(Path(v["reproduction_dir"]) / "full" / "metrics.jsonl"))
    assert at["original"] == want[PERTURB_STEP] and at["reproduction"] == got[PERTURB_STEP]
    assert abs(at["reproduction"] - at["original"]) > 0.01 * abs(at["original"])  # outside the default band
    assert all(got[s] == want[s] for s in range(1, PERTURB_STEP))  # identical up to the fault
    assert v["divergence"]["step"] == PERTURB_STEP and v["divergence"]["within"] is False
    assert "diverged" in perturbed.err


def _corrupt_corpus(project: Path) -> str:
    corpus = project / "data" / "quickstart" / "corpus.bin"
    corpus.write_bytes(corpus.read_bytes() + b"\0")
    return "changed since DVC recorded it"


def _another_data_version(project: Path) -> str:
    """data.dvc names another version of data/ (a teammate's `dvc add`, pulled with git, not checked out)."""
    dvc = project / "data.dvc"
    dvc.write_text(dvc.read_text().replace("78bb169363dc0c20b2eb38a954710a26.dir", "0123456789abcdef0123456789abcdef.dir"))
    return "does not match the recorded one"


@pytest.mark.parametrize("change", [_corrupt_corpus, _another_data_version], ids=["corrupt-corpus", "data-dvc-moved"])
def test_changed_data_is_refused_and_nothing_is_written(project, original, perturbed, change):
    saved = {p: p.read_bytes() for p in (project / "data.dvc", project / "data" / "quickstart" / "corpus.bin")}
    assert "78bb169363dc0c20b2eb38a954710a26.dir" in saved[project / "data.dvc"].decode()
    before = tree(project / ".mcx")
    runs_before = len(client(project).search_runs([e.experiment_id for e in client(project).search_experiments()]))
    try:
        shown = change(project)
        res = mcx_subprocess(project, "reproduce", original["run_id"], "--json")
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
    assert res.code == 2, res
    assert "Traceback" not in res.err and res.out == ""
    assert shown in res.err
    assert tree(project / ".mcx") == before
    assert len(client(project).search_runs([e.experiment_id for e in client(project).search_experiments()])) == runs_before
    assert worktrees(project) == 1


def test_a_new_reproduction_never_reuses_a_label(project, original, perturbed, tmp_path):
    """With r1 gone and r2 present the next label is r3, not r2 (whose finished stages would be reused)."""
    from mcx.ops.reproduce import next_label

    reps = original["dir"] / "reproductions"
    assert sorted(p.name for p in reps.iterdir()) == ["r1", "r2"] and next_label(reps) == "r3"
    shutil.move(reps / "r1", tmp_path / "r1")
    try:
        assert next_label(reps) == "r3"
    finally:
        shutil.move(tmp_path / "r1", reps / "r1")
    assert next_label(tmp_path / "none") == "r1"


def _bad_patch(fp: dict) -> str:
    fp["side"] = {"patch": "diff --git a/gone.txt b/gone.txt\n--- a/gone.txt\n+++ b/gone.txt\n@@ -1 +1 @@\n-a\n+b\n",
                  "patch_encoding": "utf-8"}  # the side data is not hashed: the ID still matches
    return "does not apply"


def _other_commit(fp: dict) -> str:
    fp["code"]["id"]["commit"] = "0" * 40
    return "but its content hashes to"


@pytest.mark.parametrize("damage", [_bad_patch, _other_commit], ids=["patch", "commit"])
def test_a_damaged_record_is_refused_and_leaves_no_worktree(project, original, perturbed, damage):
    path = original["dir"] / "fingerprint.json"
    saved = path.read_bytes()
    before = set(tree(project / ".mcx"))
    fp = json.loads(saved)
    shown = damage(fp)
    try:
        path.write_text(json.dumps(fp))
        res = mcx_subprocess(project, "reproduce", original["run_id"], "--json")
    finally:
        path.write_bytes(saved)
    assert res.code == 2, res
    assert shown in res.err and "Traceback" not in res.err and res.out == ""
    assert set(tree(project / ".mcx")) == before
    assert worktrees(project) == 1


@pytest.mark.parametrize("run_id, shown", [
    ("0123456789ab", "unknown run ID"),
    ("../etc", "is not a run ID"),
    ("a;b", "is not a run ID"),
    (".mcx/runs/x", "is not a run ID"),
])
def test_a_bad_run_id_exits_2_and_writes_nothing(project, original, run_id, shown):
    before = tree(project)
    res = mcx_subprocess(project, "reproduce", run_id, "--json")
    assert res.code == 2, res
    assert res.err.startswith("mcx: error:") and shown in res.err and "Traceback" not in res.err
    assert res.out == ""
    assert tree(project) == before
