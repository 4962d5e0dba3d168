"""The hang watchdog (mcx.launch.watchdog) and each rank's step times (mcx.metrics.ranks), for real.

A two-rank CPU stage of the real worker on the quickstart data: once it has saved a checkpoint, one rank is
stopped with SIGSTOP, so both ranks stop making progress (the other waits in the gradient all-reduce). The
node's watchdog notices, writes every rank's Python stacks into hangs/, kills the attempt and restarts it
(in place under the torchrun launcher; a requeue of the job under Slurm); the workers resume from the newest
checkpoint and the stage finishes with every step once, in metrics.jsonl and in each rank's step file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import quickstart_dataset

from mcx.launch import Placement, TorchrunLauncher, worker_env
from mcx.launch.watchdog import hang_bound
from mcx.metrics.ranks import slowest_rank
from mcx.spec.schema import LaunchSpec, SlurmSpec, WatchdogSpec

REPO = Path(__file__).resolve().parent.parent
STEPS, INTERVAL = 40, 5
# No step for 15 s is a hang here (the tiny model's steps take a fraction of a second; its saves, about one).
POLICY = WatchdogSpec(max_restarts=1, step_factor=1.0, min_seconds=15, startup_seconds=600)


def make_stage(tmp_path: Path, launch: LaunchSpec) -> tuple[Path, object]:
    """A full stage of the quickstart model, 2 CPU ranks data parallel, a checkpoint every INTERVAL steps."""
    from mcx.spec.convert import unstructure
    from mcx.spec.load import load_spec

    spec = load_spec(REPO / "experiments" / "tiny.toml",
                     ["model.num_layers=2", f"train.train_iters={STEPS}", "train.lr_warmup_iters=2",
                      f"train.eval_interval={STEPS}", "train.eval_iters=1", f"checkpoint.interval={INTERVAL}",
                      "tracking.system_metrics_interval_s=0"])
    stage = tmp_path / "runs" / "wd0123456789" / "full"
    stage.mkdir(parents=True)
    job = {"run_id": "wd0123456789", "stage": "full", "spec": unstructure(spec),
           "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 2, "world_size": 2,
                      "sequence_parallel": False},
           "data_dir": str(quickstart_dataset()), "checkpoint_dir": str(stage / "checkpoints"),
           "train_samples_limit": None, "checks": {"resume_check_iters": 3, "loss_window": 3, "min_loss_drop": 0.0},
           "device": "cpu", "output": "quiet"}
    (stage / "job.json").write_text(json.dumps(job))
    return stage, spec


def stop_a_rank_after_a_checkpoint(stage: Path, handle, log: Path, timeout: float = 300) -> int:
    """SIGSTOP rank 1 once a checkpoint is committed; its pid."""
    deadline = time.monotonic() + timeout
    while not (stage / "checkpoints" / "latest").exists() or not (stage / "ranks" / "rank1.json").exists():
        said = log.read_text()[-3000:] if log.exists() else ""
        assert handle.poll() in ("pending", "running"), f"the launch ended before a checkpoint:\n{said}"
        assert time.monotonic() < deadline, f"no checkpoint in {timeout} s:\n{said}"
        time.sleep(0.1)
    pid = json.loads((stage / "ranks" / "rank1.json").read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    return pid


def steps_of(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if '"train"' in line]


def assert_hung_once_and_finished(stage: Path, hang_dir: str, result: dict, log: str) -> None:
    assert result["status"] == "finished" and result["steps"] == STEPS, (result, log[-4000:])
    hung = stage / "hangs" / hang_dir
    record = json.loads((hung / "hang.node0.json").read_text())
    assert record["started"] and record["bound_s"] == POLICY.min_seconds and record["idle_s"] > POLICY.min_seconds
    assert sorted(record["stacks"]) == ["0", "1"], record
    for rank in (0, 1):  # every rank's Python stack: the stopped one and the one waiting for it
        stacks = (hung / f"stacks.rank{rank}.txt").read_text()
        assert record["stacks"][str(rank)] == "py-spy", record
        assert "Trainer.run (mcx/train/loop.py" in stacks, stacks
    assert [p.name for p in (stage / "hangs").iterdir()] == [hang_dir]  # one hang, one restart
    # Resumed from the checkpoint: every step once, in metrics.jsonl and in each rank's own step file.
    assert steps_of(stage / "metrics.jsonl") == list(range(1, STEPS + 1))
    for rank in (0, 1):
        assert steps_of(stage / "ranks" / f"rank{rank}.jsonl") == list(range(1, STEPS + 1))
    slow = slowest_rank(stage)
    assert slow is not None and slow.ranks == 2 and slow.last_step == STEPS


def test_bound_is_the_startup_bound_then_the_step_time_times_the_factor_never_below_the_floor():
    policy = WatchdogSpec(step_factor=10.0, min_seconds=60, startup_seconds=600)
    assert hang_bound(policy, started=False, measured_s=100.0, predicted_s=None) == 600
    assert hang_bound(policy, started=True, measured_s=None, predicted_s=None) == 60
    assert hang_bound(policy, started=True, measured_s=2.0, predicted_s=None) == 60
    assert hang_bound(policy, started=True, measured_s=9.0, predicted_s=3.0) == 90  # the larger reference
    assert hang_bound(policy, started=True, measured_s=None, predicted_s=12.5) == 125  # the plan's, before a measure


@pytest.mark.slow
def test_a_rank_stopped_under_torchrun_is_found_dumped_and_the_stage_restarted_from_its_checkpoint(tmp_path):
    stage, spec = make_stage(tmp_path, LaunchSpec(kind="torchrun", watchdog=POLICY))
    log = stage / "torchrun.log"
    handle = TorchrunLauncher(log=log).start(stage, Placement(world_size=2),
                                             LaunchSpec(kind="torchrun", watchdog=POLICY), worker_env(spec))
    try:
        stop_a_rank_after_a_checkpoint(stage, handle, log)
        outcome = handle.wait(600)
    finally:
        handle.kill()
    text = log.read_text()
    assert outcome.state == "finished", (outcome.detail, text[-4000:])
    assert "restarting the agent (1 of 1)" in text, text[-4000:]
    assert_hung_once_and_finished(stage, "local-1", outcome.result, text)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_rank_stopped_in_a_slurm_job_is_found_dumped_and_the_job_requeued_from_its_checkpoint(tmp_path):
    """The same on the real local Slurm cluster: srun starts the node's watchdog, which starts the agent; the
    watchdog ends the hung attempt and the batch script requeues the job, which resumes from the checkpoint."""
    from test_slurm import CLUSTER_UP

    from mcx.launch import SlurmLauncher

    if not CLUSTER_UP:
        pytest.skip("no Slurm cluster answers `sinfo`: start the local one with `bash .ci/slurm.sh` (as root)")
    launch = LaunchSpec(kind="slurm", slurm=SlurmSpec(time="00:20:00"), watchdog=POLICY)
    stage, spec = make_stage(tmp_path, launch)
    handle = SlurmLauncher(python=sys.executable, poll_interval=1.0).start(stage, Placement(world_size=2), launch,
                                                                           worker_env(spec))
    try:
        stop_a_rank_after_a_checkpoint(stage, handle, handle.log, timeout=600)
        outcome = handle.wait(900)
    finally:
        if handle.poll() in ("pending", "running"):
            handle.cancel()
    text = handle.log.read_text()
    assert outcome.state == "finished" and outcome.restarts == 1, (outcome.detail, text[-4000:])
    assert f"requeueing job {handle.job_id} to resume from its newest checkpoint (restart 1 of 1)" in text, text[-4000:]
    assert_hung_once_and_finished(stage, f"job{handle.job_id}-1", outcome.result, text)


def write_rank_times(stage: Path, medians: dict[int, float], steps: int = 30) -> None:
    (stage / "ranks").mkdir(parents=True, exist_ok=True)
    for rank, seconds in medians.items():
        lines = [json.dumps({"kind": "train", "step": s, "step_time_s": seconds * (1 + 0.01 * (s % 3)), "time": s})
                 for s in range(1, steps + 1)]
        (stage / "ranks" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_the_slowest_rank_is_named_only_when_an_outlier_in_mcx_show_and_its_json(tmp_path):
    """Four ranks' step files: the slowest rank 20% above the others' median is an outlier, and `mcx show` names
    it (text and --json); 5% above is noise, and the show is as before."""
    from rich.console import Console
    from test_track import RID, make_run_dir

    from mcx.ops.records import show_run
    from mcx.report.records_view import render_run

    rdir = make_run_dir(tmp_path)
    (rdir / "run.json").write_text(json.dumps({"status": "finished"}))
    write_rank_times(rdir / "full", {0: 1.0, 1: 1.01, 2: 1.2, 3: 0.99})
    slow = slowest_rank(rdir / "full")
    assert slow is not None and (slow.rank, slow.ranks, slow.last_step, slow.outlier) == (2, 4, 30, True)
    assert slow.ratio == pytest.approx(1.2 / 1.0, rel=0.02)
    shown = show_run(RID, project=tmp_path)
    console = Console(width=200, record=True, force_terminal=False)
    console.print(render_run(shown))
    text = " ".join(console.export_text().split())
    assert "full slowest rank rank 2: 1.21 s a step, 20% slower than the median of the other 3 ranks (1.01 s)" in text
    assert shown.to_dict()["slowest_ranks"]["full"]["rank"] == 2
    write_rank_times(rdir / "full", {0: 1.0, 1: 1.01, 2: 1.05, 3: 0.99})
    assert slowest_rank(rdir / "full").outlier is False
    shown = show_run(RID, project=tmp_path)
    assert shown.slowest_ranks == {} and "slowest_ranks" not in shown.to_dict()
    assert slowest_rank(rdir / "smoke") is None  # no rank wrote a step there


def test_without_py_spy_the_stacks_come_from_the_ranks_own_faulthandler(tmp_path, monkeypatch):
    """A stopped process that opened its rank files (SIGUSR2 -> faulthandler): with py-spy unavailable the
    watchdog's dump signals it, lets it run, and takes what its faulthandler wrote."""
    import subprocess

    from mcx.launch import stacks

    # 'ready' is printed inside the function, so the stop lands in its frame (CI once stopped it a line early)
    code = ("import sys, time; from pathlib import Path; from mcx.train.rankfiles import RankFiles\n"
            "def waiting_in_a_collective():\n    print('ready', flush=True); time.sleep(120)\n"
            "RankFiles(Path(sys.argv[1]), 3, 1); waiting_in_a_collective()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGSTOP)
        monkeypatch.setattr(stacks, "py_spy", lambda: None)
        how = stacks.dump_stacks(proc.pid, 3, tmp_path, tmp_path / "out.txt")
        assert how == "faulthandler (py-spy is not installed)"
        assert "waiting_in_a_collective" in (tmp_path / "out.txt").read_text()
    finally:
        proc.kill()
        proc.wait()
