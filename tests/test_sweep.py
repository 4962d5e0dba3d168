"""Sweeps (`mcx sweep`, docs/sweeps.md): many runs as one experiment, each trial an ordinary run.

On CPU with a shrunk quickstart model (10 steps a trial): a 2x3 grid run two at a time and recorded in
MLflow as a parent with six children; a second sweep sharing a point takes it from the run cache; a seeded
random search proposes what its dry run listed; a sweep interrupted by SIGINT resumes where it stopped; a
hopeless trial is pruned and keeps its checkpoint; every bad sweep is refused (exit 2) with nothing written.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from conftest import E2E_ROOT, IN_CI, e2e_env, make_e2e_project, mcx_subprocess

SMALL = {"extends": "tiny.toml",
         "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 192},
         "train": {"train_iters": 10, "eval_interval": 5, "eval_iters": 1, "lr_warmup_iters": 1},
         "smoke": {"enabled": False}}


def write_sweep(project: Path, name: str, sweep: dict, **tables) -> str:
    data = {**SMALL, "name": name, **tables, "sweep": sweep}
    for key in ("train", "smoke", "model"):
        if key in tables:
            data[key] = {**SMALL.get(key, {}), **tables[key]}
    path = project / "experiments" / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return f"experiments/{name}.toml"


def final(project: Path, run_id: str, key: str = "valid_loss") -> float:
    result = json.loads((project / ".mcx" / "runs" / run_id / "full" / "result.json").read_text())
    return result["final"][key]


# The module's sweeps, written and committed before any runs: a spec file is part of the project's code,
# whose identity every run ID holds (a new untracked file would give every trial another ID).
SWEEPS = {
    "grid": ({"method": "grid", "parallel": 2, "objective": "valid_loss",
              "parameters": {"train.lr": [1e-3, 3e-3], "train.seed": [1, 2, 3]}}, {}),
    "other": ({"method": "grid", "parameters": {"train.lr": [1e-3, 2e-3], "train.seed": [1]}}, {}),
    "rand": ({"method": "random", "max_trials": 2, "seed": 7, "parameters": {
        "train.lr": {"low": 1e-4, "high": 1e-2, "log": True}, "train.seed": {"low": 1, "high": 50}}},
             {"train": {"min_lr": 1e-5}}),
    "resume": ({"method": "grid", "parameters": {"train.lr": [1e-3, 2e-3, 3e-3]}},
               {"train": {"train_iters": 60, "eval_interval": 30}}),  # long enough to catch the second trial training
    "prune": ({"method": "grid", "prune": True, "prune_startup_trials": 1, "prune_warmup_evals": 0,
               "parameters": {"train.lr": [3e-3, 0.5]}}, {"train": {"train_iters": 60}}),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_e2e_project(tmp_path_factory.mktemp("sweep") / "project")
    for name, (sweep, tables) in SWEEPS.items():
        write_sweep(root, name, sweep, **tables)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "sweeps"], cwd=root, check=True)
    return root


@pytest.fixture(scope="module")
def grid(project):
    spec = "experiments/grid.toml"
    res = mcx_subprocess(project, "sweep", spec, "--json")
    assert res.code == 0, res.err[-3000:]
    return spec, res.json()


@pytest.mark.slow
def test_a_grid_sweep_runs_every_point_as_an_ordinary_run_and_ranks_them(project, grid):
    _, out = grid
    trials = sorted(out["trials"], key=lambda t: t["number"])
    assert out["status"] == "finished" and len(trials) == 6 and all(t["state"] == "complete" for t in trials)
    assert [(t["params"]["train.lr"], t["params"]["train.seed"]) for t in trials] == [
        (lr, seed) for lr in (1e-3, 3e-3) for seed in (1, 2, 3)]  # the order written, first key slowest
    assert len({t["run_id"] for t in trials}) == 6
    for t in trials:  # the objective is the run's own recorded metric, and the run is an ordinary one
        assert t["value"] == final(project, t["run_id"])
        spec = (project / ".mcx" / "runs" / t["run_id"] / "spec.toml").read_text()
        assert "[sweep" not in spec and f"lr = {t['params']['train.lr']}" in spec
    values = [t["value"] for t in out["trials"]]
    assert values == sorted(values) and out["best"]["number"] == out["trials"][0]["number"]

    shown = mcx_subprocess(project, "sweep", "show", "grid", "--json")
    assert shown.code == 0 and shown.json()["trials"] == out["trials"]
    table = mcx_subprocess(project, "sweep", "show", "grid")
    assert "best" in table.out and out["best"]["run_id"] in table.out
    assert mcx_subprocess(project, "sweep", "ls").out.split() == ["grid"]

    # MLflow: one parent run for the sweep, the six trials' runs nested under it, the objective by trial
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grid")
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`mcx.record` = 'sweep'")
    assert len(parent) == 1 and parent[0].data.tags["mcx.status"] == "finished"
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent[0].info.run_id}'")
    assert sorted(c.data.tags["mcx.run_id"] for c in children) == sorted(t["run_id"] for t in trials)
    assert all(c.data.tags["mcx.sweep.state"] == "complete" for c in children)
    history = client.get_metric_history(parent[0].info.run_id, "objective")
    assert sorted((m.step, m.value) for m in history) == sorted((t["number"], t["value"]) for t in trials)


@pytest.mark.slow
def test_two_sweeps_sharing_a_point_train_it_once(project, grid):
    _, first = grid
    shared = next(t for t in first["trials"] if t["params"] == {"train.lr": 1e-3, "train.seed": 1})
    metrics = project / ".mcx" / "runs" / shared["run_id"] / "full" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    spec = "experiments/other.toml"
    planned = mcx_subprocess(project, "sweep", spec, "--dry-run", "--json").json()
    assert [(t["run_id"], t["cached"]) for t in planned["trials"]][0] == (shared["run_id"], True)
    res = mcx_subprocess(project, "sweep", spec, "--json")
    assert res.code == 0, res.err[-3000:]
    by_lr = {t["params"]["train.lr"]: t for t in res.json()["trials"]}
    assert by_lr[1e-3]["run_id"] == shared["run_id"] and by_lr[1e-3]["cached"] is True
    assert by_lr[1e-3]["value"] == shared["value"] and metrics.stat().st_mtime_ns == before  # not trained again
    assert by_lr[2e-3]["cached"] is False and by_lr[2e-3]["state"] == "complete"


@pytest.mark.slow
def test_the_sweep_report_and_baseline_use_its_best_trial(project, grid, tmp_path):
    _, out = grid
    best = out["best"]["run_id"]
    html = tmp_path / "grid.html"
    made = mcx_subprocess(project, "compare", "--sweep", "grid", "--format", "html", "-o", str(html))
    assert made.code == 0, made.err
    page = html.read_text()
    assert 'id="sweep"' in page and 'id="sweep-0"' in page and 'id="sweep-1"' in page  # objective vs each parameter
    assert "valid_loss vs train.lr" in page and best in page
    doc = json.loads(mcx_subprocess(project, "compare", "--sweep", "grid", "--format", "json").out)
    assert doc["runs"][0]["run_id"] == best and len(doc["runs"]) == 5  # the best five trials' runs
    assert len(doc["sweep"]["trials"]) == 6
    res = mcx_subprocess(project, "baseline", "set", "main", "sweep:grid", "--json")
    assert res.code == 0 and res.json()["run_id"] == best
    bad = mcx_subprocess(project, "baseline", "set", "main", "sweep:nope")
    assert bad.code == 2 and "no sweep nope" in bad.err


@pytest.mark.slow
def test_a_sweep_defined_otherwise_under_the_same_name_is_refused(project, grid):
    spec, _ = grid
    res = mcx_subprocess(project, "sweep", spec, "--set", 'sweep.parameters={"train.lr"=[5e-3]}')
    assert res.code == 2 and "was started from another definition" in res.err, res.err


@pytest.mark.slow
def test_a_seeded_random_search_proposes_the_trials_its_dry_run_lists(project):
    spec = "experiments/rand.toml"
    listed = [mcx_subprocess(project, "sweep", spec, "--dry-run", "--json").json() for _ in range(2)]
    assert listed[0]["trials"] == listed[1]["trials"]
    params = [t["params"] for t in listed[0]["trials"]]
    assert all(1e-4 <= p["train.lr"] <= 1e-2 and isinstance(p["train.seed"], int) for p in params)
    other = mcx_subprocess(project, "sweep", spec, "--dry-run", "--json", "--set", "sweep.seed=8").json()
    assert [t["params"] for t in other["trials"]] != params
    tpe = mcx_subprocess(project, "sweep", spec, "--dry-run", "--json", "--set", 'sweep.method="tpe"',
                         "--set", "sweep.max_trials=12").json()
    assert len(tpe["trials"]) == 10 and tpe["max_trials"] == 12  # the random start-up; the rest need results
    ran = mcx_subprocess(project, "sweep", spec, "--json")
    assert ran.code == 0, ran.err[-3000:]
    assert sorted((t["number"], t["params"]) for t in ran.json()["trials"]) == sorted(enumerate(params))
    # a longer search is the same sweep: its first trials stay, the next is the one a longer dry run lists
    longer = mcx_subprocess(project, "sweep", spec, "--dry-run", "--json", "--set", "sweep.max_trials=3").json()
    assert [t["params"] for t in longer["trials"]][:2] == params
    more = mcx_subprocess(project, "sweep", spec, "--json", "--set", "sweep.max_trials=3")
    assert more.code == 0, more.err[-3000:]
    assert sorted((t["number"], t["params"]) for t in more.json()["trials"]) == sorted(
        enumerate(t["params"] for t in longer["trials"]))
    assert "trial 0" not in more.err and "trial 2" in more.err


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_where_it_stopped(project):
    spec = "experiments/resume.toml"
    proc = subprocess.Popen([sys.executable, "-m", "mcx", "--project", str(project), "sweep", spec], cwd=project,
                            env=e2e_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = project / ".mcx" / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    deadline, reached = time.monotonic() + 600, False
    while time.monotonic() < deadline and proc.poll() is None:  # the first trial done, the second training
        mine = [d for d in runs.iterdir() if d not in before] if runs.is_dir() else []
        status = {d: json.loads((d / "run.json").read_text()).get("status") if (d / "run.json").is_file() else None
                  for d in mine}
        training = [d for d, s in status.items() if s == "running" and (d / "full" / "metrics.jsonl").is_file()]
        if list(status.values()).count("finished") == 1 and training:
            reached = True
            break
        time.sleep(0.2)
    assert reached, "the sweep ended (or hung) before its second trial trained"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    stopped = mcx_subprocess(project, "sweep", "show", "resume", "--json").json()
    states = sorted(t["state"] for t in stopped["trials"])
    assert states == ["complete", "running"] and stopped["status"] == "running"
    first = next(t for t in stopped["trials"] if t["state"] == "complete")
    left = next(t for t in stopped["trials"] if t["state"] == "running")
    left_dir = project / ".mcx" / "runs" / left["run_id"]
    assert json.loads((left_dir / "run.json").read_text())["status"] == "interrupted"
    assert (left_dir / "full" / "checkpoints" / "latest").is_file()  # it saved where it stopped

    again = mcx_subprocess(project, "sweep", spec, "--json")
    assert again.code == 0, again.err[-3000:]
    done = {t["number"]: t for t in again.json()["trials"]}
    assert sorted(done) == [0, 1, 2] and all(t["state"] == "complete" for t in done.values())
    assert done[first["number"]]["run_id"] == first["run_id"] and done[left["number"]]["run_id"] == left["run_id"]
    assert f"trial {left['number']} full stage" in again.err and "resuming from" in again.err  # its own checkpoint
    assert f"trial {first['number']}" not in again.err  # done before: not run again


@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_and_keeps_its_checkpoint(project):
    spec = "experiments/prune.toml"
    res = mcx_subprocess(project, "sweep", spec, "--json")
    assert res.code == 0, res.err[-3000:]
    by_lr = {t["params"]["train.lr"]: t for t in res.json()["trials"]}
    assert by_lr[3e-3]["state"] == "complete" and by_lr[0.5]["state"] == "pruned", by_lr
    assert "pruned at step" in by_lr[0.5]["detail"]
    run_dir = project / ".mcx" / "runs" / by_lr[0.5]["run_id"]
    run = json.loads(run_dir.joinpath("run.json").read_text())
    assert run["status"] == "pruned"
    steps = [json.loads(x)["step"] for x in (run_dir / "full" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert max(steps) < 60  # stopped early
    latest = (run_dir / "full" / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "full" / "checkpoints" / latest).is_dir()  # it can be trained on


# -- bad sweeps --------------------------------------------------------------------------------------------

BAD = {
    "empty grid": ({"parameters": {}}, {}, "sweep.parameters: is empty"),
    "empty axis": ({"parameters": {"train.lr": []}}, {}, 'sweep.parameters."train.lr": has no values'),
    "unknown key": ({"parameters": {"train.learning_rate": [1e-3]}}, {}, "is not a spec key"),
    "identity-free key": ({"parameters": {"checkpoint.keep": [1, 2]}}, {}, "is not part of a run's identity"),
    "bad value": ({"parameters": {"train.lr": [1e-3, "fast"]}}, {}, "expected a number"),
    "never recorded": ({"parameters": {"train.lr": [1e-3]}}, {"train": {"eval_interval": 50}},
                       "'valid_loss' is never recorded"),
    "unknown objective": ({"objective": "accuracy", "parameters": {"train.lr": [1e-3]}}, {},
                          "'accuracy' is not a metric mcx records"),
    "range in a grid": ({"parameters": {"train.lr": {"low": 1e-4, "high": 1e-2}}}, {}, "a grid needs its values"),
    "random without a count": ({"method": "random", "parameters": {"train.lr": [1e-3]}}, {},
                               "sweep.max_trials: method \"random\" needs a number of trials"),
    "prune without evaluations": ({"prune": True, "objective": "train_loss", "parameters": {"train.lr": [1e-3]}}, {},
                                  "sweep.prune"),
    "over budget": ({"parameters": {"train.lr": [1e-3, 2e-3]}},
                    {"hardware": {"gpu": "H200"}, "train": {"train_iters": 2_000_000}, "budget": {"max_gpu_hours": 0.0001}},
                    "above budget.max_gpu_hours"),
}


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """A quickstart project that nothing is trained in."""
    return make_e2e_project(tmp_path_factory.mktemp("bad-sweeps") / "project")


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_sweep_is_refused_with_nothing_written(bare, case):
    sweep, tables, words = BAD[case]
    spec = write_sweep(bare, "bad", {"method": "grid", **sweep}, **tables)
    res = mcx_subprocess(bare, "sweep", spec)  # no terminal: over budget is refused, not asked
    assert res.code == 2 and words in res.err and "Traceback" not in res.err, res.err
    assert not (bare / ".mcx" / "sweeps").exists() and not (bare / ".mcx" / "runs").exists()


def test_a_spec_without_a_sweep_table_is_named(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    res = mcx_subprocess(project, "sweep", str(E2E_ROOT / "experiments" / "tiny.toml"))
    assert res.code == 2 and "has no [sweep] table" in res.err
    shown = mcx_subprocess(project, "sweep", "show", "nope")
    assert shown.code == 2 and "no sweep nope" in shown.err


def test_concurrent_trials_get_disjoint_gpus_or_are_refused():
    """sweep.parallel trials at once on this machine's GPUs: each its own CUDA_VISIBLE_DEVICES set; more than
    fit is bad input; CPU trials and Slurm jobs take none of them."""
    from mcx.errors import InputError
    from mcx.ops.sweep_plan import PlannedTrial, gpu_slots
    from mcx.spec import load_spec

    spec = load_spec(E2E_ROOT / "experiments" / "tiny.toml",
                     ["sweep.parameters={\"train.lr\"=[1e-3, 2e-3]}", "sweep.parallel=2"])

    def planned(gpus: int) -> list[PlannedTrial]:
        return [PlannedTrial({}, spec, None, None, False, gpus) for _ in range(2)]

    assert gpu_slots(spec, planned(1), ["0", "1", "2"]) == [("0",), ("1",)]
    assert gpu_slots(spec, planned(2), ["4", "5", "6", "7"]) == [("4", "5"), ("6", "7")]
    assert gpu_slots(spec, planned(0), ["0"]) is None
    with pytest.raises(InputError, match=r"sweep.parallel = 2 runs 2 trials of 2 GPU\(s\) at once.*at most 1"):
        gpu_slots(spec, planned(2), ["0", "1", "2"])


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("sbatch") is None and not IN_CI,  # in CI: runs, and fails without Slurm
                    reason="no Slurm cluster here: start the local one with `bash .ci/slurm.sh start` (as root)")
def test_on_slurm_each_trial_is_its_own_job_and_they_run_at_once(tmp_path):
    """launch.kind = "slurm": the sweep submits `parallel` trials' jobs at once (the local test cluster: one node,
    2 CPUs, each trial one CPU process) and waits on each."""
    project = make_e2e_project(tmp_path / "project")
    spec = write_sweep(project, "slurm", {"method": "grid", "parallel": 2, "parameters": {"train.seed": [1, 2]}},
                       hardware={"gpu": "cpu"}, launch={"kind": "slurm", "slurm": {"partition": "debug",
                                                                                 "time": "00:20:00"}})
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "sweep"], cwd=project, check=True)
    res = mcx_subprocess(project, "sweep", spec, "--json")
    assert res.code == 0, res.err[-3000:]
    trials = res.json()["trials"]
    assert [t["state"] for t in trials] == ["complete", "complete"]
    spans = []
    for t in trials:
        full = project / ".mcx" / "runs" / t["run_id"] / "full"
        assert (full / "sbatch.sh").is_file() and "#SBATCH --partition=debug" in (full / "sbatch.sh").read_text()
        # The worker's life, from its first log line to its last step: the steps alone (under a second each) need
        # not overlap on a loaded machine, but two workers alive at once do only where both jobs ran at once.
        first = (full / "worker.log").read_text().splitlines()[0]
        started = datetime.datetime.strptime(first[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        stamps = [json.loads(x)["time"] for x in (full / "metrics.jsonl").read_text().splitlines()]
        spans.append((started, max(stamps)))
    assert max(s[0] for s in spans) < min(s[1] for s in spans), spans  # both workers ran at the same time
