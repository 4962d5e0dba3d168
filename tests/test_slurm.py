"""The Slurm launcher against the real local cluster that `.ci/slurm.sh` starts.

Each test submits tests/launch_probe.py (a small real worker with the job contract) through
sbatch and follows the job to its end: completion, scancel, time limit, requeue and resume.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcx.launch import SlurmHandle, SlurmLauncher, worker_env
from mcx.launch.slurm import parse_job, query_job
from mcx.spec.schema import DataSpec, ExperimentSpec, LaunchSpec, ModelSpec, SlurmSpec, TrainSpec


def _cluster_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


CLUSTER_UP = _cluster_answers()
# In CI the cluster is part of the test environment: its absence fails these tests, not skips them.
REQUIRED = bool(os.environ.get("CI"))

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not CLUSTER_UP and not REQUIRED,
        reason="no Slurm cluster answers `sinfo`: start the local one with `bash .ci/slurm.sh` (as root)",
    ),
]


@pytest.fixture(autouse=True)
def _cluster_required() -> None:
    if not CLUSTER_UP:
        pytest.fail("CI is set but no Slurm cluster answers `sinfo`: `bash .ci/slurm.sh start` failed (see its output)")

TESTS = Path(__file__).resolve().parent
PROBE_ENV = {"PYTHONPATH": str(TESTS)}
HOSTILE = "a b 'q' \"d\" $(touch INJECTED) `touch INJECTED` ; & | $HOME %j"


@pytest.fixture
def handles() -> Iterator[list[SlurmHandle]]:
    """Handles of the jobs a test submits; any still queued or running at teardown is cancelled."""
    started: list[SlurmHandle] = []
    yield started
    for handle in started:
        info = query_job(handle.job_id)
        if info is not None and info.state in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "CONFIGURING"):
            handle.cancel()


def submit(handles: list[SlurmHandle], stage_dir: Path, world_size: int, env: dict, **slurm) -> SlurmHandle:
    launcher = SlurmLauncher(module="launch_probe", python=sys.executable, poll_interval=0.5)
    launch = LaunchSpec(kind="slurm", slurm=SlurmSpec(**{"time": "00:10:00", **slurm}))
    handle = launcher.start(stage_dir, {"world_size": world_size}, launch, {**env, **PROBE_ENV})
    handles.append(handle)
    return handle


def make_stage(tmp_path: Path, name: str = "smoke", **job) -> Path:
    d = tmp_path / "run0123" / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps(job))
    return d


def metric_steps(stage_dir: Path) -> list[int]:
    path = stage_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def wait_for_step(handle: SlurmHandle, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = metric_steps(handle.stage_dir)
        if steps and steps[-1] >= step:
            return
        time.sleep(0.2)
    log = handle.log.read_text() if handle.log.exists() else "(no log)"
    raise AssertionError(f"job {handle.job_id} reached no step {step} in {timeout} s; log:\n{log}")


def squeue_field(job_id: str, code: str) -> str:
    proc = subprocess.run(
        ["squeue", "-h", "-j", job_id, "--states=all", "-o", code], capture_output=True, text=True, check=True
    )
    return proc.stdout.rstrip("\n")


def spec(deterministic: bool) -> ExperimentSpec:
    return ExperimentSpec(
        name="slurm-test",
        model=ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32),
        train=TrainSpec(global_batch_size=2, train_iters=3, lr=1e-3, deterministic=deterministic),
        data=DataSpec(path="data/x"),
    )


def test_parse_job_reads_scontrol_one_line_output():
    line = (
        "JobId=17 JobName=mcx-run-smoke UserId=root(0) GroupId=root(0) JobState=FAILED "
        "Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=3:0 "
        "NodeList=vm Command=/x/JobState=RUNNING y"
    )
    info = parse_job(line)
    assert (info.job_id, info.state, info.reason, info.exit_code, info.restarts, info.nodes) == (
        "17", "FAILED", "NonZeroExitCode", 3, 2, "vm"
    )  # fmt: skip
    assert parse_job("JobId=5 JobState=CANCELLED ExitCode=0:9").exit_code == -9
    assert parse_job("slurm_load_jobs error") is None


def test_two_processes_complete_through_sbatch_with_hostile_values(tmp_path: Path, handles):
    stage_dir = make_stage(tmp_path, name=f"smoke {HOSTILE}", steps=3, step_seconds=0.0)
    env = {**worker_env(spec(deterministic=True)), "MCX_PROBE_VALUE": HOSTILE}
    handle = submit(handles, stage_dir, 2, env, extra_sbatch=(f"--comment={HOSTILE}",))
    assert handle.poll() in ("pending", "running", "finished")
    outcome = handle.wait(180)
    assert outcome.state == "finished", (outcome.detail, handle.log.read_text())
    assert outcome.job_id == handle.job_id and outcome.exit_code == 0 and outcome.restarts == 0
    assert outcome.result["world_size"] == 2 and outcome.result["allreduce"] == 3.0
    assert outcome.result["term_inherited"] == "SIG_DFL"
    assert outcome.result["argv"] == [str(stage_dir)]
    assert outcome.result["env"]["MCX_PROBE_VALUE"] == HOSTILE
    assert outcome.result["env"]["PYTHONHASHSEED"] == "0"
    assert outcome.result["env"]["NCCL_ALGO"] == "Ring"
    assert outcome.result["env"]["OMP_NUM_THREADS"] == "1"  # 2 CPUs on the node, 2 processes
    assert squeue_field(handle.job_id, "%k") == HOSTILE  # the #SBATCH line reached sbatch verbatim
    assert (stage_dir / "sbatch.sh").exists()
    assert "mcx: job " + handle.job_id + " attempt 1" in handle.log.read_text()
    assert metric_steps(stage_dir) == [1, 2, 3]
    assert not list(tmp_path.rglob("INJECTED"))


def test_a_failing_worker_fails_the_job_with_its_error(tmp_path: Path, handles):
    stage_dir = make_stage(tmp_path, steps=5, step_seconds=0.0, fail_at_step=2)
    outcome = submit(handles, stage_dir, 1, {}).wait(120)
    assert outcome.state == "failed", outcome.detail
    assert outcome.exit_code == 1  # torchrun's code for a failed worker, the batch script's too
    assert "fail_at_step reached" in outcome.detail and str(outcome.log) in outcome.detail


def test_a_job_slurm_forgot_is_judged_by_its_result(tmp_path: Path):
    stage_dir = make_stage(tmp_path)
    handle = SlurmHandle("999999", stage_dir)  # no such job: the controller answers "Invalid job id"
    assert handle.poll() == "failed"
    assert "no longer known to Slurm" in handle.wait(5).detail
    (stage_dir / "result.json").write_text('{"status": "finished", "steps": 3}')
    assert handle.wait(5).state == "finished"


def test_scancel_reports_cancelled_after_the_worker_checkpointed(tmp_path: Path, handles):
    stage_dir = make_stage(tmp_path, steps=1000, step_seconds=0.1)
    handle = submit(handles, stage_dir, 1, {})
    wait_for_step(handle, 2)
    handle.cancel()
    outcome = handle.wait(120)
    assert outcome.state == "cancelled", outcome.detail
    assert outcome.result["status"] == "preempted"  # Slurm's SIGTERM came before its SIGKILL
    assert f"iter_{outcome.result['steps']:07d}" in outcome.detail


def test_time_limit_reports_timeout(tmp_path: Path, handles):
    # Slurm's smallest time limit is one minute and slurmctld checks limits every 30 s: this
    # test takes 60-90 s. requeue = false: no early warning, Slurm's own SIGTERM at the limit.
    stage_dir = make_stage(tmp_path, steps=100000, step_seconds=0.1)
    handle = submit(handles, stage_dir, 1, {}, time="1", requeue=False)
    outcome = handle.wait(240)
    assert outcome.state == "timeout", outcome.detail
    assert "launch.slurm.time" in outcome.detail
    assert outcome.result["status"] == "preempted"  # it still saved a checkpoint within KillWait
    assert (stage_dir / "checkpoints" / "latest").exists()


def test_requeue_sends_sigterm_and_the_job_resumes_with_every_step_once(tmp_path: Path, handles):
    steps = 24
    stage_dir = make_stage(tmp_path, steps=steps, step_seconds=0.2)
    handle = submit(handles, stage_dir, 2, {})
    wait_for_step(handle, 3)
    subprocess.run(["scontrol", "requeue", handle.job_id], check=True)  # what preemption does
    outcome = handle.wait(300)
    assert outcome.state == "finished", (outcome.detail, handle.log.read_text())
    assert outcome.restarts == 1
    assert outcome.result["steps"] == steps
    assert outcome.result["env"]["SLURM_RESTART_COUNT"] == "1"
    assert metric_steps(stage_dir) == list(range(1, steps + 1))  # resumed, nothing twice, nothing lost
    log = handle.log.read_text()
    assert "attempt 1" in log and "attempt 2" in log


def test_time_limit_warning_checkpoints_and_requeues_itself(tmp_path: Path, handles):
    steps = 24
    stage_dir = make_stage(tmp_path, steps=steps, step_seconds=0.2)
    handle = submit(handles, stage_dir, 1, {}, signal_grace_seconds=60)
    wait_for_step(handle, 3)
    # The warning --signal=B:USR1@60 delivers 60 s before the limit, sent now.
    subprocess.run(["scancel", "--batch", "--signal=USR1", handle.job_id], check=True)
    outcome = handle.wait(300)
    assert outcome.state == "finished", (outcome.detail, handle.log.read_text())
    assert outcome.restarts == 1
    assert metric_steps(stage_dir) == list(range(1, steps + 1))
    log = handle.log.read_text()
    assert "to the time limit: the workers save a checkpoint" in log
    assert "requeueing job " + handle.job_id in log


def test_quickstart_worker_trains_through_sbatch_with_two_cpu_processes(tmp_path: Path, handles):
    """The real worker (python -m mcx.train) on the bundled quickstart data, data-parallel over 2
    CPU processes, submitted with sbatch: the job contract end to end under Slurm."""
    from conftest import quickstart_dataset
    from mcx.spec.convert import unstructure
    from mcx.spec.load import load_spec

    repo = TESTS.parent
    spec = load_spec(
        repo / "experiments" / "tiny.toml",
        ["model.num_layers=2", "train.train_iters=8", "train.lr_warmup_iters=2", "train.eval_interval=4",
         "train.eval_iters=1"],
    )  # fmt: skip
    stage_dir = tmp_path / "runs" / "qs0123456789" / "smoke"
    stage_dir.mkdir(parents=True)
    job = {
        "run_id": "qs0123456789",
        "stage": "smoke",
        "spec": unstructure(spec),
        "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 2, "world_size": 2,
                   "sequence_parallel": False},
        "data_dir": str(repo / "data" / "quickstart"),
        "checkpoint_dir": str(stage_dir / "checkpoints"),
        "train_samples_limit": None,
        "checks": {"resume_check_iters": 3, "loss_window": 3, "min_loss_drop": 0.0},
        "device": "cpu",
        "output": "quiet",
    }  # fmt: skip
    (stage_dir / "job.json").write_text(json.dumps(job))
    launcher = SlurmLauncher(python=sys.executable, poll_interval=1.0)
    handle = launcher.start(
        stage_dir, {"world_size": 2}, LaunchSpec(kind="slurm", slurm=SlurmSpec(time="00:15:00")), worker_env(spec)
    )
    handles.append(handle)
    outcome = handle.wait(600)
    assert outcome.state == "finished", (outcome.detail, handle.log.read_text()[-3000:])
    result = outcome.result
    assert result["status"] == "finished" and result["passed"], result["checks"]
    assert result["steps"] == 8 and result["details"]["world_size"] == 2
    train = [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in train if m["kind"] == "train"] == list(range(1, 9))
    assert (stage_dir / "checkpoints" / "latest").exists()
