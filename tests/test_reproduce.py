"""`mcx reproduce` end to end: the recorded code re-created as a git worktree, the recorded spec and
data, a real rerun (Megatron-Core on CPU), a verdict; nothing replaced.

The module's project records one run, O, made with an uncommitted change (an untracked file), and
then moves on (a new commit), so a reproduction has to restore the recorded commit *and* patch.
O is reproduced twice: as it is (bitwise on CPU), and with a fault injected into the rerun
(`mcx reproduce --set debug.perturb_params.step=N`, docs/spec.md), which must be reported as a
divergence at that step. Then with its dataset edited, and deleted with the DVC cache emptied: the
recorded version comes back by hash (from the cache, then from the embedded remote) into the
reproduction's worktree, and the rerun is bitwise again; with neither holding it, reproduce refuses.

A second project records one config with two seeds on another machine (this one, with another CPU
model in /proc/cpuinfo: a private mount namespace, see on_another_cpu); reproduced here, the rerun is
judged by the spread between those seeds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import _git, e2e_env, git_head, make_e2e_project, mcx_inprocess, mcx_subprocess, missing

FAST = ["--set", "train.train_iters=12", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=6",
        "--set", "checkpoint.interval=6", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
        "--set", "smoke.resume_check_iters=2"]
PERTURB_STEP = 11  # after the smoke stage's 10 steps: only the full stage is perturbed
SWAP_STEP = 12  # debug.swap_micro_batches_at_step: the full stage's last step trains its 2 micro-batches swapped

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


def losses(path: Path, kind: str = "train") -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def differences(original_dir: Path, rerun_dir: Path) -> str:
    """Where a rerun's records first depart from the original's, stage by stage (for a failure message)."""
    from mcx.report.verdict import TIMING

    out = []
    for stage in ("smoke", "full"):
        a, b = (d / stage / "metrics.jsonl" for d in (original_dir, rerun_dir))
        if not (a.exists() and b.exists()):
            continue
        for x, y in zip(*(map(json.loads, p.read_text().splitlines()) for p in (a, b))):
            diff = {k: (x.get(k), y.get(k)) for k in sorted((set(x) | set(y)) - set(TIMING)) if x.get(k) != y.get(k)}
            if diff:
                out.append(f"{stage} {x.get('kind')} step {x.get('step')}: {diff}")
                break
    return "; ".join(out) or "no record differs"


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


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("repro") / "project")


def _listed(project: Path, run_id: str) -> dict:
    """What ls and compare say about a run: when it was created, its wall time and metrics."""
    row = next(r for r in mcx_inprocess(project, "ls", "--json").json() if r["run_id"] == run_id)
    doc = json.loads(mcx_inprocess(project, "compare", run_id, "--format", "json").out)
    return {"created": row["created"], "metrics": {k: m["runs"][run_id]["value"] for k, m in doc["metrics"].items()}}


@pytest.fixture(scope="module")
def original(project: Path) -> dict:
    """O: trained from commit C plus an untracked file; then the project moves on to a new commit."""
    commit = git_head(project)
    (project / "NOTES.md").write_text("uncommitted work that O was trained with\n")
    res = mcx_inprocess(project, "run", "experiments/tiny.toml", *FAST, "--json", "--quiet")
    assert res.code == 0, res
    summary = res.json()
    assert summary["status"] == "finished"
    summary["listed"] = _listed(project, summary["run_id"])
    spec = project / "experiments" / "tiny.toml"
    spec.write_text(spec.read_text().replace("lr = 3e-3", "lr = 1e-3"))
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "moved on")
    return {**summary, "commit": commit, "dir": project / ".mcx" / "runs" / summary["run_id"]}


@pytest.fixture(scope="module")
def bitwise(project: Path, original: dict):
    """Without --json: the verdict is printed on stdout (the rerun's progress on stderr); the same
    object --json prints is kept in the reproduction's verdict.json."""
    res = mcx_inprocess(project, "reproduce", original["run_id"])
    res.verdict = json.loads((original["dir"] / "reproductions" / "r1" / "verdict.json").read_text())
    return res


@pytest.fixture(scope="module")
def perturbed(project: Path, original: dict, bitwise):
    return mcx_subprocess(project, "reproduce", original["run_id"], "--json",
                          "--set", f"debug.perturb_params.step={PERTURB_STEP}")


@pytest.fixture(scope="module")
def swapped(project: Path, original: dict, perturbed):
    return mcx_inprocess(project, "reproduce", original["run_id"], "--json",
                         "--set", f"debug.swap_micro_batches_at_step={SWAP_STEP}")


def batch_hashes(stage: Path) -> list[tuple[int, list[str]]]:
    return [(r["step"], r["batches"]) for r in map(json.loads, (stage / "ranks" / "batches.dp0.jsonl").read_text()
                                                    .splitlines())]


def test_the_original_was_recorded_with_its_uncommitted_change(original):
    fp = json.loads((original["dir"] / "fingerprint.json").read_text())
    info = fp["code"]["info"]  # provenance, beside the ID: the modules by content are what it hashes
    assert info["commit"] == original["commit"] and info["dirty"] is True and info["changes"] == {"NOTES.md": "untracked"}
    assert "NOTES.md" in fp["side"]["patch"] and set(fp["code"]["id"]) == {"modules"}


def test_a_reproduction_on_the_same_machine_is_bitwise(project, original, bitwise):
    assert bitwise.code == 0, bitwise
    v = bitwise.verdict
    assert v["verdict"] == "bitwise", differences(original["dir"], Path(v["reproduction_dir"]))
    assert f"reproduction r1 of {original['run_id']}: bitwise" in bitwise.out  # the result, on stdout
    assert "steps compared" in bitwise.out and "\x1b[" not in bitwise.out
    assert "reproducing" in bitwise.err and "reproducing" not in bitwise.out  # progress, on stderr
    assert v["run_id"] == original["run_id"] and v["verdict"] == "bitwise" and v["status"] == "finished"
    assert v["divergence"] is None and v["first_difference"] is None
    # Before any number, the batches: every step's micro-batch hashes equal (12 steps, 2 micro-batches each).
    assert v["batches"] == {"same": True, "steps": 12, "dp_ranks": 1, "text": "same batches at every step (12 steps)",
                            "note": None, "first_difference": None}
    assert "same batches at every step (12 steps)" in bitwise.out
    hashes = batch_hashes(original["dir"] / "full")
    assert [s for s, _ in hashes] == list(range(1, 13)) and all(len(h) == 2 and h[0] != h[1] for _, h in hashes)
    assert v["steps"] == 12 and {"train/loss", "valid/loss", "test/loss", "train/grad_norm", "train/lr"} <= set(v["compared"])
    assert v["data_identical"] is True and v["environment_drift"] == [] and v["hardware_drift"] == []
    # mcx's modules are the recorded ones and so is the data: rerun here, though the project has moved on
    # (a new commit), with no tree rebuilt.
    assert v["code"] == {"commit": original["commit"], "patched": False, "worktree": None, "rebuilt": False,
                         "drift": []} and original["commit"] != git_head(project)
    assert "with this project's mcx" in bitwise.err
    assert worktrees(project) == 1
    # Its own run directory, beside (not over) the original's.
    rep = Path(v["reproduction_dir"])
    assert v["reproduction"] == "r1" and rep == original["dir"] / "reproductions" / "r1"
    assert json.loads((rep / "verdict.json").read_text())["verdict"] == "bitwise"
    for stage in ("smoke", "full"):
        assert losses(rep / stage / "metrics.jsonl") == losses(original["dir"] / stage / "metrics.jsonl")
    assert losses(rep / "full" / "metrics.jsonl", "valid") == losses(original["dir"] / "full" / "metrics.jsonl", "valid")
    assert json.loads((original["dir"] / "run.json").read_text())["status"] == "finished"


def test_a_reproduction_leaves_the_originals_record_as_it_was(project, original, bitwise):
    assert bitwise.code == 0, bitwise
    assert _listed(project, original["run_id"]) == original["listed"]  # created, wall time, every metric


def test_the_reproduction_is_its_own_mlflow_run_under_the_original(project, original, bitwise):
    v = bitwise.verdict
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
    assert all(got[s] == want[s] for s in range(1, PERTURB_STEP)), differences(  # identical up to the fault
        original["dir"], Path(v["reproduction_dir"]))
    assert v["divergence"]["step"] == PERTURB_STEP and v["divergence"]["within"] is False
    assert v["batches"]["same"] is True  # the same data: the weights departed, not the batches
    assert len(perturbed.out.strip().splitlines()) == 1  # --json: the verdict object and nothing else on stdout
    assert v["debug"] == [f"debug.perturb_params.step={PERTURB_STEP}"]  # the verdict says what was injected
    assert "fault injection: debug.perturb_params.step" in perturbed.err
    worker_log = (Path(v["reproduction_dir"]) / "full" / "worker.log").read_text()
    assert f"debug.perturb_params: added 0.01 to the model weights before step {PERTURB_STEP}" in worker_log
    assert "fault injection" not in (Path(v["reproduction_dir"]) / "smoke" / "worker.log").read_text()


def test_a_rerun_with_its_micro_batches_swapped_names_the_step_micro_batch_and_rank(original, swapped):
    """The same samples in another order (debug.swap_micro_batches_at_step): the batch hashes say where, before
    any number, and the verdict is diverged whatever the numbers did."""
    assert swapped.code == 1, swapped
    v = swapped.json()
    assert v["verdict"] == "diverged" and v["debug"] == [f"debug.swap_micro_batches_at_step={SWAP_STEP}"]
    first = v["batches"]["first_difference"]
    assert v["batches"]["same"] is False and {k: first[k] for k in ("step", "micro_batch", "dp_rank")} == {
        "step": SWAP_STEP, "micro_batch": 0, "dp_rank": 0}
    assert v["text"].startswith(f"diverged: batches differ first at step {SWAP_STEP}, micro-batch 0, data-parallel "
                                "rank 0: the data order changed; the numbers from there on are not comparable")
    want, got = batch_hashes(original["dir"] / "full"), batch_hashes(Path(v["reproduction_dir"]) / "full")
    assert got[:SWAP_STEP - 1] == want[:SWAP_STEP - 1] and got[SWAP_STEP - 1] == (SWAP_STEP, want[SWAP_STEP - 1][1][::-1])
    rerun = dict(losses(Path(v["reproduction_dir"]) / "full" / "metrics.jsonl"))
    assert all(rerun[s] == l for s, l in losses(original["dir"] / "full" / "metrics.jsonl") if s < SWAP_STEP)
    worker_log = (Path(v["reproduction_dir"]) / "full" / "worker.log").read_text()
    assert f"micro-batches 0 and 1 of step {SWAP_STEP} trained in swapped order" in worker_log


def test_reproduce_sets_debug_keys_only(project, original):
    """`mcx reproduce --set` injects faults; any other key would rerun another experiment: refused (exit 2)
    before a reproduction is started."""
    reps = original["dir"] / "reproductions"
    before = sorted(p.name for p in reps.glob("*"))
    res = mcx_inprocess(project, "reproduce", original["run_id"], "--set", "train.lr=1e-3",
                        "--set", "debug.nan_params_at_step=3")
    assert res.code == 2, res
    assert "'train.lr=1e-3': only debug.* keys (fault injection) can be set" in res.err
    assert "debug.nan_params_at_step" not in res.err and sorted(p.name for p in reps.glob("*")) == before


DATA_MD5 = "78bb169363dc0c20b2eb38a954710a26.dir"  # data.dvc's version of data/ (the quickstart)


def dvc_objects(store: Path, md5: str) -> list[Path]:
    """The objects of directory version ``md5`` in a DVC cache or remote (its .dir listing, then each file)."""
    files = store / "files" / "md5"
    listing = files / md5[:2] / md5[2:]
    return [listing, *(files / e["md5"][:2] / e["md5"][2:] for e in json.loads(listing.read_text()))]


def test_the_run_kept_its_data_version_in_the_dvc_cache_and_remote(project, original):
    """What makes the data restorable by hash later: the version trained on, in the cache and pushed."""
    for store in (project / ".dvc" / "cache", project / ".mcx" / "dvc-remote"):
        objects = dvc_objects(store, DATA_MD5)
        assert len(objects) == 5 and all(p.is_file() for p in objects), store  # .dir + 4 files
    assert "78bb169363dc0c20b2eb38a954710a26.dir" in (project / "data.dvc").read_text()  # not rewritten
    assert not list((project / ".mcx" / "restore").glob("*.dvc"))  # the pointer was only a vehicle
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""  # nothing in the git work tree changed


def test_data_in_another_version_is_seen_as_changed(project, original):
    """data.dvc names another version (a teammate's `dvc add`, pulled with git, not checked out)."""
    from mcx.fingerprint.record import load_record
    from mcx.ops.reproduce import data_changes
    from mcx.spec import loads_spec

    spec = loads_spec((original["dir"] / "spec.toml").read_text())
    record = load_record(project, original["run_id"])
    assert data_changes(project, spec, record) == []
    dvc = project / "data.dvc"
    saved = dvc.read_bytes()
    try:
        dvc.write_text(saved.decode().replace(DATA_MD5, "0123456789abcdef0123456789abcdef.dir"))
        changes = data_changes(project, spec, record)
    finally:
        dvc.write_bytes(saved)
    assert [c.key for c in changes] == ["data.path"]
    # The workspace is checked against data.dvc by content first: it is not the version data.dvc names.
    reason = changes[0].reason
    assert "changed since DVC recorded it in data.dvc" in reason
    assert f"it hashes to {DATA_MD5}, DVC recorded 0123456789abcdef0123456789abcdef.dir" in reason


def test_a_new_reproduction_never_reuses_a_label(project, original, perturbed, swapped, tmp_path):
    """With r1 gone and r2, r3 present the next label is r4, not r3 (whose finished stages would be reused)."""
    from mcx.ops.reproduce import next_label

    reps = original["dir"] / "reproductions"
    assert sorted(p.name for p in reps.iterdir()) == ["r1", "r2", "r3"] and next_label(reps) == "r4"
    shutil.move(reps / "r1", tmp_path / "r1")
    try:
        assert next_label(reps) == "r4"
    finally:
        shutil.move(tmp_path / "r1", reps / "r1")
    assert next_label(tmp_path / "none") == "r1"


def _bad_patch(fp: dict) -> str:
    fp["side"] = {"patch": "diff --git a/gone.txt b/gone.txt\n--- a/gone.txt\n+++ b/gone.txt\n@@ -1 +1 @@\n-a\n+b\n",
                  "patch_encoding": "utf-8"}  # the side data is not hashed: the ID still matches
    return "does not apply"


def _other_module(fp: dict) -> str:
    fp["code"]["id"]["modules"]["mcx/train/loop.py"] = "0" * 64
    return "but its content hashes to"


@pytest.mark.parametrize("damage", [_bad_patch, _other_module], ids=["patch", "module"])
def test_a_damaged_record_is_refused_and_leaves_no_worktree(project, original, perturbed, damage, tmp_path):
    path = original["dir"] / "fingerprint.json"
    saved = path.read_bytes()
    fp = json.loads(saved)
    shown = damage(fp)
    corpus = project / "data" / "quickstart" / "corpus.bin"
    shutil.copy(corpus, tmp_path / "corpus.bin")
    if damage is _bad_patch:  # the patch is applied only where the tree is rebuilt: here, for the data's sake
        corpus.write_bytes(corpus.read_bytes() + b"\0")
    before = set(tree(project / ".mcx"))
    try:
        path.write_text(json.dumps(fp))
        res = mcx_subprocess(project, "reproduce", original["run_id"], "--json")
    finally:
        path.write_bytes(saved)
        shutil.copy(tmp_path / "corpus.bin", corpus)
    assert res.code == 2, res
    assert shown in res.err and "Traceback" not in res.err and res.out == ""
    assert set(tree(project / ".mcx")) - before <= {"file-hashes.json"}
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


# --- data restored by hash (after the label test: these take r4 and r5) ---

def _same_as_original(v: dict, original: dict) -> None:
    rep = Path(v["reproduction_dir"])
    assert v["batches"]["same"] is True, v["batches"]
    for stage in ("smoke", "full"):
        assert losses(rep / stage / "metrics.jsonl") == losses(original["dir"] / stage / "metrics.jsonl")
        job = json.loads((rep / stage / "job.json").read_text())
        assert Path(job["data_dir"]) == Path(v["code"]["worktree"]).resolve() / "data" / "quickstart"  # not the project's


def test_changed_data_is_restored_by_hash_and_the_edit_is_kept(project, original, perturbed, swapped, tmp_path):
    """An edited dataset: the recorded version comes back from the DVC cache into the reproduction's
    worktree; the user's edited copy stays as it is."""
    data, corpus = project / "data", project / "data" / "quickstart" / "corpus.bin"
    shutil.copytree(data, tmp_path / "data")
    edited = corpus.read_bytes() + b"\0"
    corpus.write_bytes(edited)
    try:
        res = mcx_inprocess(project, "reproduce", original["run_id"], "--json")
        kept = corpus.read_bytes()
    finally:
        shutil.rmtree(data)
        shutil.copytree(tmp_path / "data", data)
    assert res.code == 0, res
    v = res.json()
    assert v["verdict"] == "bitwise", differences(original["dir"], Path(v["reproduction_dir"]))
    assert v["status"] == "finished" and v["reproduction"] == "r4"
    assert v["data_restored"] == [{"key": "data.path", "path": "data", "md5": DATA_MD5}]
    assert [c["key"] for c in v["data_changes"]] == ["data.path"]
    assert "changed since DVC recorded it" in v["data_changes"][0]["reason"]
    assert kept == edited
    _same_as_original(v, original)
    said = " ".join(res.err.split())  # Rich wraps long lines
    assert "restored data " + DATA_MD5 in said and "the workspace's copy is left as it is" in said
    assert not Path(v["code"]["worktree"]).exists() and worktrees(project) == 1


def test_deleted_data_is_restored_by_hash_from_the_remote(project, original, perturbed, swapped, tmp_path):
    """data/ deleted and the DVC cache emptied: the version comes from the embedded remote."""
    data, cache = project / "data", project / ".dvc" / "cache"
    shutil.move(data, tmp_path / "data")
    shutil.move(cache, tmp_path / "cache")
    try:
        res = mcx_inprocess(project, "reproduce", original["run_id"], "--json")
        still_gone = not data.exists()
        refetched = all(p.is_file() for p in dvc_objects(cache, DATA_MD5))
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.move(tmp_path / "data", data)
        shutil.move(tmp_path / "cache", cache)
    assert res.code == 0, res
    v = res.json()
    assert v["verdict"] == "bitwise", differences(original["dir"], Path(v["reproduction_dir"]))
    assert v["status"] == "finished" and v["reproduction"] == "r5"
    assert v["data_restored"] == [{"key": "data.path", "path": "data", "md5": DATA_MD5}]
    assert "is missing" in v["data_changes"][0]["reason"]
    assert still_gone and refetched  # fetched into the project's cache, checked out only in the worktree
    _same_as_original(v, original)


def test_data_in_neither_cache_nor_remote_is_refused_with_the_fix(project, original, perturbed, tmp_path):
    corpus = project / "data" / "quickstart" / "corpus.bin"
    saved = corpus.read_bytes()
    cache, remote = project / ".dvc" / "cache", project / ".mcx" / "dvc-remote"
    shutil.move(cache, tmp_path / "cache")
    shutil.move(remote, tmp_path / "remote")
    runs_before = tree(project / ".mcx" / "runs")
    c = client(project)
    mlflow_before = len(c.search_runs([e.experiment_id for e in c.search_experiments()]))
    try:
        corpus.write_bytes(saved + b"\0")
        res = mcx_subprocess(project, "reproduce", original["run_id"], "--json")
    finally:
        corpus.write_bytes(saved)
        for moved, back in ((tmp_path / "cache", cache), (tmp_path / "remote", remote)):
            shutil.rmtree(back, ignore_errors=True)
            shutil.move(moved, back)
    assert res.code == 2, res
    assert res.out == "" and "Traceback" not in res.err and res.err.startswith("mcx: error:")
    assert "changed since DVC recorded it" in res.err  # why a restore was needed
    assert f"version {DATA_MD5} of data is neither in the DVC cache" in res.err and str(remote) in res.err
    assert "dvc push" in res.err and "tracking.dvc_remote" in res.err  # the fixes
    assert "WARNING" not in res.err  # DVC's own complaint is not printed beside mcx's
    assert tree(project / ".mcx" / "runs") == runs_before  # no reproduction label taken
    assert len(c.search_runs([e.experiment_id for e in c.search_experiments()])) == mlflow_before
    assert worktrees(project) == 1


def test_ctrl_c_during_the_rerun_exits_130_and_says_what_to_run(project, original):
    """Ctrl-C while the rerun trains (SIGINT to the process group of `mcx reproduce`, as a terminal sends
    it): the rerun stops, `mcx reproduce` exits 130, as docs/cli.md says, with one line saying that the
    next `mcx reproduce` reruns it from the start; its run ends "interrupted" and the worktree is gone."""
    reps = original["dir"] / "reproductions"
    before = {p.name for p in reps.glob("*")}  # none yet when this test runs alone
    proc = subprocess.Popen([sys.executable, "-m", "mcx", "--project", str(project), "reproduce", original["run_id"]],
                            cwd=project, env=e2e_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # a hang guard: the rerun's first step comes within seconds
        while not any('"kind": "train"' in m.read_text() for m in reps.glob("*/*/metrics.jsonl")
                      if m.parent.parent.name not in before):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("mcx:")]
    assert len(said) == 1 and re.fullmatch(r"mcx: interrupted.*; `mcx reproduce` again reruns it from the start",
                                           said[0]), err[-3000:]
    (label,) = {p.name for p in reps.glob("*")} - before
    assert json.loads((reps / label / "run.json").read_text())["status"] == "interrupted"
    assert worktrees(project) == 1


# --- other hardware: the band is the spread between recorded seeds ---

OTHER_CPU = "mcx-test CPU of another machine"
SEEDS = (1234, 7)
NUDGE_STEP, NUDGE = 11, 1e-4  # a rerun that strays a little: equivalent, not bitwise


@pytest.fixture(scope="module")
def seeds_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("seeds") / "project")


