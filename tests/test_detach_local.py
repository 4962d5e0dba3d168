"""`mcx run --detach` without a cluster (D64): the supervisor runs the chain with the local launcher, and with
torchrun, after the command that started it has returned; `mcx status`, `cancel` and the same command resuming
work as on Slurm (tests/test_detach.py), the run recorded at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_e2e_project
from test_detach import mcx_json, wait_until  # the Slurm test's helpers

SPEC = "experiments/tiny.toml"
STEPS = 120
# The quickstart's chain: a smoke stage of 10 steps, then a full stage that saves a checkpoint every 4, long
# enough (about 20 s here) to be cancelled after its first ones.
CHAIN = ["--set", f"train.train_iters={STEPS}", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=20",
         "--set", "checkpoint.interval=4", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
         "--set", "smoke.resume_check_iters=2", "--set", 'hardware.gpu="cpu"']

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("detach_local") / "project")


def finished(project: Path, run_id: str):
    """the run finished and its supervisor let go of it"""
    now = mcx_json(project, "status", run_id)
    return now if now["state"] == "finished" and now["supervisor"] is None else None


def test_a_detached_local_run_is_cancelled_after_a_checkpoint_and_the_same_command_resumes_it(project: Path):
    started = mcx_json(project, "run", SPEC, *CHAIN, "--detach")  # returns once the supervisor has started
    run_id = started["run_id"]
    rdir = project / ".mcx" / "runs" / run_id

    def saved():
        """the full stage saved a checkpoint"""
        stage = mcx_json(project, "status", run_id)["stages"]["full"]
        return stage if stage["last_checkpoint"] else None

    running = wait_until(saved, 600)
    assert running["kind"] == "local" and running["step"] < STEPS and running["eta_s"] is not None, running
    done = mcx_json(project, "cancel", run_id)
    assert done["settled"] and done["state"] == "interrupted", done
    kept = Path(done["last_checkpoint"])
    assert kept.is_dir() and json.loads((rdir / "run.json").read_text())["status"] == "interrupted"

    again = mcx_json(project, "run", SPEC, *CHAIN, "--detach")  # the same command: the same run, resumed
    assert again["run_id"] == run_id
    ended = wait_until(lambda: finished(project, run_id), 600)
    assert ended["stages"]["full"]["step"] == STEPS and mcx_json(project, "status") == []
    resumed_at = int(kept.name.removeprefix("iter_"))
    steps = [json.loads(line)["step"] for line in (rdir / "full" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps[-(STEPS - resumed_at):] == list(range(resumed_at + 1, STEPS + 1))  # each step after it, once
    assert f"resuming from {kept.name}" in (rdir / "supervisor.log").read_text()
    shown = mcx_json(project, "show", run_id)
    assert shown["status"] == "finished" and shown["tracking"]["pending_ops"] == 0


def test_a_detached_torchrun_run_finishes_and_is_recorded(project: Path):
    """Two data-parallel processes under torchrun, started by the supervisor."""
    argv = [*CHAIN, "--set", 'launch.kind="torchrun"', "--set", "hardware.gpus_per_node=2",
            "--set", "train.train_iters=8", "--set", "train.eval_interval=4"]
    run_id = mcx_json(project, "run", SPEC, *argv, "--detach")["run_id"]
    ended = wait_until(lambda: finished(project, run_id), 600)
    full = ended["stages"]["full"]
    assert full["kind"] == "torchrun" and full["step"] == 8, full
    shown = mcx_json(project, "show", run_id)
    assert shown["status"] == "finished" and shown["tracking"]["pending_ops"] == 0
    assert json.loads((project / ".mcx" / "runs" / run_id / "full" / "job.json").read_text())["layout"]["dp"] == 2
