"""`mcx run --detach`, `mcx status`, `logs`, `cancel` against the real local Slurm cluster (.ci/slurm.sh) and a
real project (git, DVC, the embedded MLflow store): the chain goes on when the terminal that started it is
killed, a cancelled run keeps its checkpoint and resumes from it, and the run is recorded (D64)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import IN_CI, e2e_env, make_e2e_project, mcx_subprocess

SPEC = "experiments/tiny.toml"
# The quickstart's chain, short: a smoke stage of 10 steps and its checks, then a full stage of 40 steps that
# saves a checkpoint every 4, long enough to be cancelled after one.
CHAIN = ["--set", "train.train_iters=40", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=20",
         "--set", "checkpoint.interval=4", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
         "--set", "smoke.resume_check_iters=2", "--set", "launch.kind=slurm", "--set", 'launch.slurm.time="00:20:00"',
         "--set", 'hardware.gpu="cpu"']
STEPS = 40

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env"),
              pytest.mark.skipif(shutil.which("sbatch") is None and not IN_CI,  # in CI: runs, and fails without Slurm
                                 reason="no Slurm cluster here: start the local one with `bash .ci/slurm.sh start` (as root)")]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("detach") / "project")


def mcx_json(project: Path, *args: str):
    res = mcx_subprocess(project, *args, "--json", timeout=600)
    assert res.code == 0, res
    return res.json()


def wait_until(what, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s: {what.__doc__}")


def test_a_detached_run_outlives_its_terminal_is_cancelled_resumed_and_recorded(project: Path):
    """One run, so the cluster's time goes on few jobs: --detach with the terminal killed, status while it trains,
    cancel after a checkpoint of the full stage, the same command resuming it (its smoke stage reused), logs -f
    following the rest, and the records."""
    argv = [sys.executable, "-m", "mcx", "--project", str(project), "run", SPEC, *CHAIN, "--detach"]
    # The terminal: its own process group, SIGKILLed as soon as the supervisor has started, before it answers.
    term = subprocess.Popen(argv, cwd=project, env=e2e_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)

    def supervisor_started():
        """the supervisor wrote its first line"""
        logs = list((project / ".mcx" / "runs").glob("*/supervisor.log"))
        return logs[0] if logs and logs[0].read_text().startswith("mcx supervisor: pid") else None

    log = wait_until(supervisor_started, 300, every=0.2)
    os.killpg(term.pid, signal.SIGKILL)
    term.wait()
    rdir = log.parent
    run_id = rdir.name

    active = wait_until(lambda: mcx_json(project, "status"), 120)  # every active run of the project
    assert [r["run_id"] for r in active] == [run_id]
    now = mcx_json(project, "status", run_id)
    assert now["state"] in ("queued", "running") and now["supervisor"]["pid"] != term.pid
    assert set(now["stages"]) == {"smoke", "full"}

    def saved():
        """the full stage saved a checkpoint"""
        stage = mcx_json(project, "status", run_id)["stages"]["full"]
        return stage if stage["last_checkpoint"] else None

    running = wait_until(saved, 900)
    assert running["queue"] == "RUNNING" and running["kind"] == "slurm" and running["eta_s"] is not None
    smoke = mcx_json(project, "status", run_id)["stages"]["smoke"]
    assert smoke["status"] == "finished" and smoke["step"] == 10 and smoke["job_id"] != running["job_id"]
    listed = mcx_subprocess(project, "ls", "--json")
    assert {r["run_id"]: r["status"] for r in listed.json()}[run_id] == "running"

    done = mcx_json(project, "cancel", run_id)  # returns once the supervisor recorded the end
    assert done["settled"] and done["state"] == "interrupted"
    assert done["stopped"] == [{"stage": "full", "kind": "slurm", "job_id": running["job_id"]}]
    kept = Path(done["last_checkpoint"])
    assert kept.is_dir() and kept.name.startswith("iter_")
    after = mcx_json(project, "status", run_id)["stages"]["full"]
    assert after["queue"] in ("CANCELLED", "ENDED") and after["status"] == "interrupted"
    run_json = json.loads((rdir / "run.json").read_text())
    assert run_json["status"] == "interrupted" and "interrupted by mcx cancel" in run_json["summary"]["error"]
    assert "exit code 130" in log.read_text()

    again = mcx_json(project, "run", SPEC, *CHAIN, "--detach")  # the same command: the run ID and its job
    (job,) = again["jobs"]
    assert again["run_id"] == run_id and job["stage"] == "full" and job["job_id"] != running["job_id"]
    # Follows the full stage's worker log until the run has ended, then returns.
    follow = mcx_subprocess(project, "logs", run_id, "-f", "--rank", "0", "--stage", "full", timeout=900)
    assert follow.code == 0, follow
    assert follow.out.count(f"stage full of run {run_id}") == 2  # the cancelled attempt's and the resumed one's
    assert all("[rank 0]" in line for line in follow.out.splitlines() if line[:4].isdigit())
    assert f"resuming from {kept.name}" in log.read_text()

    ended = mcx_json(project, "status", run_id)  # the log stops only once the supervisor let go of the run
    assert ended["state"] == "finished" and ended["supervisor"] is None and mcx_json(project, "status") == []
    full = ended["stages"]["full"]
    assert full["queue"] in ("COMPLETED", "ENDED") and full["step"] == STEPS and full["job_id"] == job["job_id"]
    assert full["last_checkpoint"].endswith(f"iter_{STEPS:07d}") and full["loss"] > 0 and full["tokens_per_s"] > 0
    resumed_at = int(kept.name.removeprefix("iter_"))
    steps = [json.loads(line)["step"] for line in (rdir / "full" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps[-(STEPS - resumed_at):] == list(range(resumed_at + 1, STEPS + 1))  # each step after it, once

    shown = mcx_json(project, "show", run_id)
    assert shown["status"] == "finished" and {s: v["status"] for s, v in shown["stages"].items()} == {
        "smoke": "finished", "full": "finished"}
    assert shown["tracking"]["pending_ops"] == 0  # every record reached MLflow
    from test_e2e import parent_runs

    parent = parent_runs(project, run_id)[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["mcx.status"] == "finished"

    # Bad input: a run ID that is none, one this project lacks, a stage that is none, a run that ended.
    for args, said in ((["status", "zzz"], "is not a run ID"), (["logs", "0" * 12], "no run 000000000000"),
                       (["logs", run_id, "--stage", "nope"], "invalid choice"),
                       (["cancel", run_id], "is not running or queued (it is finished)")):
        res = mcx_subprocess(project, *args)
        assert res.code == 2 and said in res.err and "Traceback" not in res.err and res.out == "", res