def on_another_cpu(tmp: Path) -> tuple[str, ...]:
    """A command prefix that runs its command where /proc/cpuinfo names OTHER_CPU: a private mount
    namespace (unshare; a user namespace too where this is not root) with a copy of this machine's
    cpuinfo, the model renamed, bind-mounted over it. mcx probes another CPU there; it has no switch for it."""
    real = Path("/proc/cpuinfo").read_text()
    fake = tmp / "cpuinfo"
    fake.write_text(re.sub(r"(?m)^(model name|Model)(\s*):.*$", rf"\1\2: {OTHER_CPU}", real)
                    if re.search(r"(?m)^(model name|Model)\s*:", real) else f"model name\t: {OTHER_CPU}\n{real}")
    prefix = ("unshare", "--mount", *(() if os.geteuid() == 0 else ("--map-root-user",)),
              "sh", "-c", 'mount --bind "$0" /proc/cpuinfo && exec "$@"', str(fake))
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", "from mcx.fingerprint.hardware import cpu_model; "
                                "print(cpu_model())"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        missing("unshare (util-linux) is not installed: the other-hardware reproduction needs a mount namespace")
    if probe.stdout.strip() != OTHER_CPU:
        missing(f"no private mount namespace here (unshare --mount: {probe.stderr.strip()[-300:]}): the "
                "other-hardware reproduction needs one to show another CPU model")
    return prefix


