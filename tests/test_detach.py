"""`mcx run --detach`, `mcx status`, `logs`, `cancel` against the real local Slurm cluster (.ci/slurm.sh) and a
real project (git, DVC, the embedded MLflow store): the chain goes on when the terminal that started it is
killed, is recorded, and a cancelled run keeps its checkpoint and resumes from it (D64)."""

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
ON_SLURM = ["--set", "launch.kind=slurm", "--set", 'launch.slurm.time="00:15:00"', "--set", 'hardware.gpu="cpu"']
# The quickstart's chain, short: smoke stage (10 steps, its checks), then the full stage (12 steps).
CHAIN = ["--set", "train.train_iters=12", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=6",
         "--set", "checkpoint.interval=6", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
         "--set", "smoke.resume_check_iters=2", *ON_SLURM]
# A full stage long enough to be cancelled after a checkpoint.
LONG = ["--set", "train.train_iters=40", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=100",
        "--set", "checkpoint.interval=4", "--skip-smoke", *ON_SLURM]

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


def test_a_detached_run_outlives_its_killed_terminal_and_is_recorded(project: Path):
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

    # Follows every stage's worker log until the run has ended, then returns.
    follow = mcx_subprocess(project, "logs", run_id, "-f", "--rank", "0", timeout=900)
    assert follow.code == 0, follow
    assert f"stage smoke of run {run_id}" in follow.out and f"stage full of run {run_id}" in follow.out
    assert "smoke check resume_bitwise: passed" in follow.out
    assert all("[rank 0]" in line for line in follow.out.splitlines() if line[:4].isdigit())

    ended = mcx_json(project, "status", run_id)  # the log stops only once the supervisor let go of the run
    assert ended["state"] == "finished" and ended["supervisor"] is None
    full = ended["stages"]["full"]
    assert full["queue"] in ("COMPLETED", "ENDED") and full["step"] == 12 and full["train_iters"] == 12
    assert full["last_checkpoint"].endswith("iter_0000012") and full["loss"] > 0 and full["tokens_per_s"] > 0
    smoke_job, full_job = ended["stages"]["smoke"]["job_id"], full["job_id"]
    assert smoke_job != full_job and f"mcx: job {full_job} attempt 1" in (rdir / "full" / f"slurm-{full_job}.out").read_text()
    assert mcx_json(project, "status") == []

    shown = mcx_json(project, "show", run_id)
    assert shown["status"] == "finished" and {s: v["status"] for s, v in shown["stages"].items()} == {
        "smoke": "finished", "full": "finished"}
    assert shown["tracking"]["pending_ops"] == 0  # every record reached MLflow
    from test_e2e import children, parent_runs

    parent = parent_runs(project, run_id)[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["mcx.status"] == "finished"
    assert {s: k.info.status for s, k in children(project, parent).items()} == {"smoke": "FINISHED", "full": "FINISHED"}
    assert "mcx supervisor: ended" in log.read_text() and "exit code 0" in log.read_text()

    # Bad input: a run ID that is none, one this project lacks, a stage the run has not, a run that ended.
    for args, said in ((["status", "zzz"], "is not a run ID"), (["logs", "0" * 12], "no run 000000000000"),
                       (["logs", run_id, "--stage", "nope"], "invalid choice"),
                       (["cancel", run_id], "is not running or queued (it is finished)")):
        res = mcx_subprocess(project, *args)
        assert res.code == 2 and said in res.err and "Traceback" not in res.err and res.out == "", res


def test_cancel_keeps_a_checkpoint_and_the_run_resumes_from_it(project: Path):
    sent = mcx_json(project, "run", SPEC, *LONG, "--detach")  # the run ID and its job, once submitted
    run_id, (job,) = sent["run_id"], sent["jobs"]
    assert sent["detached"] and job["stage"] == "full" and job["kind"] == "slurm" and job["job_id"].isdigit()
    assert Path(sent["supervisor"]["log"]).is_file()

    def saved():
        """the full stage saved a checkpoint"""
        stage = mcx_json(project, "status", run_id)["stages"]["full"]
        return stage if stage["last_checkpoint"] else None

    running = wait_until(saved, 600)
    assert running["job_id"] == job["job_id"] and running["queue"] == "RUNNING" and running["eta_s"] is not None
    listed = mcx_subprocess(project, "ls", "--json")
    assert {r["run_id"]: r["status"] for r in listed.json()}[run_id] == "running"

    done = mcx_json(project, "cancel", run_id)  # returns once the supervisor recorded the end
    assert done["settled"] and done["state"] == "interrupted"
    assert done["stopped"] == [{"stage": "full", "kind": "slurm", "job_id": job["job_id"]}]
    kept = Path(done["last_checkpoint"])
    assert kept.is_dir() and kept.name.startswith("iter_")
    subprocess.run(["scontrol", "show", "job", job["job_id"]], check=True, capture_output=True, text=True)
    after = mcx_json(project, "status", run_id)
    assert after["stages"]["full"]["queue"] in ("CANCELLED", "ENDED") and after["stages"]["full"]["status"] == "interrupted"
    run_json = json.loads((project / ".mcx" / "runs" / run_id / "run.json").read_text())
    assert run_json["status"] == "interrupted" and "interrupted by mcx cancel" in run_json["summary"]["error"]

    again = mcx_subprocess(project, "run", SPEC, *LONG, "--json", "--quiet", timeout=900)  # the same command
    assert again.code == 0, again
    assert f"resuming from {kept.name}" in again.err
    assert again.json()["status"] == "finished" and again.json()["run_id"] == run_id
    steps = [json.loads(line)["step"] for line in (kept.parent.parent / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    resumed_at = int(kept.name.removeprefix("iter_"))
    assert steps[-(40 - resumed_at):] == list(range(resumed_at + 1, 41))  # every step after the checkpoint, once