@pytest.fixture(scope="module")
def seeded(seeds_project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """One config trained with two seeds (full stage only), recorded on another CPU."""
    prefix = on_another_cpu(tmp_path_factory.mktemp("cpu"))
    ids = {}
    for seed in SEEDS:
        res = mcx_subprocess(seeds_project, "run", "experiments/tiny.toml", *FAST, "--skip-smoke",
                             "--set", f"train.seed={seed}", "--json", "--quiet", prefix=prefix)
        assert res.code == 0, res
        ids[seed] = res.json()["run_id"]
    return ids


@pytest.fixture(scope="module")
def elsewhere(seeds_project: Path, seeded: dict[int, str]):
    """The first seed's run reproduced here (another CPU), nudged a little after step 10."""
    return mcx_subprocess(seeds_project, "reproduce", seeded[SEEDS[0]], "--json",
                          "--set", f"debug.perturb_params={{step = {NUDGE_STEP}, amount = {NUDGE}}}")


def test_seed_runs_are_the_runs_that_differ_only_in_the_seed(seeds_project, seeded):
    """Copies of a real record changed in one more place than the seed are not seed runs."""
    from mcx.fingerprint.record import record_from_dict, record_to_dict
    from mcx.report.seeds import seed_runs

    a, b = (seeded[s] for s in SEEDS)
    runs = seeds_project / ".mcx" / "runs"
    made = {}
    for what in ("seed only", "lr too", "hardware too"):
        fp = json.loads((runs / b / "fingerprint.json").read_text())
        fp["config"]["id"]["train"]["seed"] = 99
        if what == "lr too":
            fp["config"]["id"]["train"]["lr"] = 1e-3
        if what == "hardware too":
            fp["hardware"]["id"]["cpu"] = "a third CPU"
        rec = record_to_dict(record_from_dict({k: v for k, v in fp.items() if k != "run_id"}))
        shutil.copytree(runs / b, runs / rec["run_id"])
        (runs / rec["run_id"] / "fingerprint.json").write_text(json.dumps(rec))
        made[what] = rec["run_id"]
    try:
        found = [(s.run_id, s.seed) for s in seed_runs(seeds_project, a)]
        from_b = [(s.run_id, s.seed) for s in seed_runs(seeds_project, b)]
    finally:
        for rid in made.values():
            shutil.rmtree(runs / rid)
    # The run itself first, then the others by run ID.
    assert found == [(a, 1234), *sorted([(b, 7), (made["seed only"], 99)])]
    assert from_b == [(b, 7), *sorted([(a, 1234), (made["seed only"], 99)])]
    assert [(s.run_id, s.seed) for s in seed_runs(seeds_project, a)] == [(a, 1234), (b, 7)]


def test_on_other_hardware_the_rerun_is_judged_by_the_seed_spread(seeds_project, seeded, elsewhere):
    from mcx.fingerprint.hardware import cpu_model

    assert elsewhere.code == 0, elsewhere
    v = elsewhere.json()
    a, b = (seeded[s] for s in SEEDS)
    assert v["hardware_drift"] == [{"key": "cpu", "recorded": OTHER_CPU, "now": cpu_model()}]
    assert v["band_source"] == "seed spread" and v["band_sources"] == "seed spread"
    assert v["seed_runs"] == [{"run_id": a, "seed": 1234}, {"run_id": b, "seed": 7}]
    assert v["verdict"] == "equivalent" and v["status"] == "finished" and v["divergence"] is None
    assert v["batches"]["same"] is True  # on another CPU, the same batches: only the nudged numbers differ
    said = " ".join(elsewhere.err.split())
    assert f"band: the seed spread of {a} (seed 1234), {b} (seed 7)" in said  # progress; the verdict is stdout's JSON
    # The band is the spread between the two seeds' losses (a rolling max over 5 steps), found here
    # from their metrics files; the nudged rerun stayed inside it.
    runs = seeds_project / ".mcx" / "runs"
    la, lb = dict(losses(runs / a / "full" / "metrics.jsonl")), dict(losses(runs / b / "full" / "metrics.jsonl"))
    spread = [abs(la[s] - lb[s]) for s in range(1, 13)]
    want = [max(spread[max(0, i - 2): i + 3]) for i in range(12)]
    band = v["bands"]["train/loss"]
    assert band["source"] == "seed spread" and band["rel"] == 0.0
    assert band["abs_per_step"] == {"steps": list(range(1, 13)), "values": want}
    assert v["bands"]["train/lr"]["abs_per_step"]["values"] == [0.0] * 12  # the schedule must match exactly
    first = v["first_difference"]
    assert first["metric"] == "train/loss" and first["step"] == NUDGE_STEP and first["within"] is True
    assert first["band"]["abs_per_step"] == band["abs_per_step"]
    rerun = dict(losses(Path(v["reproduction_dir"]) / "full" / "metrics.jsonl"))
    assert all(rerun[s] == la[s] for s in range(1, NUDGE_STEP))  # identical up to the nudge
    assert all(abs(rerun[s] - la[s]) <= want[s - 1] for s in range(NUDGE_STEP, 13))


# -- locate (D70): the first differing operation, named ------------------------------------------------------

PLANT = {"step": 12, "micro_batch": 1, "module": "decoder.layers.1.mlp.linear_fc2", "amount": 0.01}


@pytest.fixture(scope="module")
def located(project: Path, original: dict, bitwise):
    """A reproduction with a fault planted at one module's output in micro-batch 1 of step 12 (after the smoke
    stage), located against the original: both replayed from their checkpoint at step 6 over step 12."""
    fault = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in PLANT.items()) + "}"
    return mcx_subprocess(project, "reproduce", original["run_id"], "--json", "--locate",
                          "--set", f"debug.perturb_output={fault}", timeout=1800)


def test_reproduce_locate_names_the_planted_operation(original, located):
    assert "Traceback" not in located.err
    v = located.json()
    # 0.01 on one micro-batch's MLP output moves the loss by less than the default band's 1%: not bitwise, and
    # the verdict alone cannot say where; locate can (exit code: the verdict's)
    assert v["verdict"] in ("equivalent", "diverged") and located.code == (v["verdict"] == "diverged"), located
    print("verdict:", v["verdict"], "| locate:", v["locate"]["summary"])  # the worked example of docs/reproduce.md
    loc = v["locate"]
    first = loc["first"]
    assert loc["step"] == PLANT["step"] and loc["differs"] is True
    assert (first["step"], first["micro_batch"], first["phase"], first["module"], first["layer"]) == \
        (12, 1, "forward", PLANT["module"], 2)
    assert first["position"] == {"tp": 0, "pp": 0, "cp": 0, "dp": 0, "ep": 0} and first["inputs_identical"] is True
    # the output of fc2 (a [seq, batch, hidden] tensor) with 0.01 added everywhere: float32 rounding only
    assert first["max_abs"] == pytest.approx(PLANT["amount"], rel=1e-3)
    assert loc["summary"].startswith("step 12, micro-batch 1, layer 2 `mlp.linear_fc2` forward, TP rank 0 (DP 0, PP 0): "
                                     "inputs identical, output differs (max abs 0.01)")
    assert loc["kind"] == "config" and "debug.perturb_output" in loc["cause"]
    label = v["reproduction"]
    for replay in loc["replays"]:  # the replays are their own directories; the runs' records are left alone
        assert Path(replay).parent.name == "replays" and (Path(replay) / "trace" / "rank0.jsonl").is_file()
    assert loc["replays"][0] == str(original["dir"] / "replays" / "step12")
    assert loc["replays"][1] == str(original["dir"] / "reproductions" / label / "replays" / "step12")
    metrics = (original["dir"] / "full" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(line)["step"] for line in metrics) == 12 and not list(
        (original["dir"] / "full" / "checkpoints").glob("*.tmp"))


def test_two_bitwise_equal_runs_locate_nothing(project, original, bitwise, located):
    """The original against its bitwise reproduction, over step 12: the original's replay is reused, the
    reproduction's traced; every record equal (exit 0)."""
    res = mcx_inprocess(project, "locate", original["run_id"], f"{original['run_id']}/r1", "--step", "12", "--json")
    assert res.code == 0, res
    out = res.json()
    assert out["differs"] is False and out["summary"] == "no difference" and out["records"] > 200
    res = mcx_inprocess(project, "locate", original["run_id"], f"{original['run_id']}/r1")
    assert res.code == 0 and "no difference" in res.out and "nothing replayed" in res.out


@pytest.mark.parametrize("args, shown", [
    (["--step", "3"], "no checkpoint of"),  # checkpoints at 6 and 12 only
    (["--step", "40"], "outside the steps both runs trained"),
])
def test_locate_refuses_what_it_cannot_replay(project, original, bitwise, args, shown):
    res = mcx_inprocess(project, "locate", original["run_id"], f"{original['run_id']}/r1", *args)
    assert res.code == 2 and shown in res.err and "Traceback" not in res.err, res
    bad = mcx_inprocess(project, "locate", original["run_id"], "0123456789ab")
    assert bad.code == 2 and "no trained full stage" in bad.err


def test_compare_says_where_two_runs_batches_part(seeds_project, seeded):
    """Two seeds shuffle the data differently: `mcx compare` says so, before any number, from their batch
    hashes (D69); the JSON carries where."""
    a, b = (seeded[s] for s in SEEDS)
    doc = json.loads(mcx_inprocess(seeds_project, "compare", a, b, "--format", "json").out)
    assert doc["batches"]["same"] is False and {k: doc["batches"]["first_difference"][k] for k in (
        "step", "micro_batch", "dp_rank")} == {"step": 1, "micro_batch": 0, "dp_rank": 0}
    md = mcx_inprocess(seeds_project, "compare", a, b, "--format", "md").out
    summary = md.split("### Summary\n\n", 1)[1].split("\n\n", 1)[0]
    assert "Batches: they differ first at step 1, micro-batch 0, data-parallel rank 0" in summary, summary
