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

from conftest import IN_CI

from mcx.launch import Placement, SlurmHandle, SlurmLauncher, worker_env
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
REQUIRED = IN_CI

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
    handle = launcher.start(stage_dir, Placement(world_size=world_size), launch, {**env, **PROBE_ENV})
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


def test_two_processes_complete_through_sbatch_with_hostile_values(tmp_path: Path, handles, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the script's own share, not the caller's (xdist's)
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
    assert "smoke.time_limit" in outcome.detail  # a smoke stage's limit is its own key's (or the estimate)
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
        "data_dir": str(quickstart_dataset()),  # built here if missing: this test may run first
        "checkpoint_dir": str(stage_dir / "checkpoints"),
        "train_samples_limit": None,
        "checks": {"resume_check_iters": 3, "loss_window": 3, "min_loss_drop": 0.0},
        "device": "cpu",
        "output": "quiet",
    }  # fmt: skip
    (stage_dir / "job.json").write_text(json.dumps(job))
    launcher = SlurmLauncher(python=sys.executable, poll_interval=1.0)
    handle = launcher.start(
        stage_dir, Placement(world_size=2), LaunchSpec(kind="slurm", slurm=SlurmSpec(time="00:15:00")), worker_env(spec)
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


# --- the 405B recipe from a login node (issue 6's design card example) ------------------------------
# `mcx run experiments/llama405b.toml` as written plans 16 nodes x 8 H200 and asks to confirm its
# GPU-hours; confirmed, the smoke stage goes through sbatch first and the 16-node job only after it
# passed. The test cluster has one partition ("debug"), two nodes of 2 CPUs and no GPUs: the smoke stage
# runs there as 2 CPU processes (smoke.gpu = "cpu") with a CPU-sized model; the full stage is the
# recipe as written, rendered for 16 x 8 GPUs, and sbatch refuses it (no such nodes).

L405 = "experiments/llama405b.toml"
ON_TEST_CLUSTER = [
    "--set", "launch.slurm.partition=debug",
    "--set", "smoke.gpu=cpu", "--set", "smoke.gpus_per_node=2",
    "--set", "smoke.hidden_size=64", "--set", "smoke.seq_length=64",
    "--set", "smoke.train_iters=15", "--set", "smoke.lr=3e-3",
]  # fmt: skip


@pytest.fixture
def l405_project(tmp_path: Path) -> Path:
    """A user's project (git, DVC, the quickstart data) with the 405B recipe committed."""
    from conftest import make_e2e_project

    project = make_e2e_project(tmp_path / "project")
    shutil.copyfile(TESTS.parent / L405, project / L405)
    git = ["git", "-c", "user.name=mcx-test", "-c", "user.email=mcx-test@example.invalid"]
    subprocess.run([*git, "add", L405], cwd=project, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "405B recipe"], cwd=project, check=True)
    return project


def run_id_of(project: Path, *args: str) -> str:
    from conftest import mcx_subprocess

    res = mcx_subprocess(project, "plan", L405, *args, "--json")
    assert res.code == 0, res
    return res.json()["run_id"]


def jobs_of(run_id: str) -> dict[str, str]:
    """Slurm jobs of a run, any state: job ID -> job name (mcx names them mcx-<run ID>-<stage>)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i %j"], capture_output=True, text=True, check=True)
    return {i: n for i, n in (line.split(" ", 1) for line in out.stdout.splitlines()) if run_id in n}


def on_a_terminal(project: Path, args: list[str], answer: bytes, timeout: float = 120.0) -> tuple[int, str]:
    """`mcx ARGS` with a terminal for stdin and stderr; ``answer`` is typed once mcx asks [y/N]."""
    import pty
    import select

    from conftest import e2e_env

    argv = [sys.executable, "-m", "mcx", "--project", str(project), *args]
    pid, fd = pty.fork()
    if pid == 0:  # the child: mcx, run from the project
        os.chdir(project)
        os.execve(sys.executable, argv, e2e_env())
    out, asked, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1.0)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not asked and b"[y/N]" in out:
                os.write(fd, answer)
                asked = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_405b_over_budget_shows_the_plan_and_refuses_without_confirmation(l405_project: Path):
    from conftest import mcx_subprocess

    from mcx.plan.planner import make_plan
    from mcx.spec.load import load_spec

    cost = make_plan(load_spec(l405_project / L405), te_available=None).cost
    hours = f"{cost.gpu_hours:,.0f} GPU-hours"
    res = mcx_subprocess(l405_project, "run", L405)  # as the design card types it; no terminal: no question
    assert res.code == 2, res
    assert "Traceback" not in res.err
    assert "128 (16x8)" in res.err and "over budget: needs --yes" in res.err  # the plan was shown
    error = res.err[res.err.index("mcx: error:"):]
    assert hours in " ".join(error.split()) and "budget.max_gpu_hours = 5,000" in error
    assert "pass --yes" in error and "raise budget.max_gpu_hours" in error
    run_id = run_id_of(l405_project)
    assert f"run {run_id}" in res.err
    assert not (l405_project / ".mcx").exists()  # nothing written: no run directory, no MLflow store
    assert jobs_of(run_id) == {}  # nothing submitted

    # On a terminal the gate asks; anything but yes is the same refusal.
    code, out = on_a_terminal(l405_project, ["run", L405], b"n\n")
    assert code == 2, out
    assert "Run it anyway? [y/N]" in out and hours in " ".join(out.split())
    assert "pass --yes" in out and "Traceback" not in out
    assert not (l405_project / ".mcx").exists() and jobs_of(run_id) == {}


def test_405b_confirmed_smokes_on_cpu_through_sbatch_then_submits_the_16_node_job(l405_project: Path):
    from conftest import mcx_subprocess

    run_id = run_id_of(l405_project, *ON_TEST_CLUSTER)
    try:
        res = mcx_subprocess(l405_project, "run", L405, *ON_TEST_CLUSTER, "--yes", "--json", timeout=900)
        again = mcx_subprocess(l405_project, "run", L405, *ON_TEST_CLUSTER, "--yes", "--json", timeout=300)
    finally:  # a job this run left queued (mcx timed out) must not hold the test cluster
        for job_id in jobs_of(run_id):
            info = query_job(job_id)
            if info is not None and info.state in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING"):
                subprocess.run(["scancel", job_id], check=False)
    rdir = l405_project / ".mcx" / "runs" / run_id
    smoke_dir, full_dir = rdir / "smoke", rdir / "full"
    assert res.code == 2, res  # sbatch's refusal of the full job: bad input for this cluster
    summary = res.json()
    assert summary["run_id"] == run_id and summary["status"] == "failed"
    assert "confirmed: the full stage may use about" in res.err and "128 (16x8)" in res.err

    # 1. The smoke stage: submitted with sbatch at the smoke scale, 2 CPU processes, and it passed.
    smoke = summary["stages"]["smoke"]
    assert smoke["status"] == "finished" and smoke["passed"] and smoke["steps"] == 15, smoke
    assert smoke["checks"] and all(c["passed"] for c in smoke["checks"].values())
    result = json.loads((smoke_dir / "result.json").read_text())
    assert result["details"]["device"] == "cpu" and result["details"]["world_size"] == 2
    script = (smoke_dir / "sbatch.sh").read_text()
    # Its own time limit: the estimate for 15 CPU steps (12 min) and the recipe's 600 s grace, not 4 days.
    for line in ("#SBATCH --nodes=1", "#SBATCH --cpus-per-task=2", "#SBATCH --partition=debug",
                 "#SBATCH --time=00:22:00", "#SBATCH --signal=B:USR1@600",
                 "# layout: TP 1 x PP 1 x CP 1 x EP 1 x DP 2 = 2 ranks", "--nnodes 1 --nproc-per-node 2"):
        assert line in script, line
    assert "--gpus-per-node" not in script
    (log,) = smoke_dir.glob("slurm-*.out")
    smoke_job = log.name.removeprefix("slurm-").removesuffix(".out")
    assert f"mcx: job {smoke_job} attempt 1" in log.read_text() and "srun exited with code 0" in log.read_text()
    assert query_job(smoke_job).state == "COMPLETED"

    # 2. The full stage: rendered for 16 nodes x 8 GPUs, TP 8 x PP 8 x CP 2, and given to sbatch only
    # after the smoke stage had passed; this cluster has no such nodes, so sbatch refused it.
    script = (full_dir / "sbatch.sh").read_text()
    for line in (
        "#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=debug", "#SBATCH --time=4-00:00:00", "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@600", f"#SBATCH --job-name=mcx-{run_id}-full",
        "# layout: TP 8 x PP 8 (VPP 8) x CP 2 x EP 1 x DP 1 = 128 ranks, sequence parallel",
        f"stage={full_dir}",
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" '
        "--kill-on-bad-exit=1 ",
        '--nnodes 16 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$head:$port" '
        '--rdzv-id "$SLURM_JOB_ID" --max-restarts 0',
        '-m mcx.train "$stage" &',
    ):  # fmt: skip
        assert line in script, line
    assert "--cpus-per-task=" not in "".join(ln for ln in script.splitlines() if ln.startswith("#SBATCH"))
    subprocess.run(["bash", "-n", str(full_dir / "sbatch.sh")], check=True)  # it parses as bash
    job = json.loads((full_dir / "job.json").read_text())
    assert job["stage"] == "full" and job["device"] == "cuda"
    assert {k: job["layout"][k] for k in ("tp", "pp", "vpp", "cp", "dp", "world_size")} == {
        "tp": 8, "pp": 8, "vpp": 8, "cp": 2, "dp": 1, "world_size": 128}
    assert (full_dir / "sbatch.sh").stat().st_mtime >= (smoke_dir / "result.json").stat().st_mtime
    assert not list(full_dir.glob("slurm-*.out"))
    assert jobs_of(run_id) == {smoke_job: f"mcx-{run_id}-smoke"}  # the full job never entered the queue
    error = " ".join(summary["error"].split())
    assert error.startswith(f"sbatch refused the job {full_dir / 'sbatch.sh'} (16 node(s) x 8 GPU(s) per node, "
                            "partition debug)")
    assert "the cluster cannot place it" in error and "hardware.nodes x hardware.gpus_per_node" in error
    assert "The smoke stage passed and is kept" in error
    assert json.loads((rdir / "run.json").read_text())["status"] == "failed"

    # 3. Run again: the passed smoke stage is reused, only the full stage is given to sbatch again.
    assert again.code == 2, again
    assert "smoke stage already finished" in " ".join(again.err.split())
    assert again.json()["stages"]["smoke"]["passed"] and "sbatch refused the job" in again.json()["error"]
    assert jobs_of(run_id) == {smoke_job: f"mcx-{run_id}-smoke"}


def test_jobs_the_cluster_cannot_place_are_refused_with_the_key_that_decides_them(tmp_path: Path, handles):
    """Real answers of the test cluster (two nodes of 2 CPUs, no GPUs, partition "debug"). GPUs: sbatch
    refuses the job. Too many nodes or CPUs: sbatch accepts it and Slurm keeps it pending for ever
    (reason PartitionConfig, as on any cluster with EnforcePartLimits=NO, Slurm's default): mcx
    cancels it and refuses the stage, instead of waiting for ever."""
    from mcx.launch.slurm import JobRefused

    launcher = SlurmLauncher(module="launch_probe", python=sys.executable, poll_interval=0.5)
    cases = [  # layout, launch.slurm, stage, accepted (and cancelled), what the error says
        (Placement(world_size=16, nodes=2, device="cuda"), {"partition": "debug"}, "full", False,
         ["2 node(s) x 8 GPU(s) per node, partition debug", "cannot place it", "hardware.nodes x hardware.gpus_per_node",
          "GRES"]),
        (Placement(world_size=16, nodes=16, device="cpu"), {"partition": "debug"}, "full", True,
         ["16 node(s) x 1 CPU process(es) per node, partition debug", "reason PartitionConfig", "cannot place it",
          "hardware.nodes x hardware.gpus_per_node"]),
        (Placement(world_size=64, nodes=1, device="cpu"), {}, "smoke", True,
         ["1 node(s) x 64 CPU process(es) per node, partition the default", "cannot place it",
          "smoke.nodes x smoke.gpus_per_node"]),
        (Placement(world_size=1), {"partition": "no-such-partition"}, "full", False,
         ["partition no-such-partition", "launch.slurm.partition names no partition"]),
    ]  # fmt: skip
    for i, (layout, slurm, stage, accepted, shown) in enumerate(cases):
        stage_dir = make_stage(tmp_path / str(i), name=stage)
        launch = LaunchSpec(kind="slurm", slurm=SlurmSpec(time="00:10:00", **slurm))
        handle = None
        with pytest.raises(JobRefused) as exc:
            handle = launcher.start(stage_dir, layout, launch, PROBE_ENV)
            handles.append(handle)
            handle.wait(60)
        message = " ".join(str(exc.value).split())
        assert exc.value.exit_code == 2 and str(stage_dir / "sbatch.sh") in message
        for text in shown:
            assert text in message, (text, message)
        assert (handle is not None) == accepted, message
        if accepted:
            assert message.startswith(f"Slurm accepted the job {stage_dir / 'sbatch.sh'}")
            assert f"as job {handle.job_id} but it can never start there" in message
            assert query_job(handle.job_id).state == "CANCELLED"
        else:
            assert message.startswith(f"sbatch refused the job {stage_dir / 'sbatch.sh'}")
        assert (stage_dir / "sbatch.sh").exists() and not list(stage_dir.glob("slurm-*.out"))


# --- two nodes: DP across the local cluster's two slurmd (.ci/slurm.sh), preempted and requeued -----------
# The quickstart as DP 2 over 2 nodes x 1 CPU process, through `mcx run` (no smoke stage): sbatch, one
# torchrun agent per node under srun, c10d rendezvous on the first node, gloo between the nodes. Once the
# job has trained 3 steps it is requeued from outside (`scontrol requeue`: what a preemption does); the
# workers checkpoint on Slurm's SIGTERM, the next attempt resumes from that checkpoint, and `mcx run`,
# following the job throughout, records the finished run. One run serves every assertion below.

TWO_NODE_STEPS = 30
TWO_NODES = [
    "--set", "launch.kind=slurm", "--set", 'launch.slurm.time="00:15:00"',
    "--set", "hardware.nodes=2", "--set", "hardware.gpus_per_node=1", "--set", "hardware.gpu=cpu",
    "--set", "smoke.enabled=false", "--set", "model.num_layers=2", "--set", "model.hidden_size=64",
    "--set", "model.seq_length=64", "--set", "model.max_position_embeddings=64",
    "--set", f"train.train_iters={TWO_NODE_STEPS}", "--set", "train.lr_warmup_iters=2",
    "--set", f"train.eval_interval={TWO_NODE_STEPS}", "--set", "train.eval_iters=1",
]  # fmt: skip


def train_metrics(stage_dir: Path) -> list[dict]:
    """The train records of metrics.jsonl so far (a line the worker is still writing is left out)."""
    text = (stage_dir / "metrics.jsonl").read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()
    return [m for m in map(json.loads, lines) if m["kind"] == "train"]


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The finished `mcx run` (its --json summary, its stage directory, the job ID), requeued once."""
    from conftest import e2e_env, machine_lock, make_e2e_project

    project = make_e2e_project(tmp_path_factory.mktemp("two-nodes") / "project")
    out, err = project / "mcx.out", project / "mcx.err"
    argv = [sys.executable, "-m", "mcx", "--project", str(project), "run", "experiments/tiny.toml", *TWO_NODES,
            "--json"]
    # Module-scoped, so it runs before the per-test lock: it holds the cluster itself while it submits.
    with machine_lock("slurm"), open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=project, env=e2e_env(), stdout=stdout, stderr=stderr)
        job_id = None
        try:
            deadline = time.monotonic() + 600
            while job_id is None and proc.poll() is None and time.monotonic() < deadline:
                stages = list((project / ".mcx" / "runs").glob("*/full"))
                if stages and (stages[0] / "metrics.jsonl").exists() and len(train_metrics(stages[0])) >= 3:
                    (log,) = stages[0].glob("slurm-*.out")
                    job_id = log.name.removeprefix("slurm-").removesuffix(".out")
                    subprocess.run(["scontrol", "requeue", job_id], check=True)
                time.sleep(0.1)
            assert job_id is not None, f"the job trained no 3 steps: {err.read_text()[-3000:]}"
            proc.wait(600)
            # Read now: Slurm forgets a finished job MinJobAge (10 min) after it ended.
            info = query_job(job_id)
            nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True)
            held = subprocess.run(["scontrol", "show", "hostnames", info.nodes], capture_output=True, text=True)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if job_id is not None and (info := query_job(job_id)) is not None and info.state in (
                "PENDING", "RUNNING", "REQUEUED", "CONFIGURING"
            ):
                subprocess.run(["scancel", job_id], check=False)
    from conftest import CliResult

    res = CliResult(proc.returncode, out.read_text(), err.read_text())
    assert res.code == 0, res
    summary = res.json()
    return {"summary": summary, "job_id": job_id, "job": info, "cluster_nodes": sorted(set(nodes.stdout.split())),
            "job_nodes": held.stdout.split(), "stage_dir": Path(summary["run_dir"]) / "full"}  # fmt: skip


def test_two_node_dp_run_trains_through_torchrun_rendezvous(two_node_run: dict):
    summary, stage_dir, job_id = two_node_run["summary"], two_node_run["stage_dir"], two_node_run["job_id"]
    assert summary["status"] == "finished" and summary["tracking"]["state"] == "synced", summary
    full = summary["stages"]["full"]
    assert full["status"] == "finished" and full["passed"] and full["steps"] == TWO_NODE_STEPS, full
    script = (stage_dir / "sbatch.sh").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1",
                 "# layout: TP 1 x PP 1 x CP 1 x EP 1 x DP 2 = 2 ranks",
                 "--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d"):  # fmt: skip
        assert line in script, line
    # Both of the cluster's nodes held the job: one agent each, the rendezvous on the first.
    names, info = two_node_run["cluster_nodes"], two_node_run["job"]
    assert len(names) >= 2, f"the local cluster has one node ({names}): restart it with `bash .ci/slurm.sh start`"
    assert len(two_node_run["job_nodes"]) == 2 and set(two_node_run["job_nodes"]) <= set(names), info.nodes
    log = (stage_dir / f"slurm-{job_id}.out").read_text()
    assert f"attempt 1 on {info.nodes} " in log and ", 2 node(s) x 1 process(es)" in log
    result = json.loads((stage_dir / "result.json").read_text())
    assert result["details"]["world_size"] == 2 and result["status"] == "finished"
    # Each node's worker reported its system metrics: group ranks 0 and 1 of 2.
    for node, name in ((0, "system.jsonl"), (1, "system.1.jsonl")):
        sample = json.loads((stage_dir / name).read_text().splitlines()[-1])
        assert (sample["node"], sample["nodes"]) == (node, 2)
    losses = [m["loss"] for m in train_metrics(stage_dir)]
    assert losses[-1] < losses[0] - 1.0, losses  # it learned


def test_two_node_job_requeued_resumes_from_its_checkpoint_with_every_step_once(two_node_run: dict):
    stage_dir, job_id = two_node_run["stage_dir"], two_node_run["job_id"]
    assert [m["step"] for m in train_metrics(stage_dir)] == list(range(1, TWO_NODE_STEPS + 1))
    info = two_node_run["job"]
    assert info.state == "COMPLETED" and info.restarts == 1, info
    log = (stage_dir / f"slurm-{job_id}.out").read_text()
    assert "attempt 1 on" in log and "attempt 2 on" in log and "SIGTERM (cancel, preemption or requeue)" in log
    # The first attempt saved a checkpoint on Slurm's SIGTERM, before the last step; the second resumed from it.
    saved = sorted(int(p.name.removeprefix("iter_")) for p in (stage_dir / "checkpoints").glob("iter_*"))
    assert saved[0] < TWO_NODE_STEPS and saved[-1] == TWO_NODE_STEPS, saved
    worker_log = (stage_dir / "worker.log").read_text()
    assert f"resumed from iter_{saved[0]:07d} (step {saved[0]}," in worker_log
    run_json = json.loads((stage_dir.parent / "run.json").read_text())
    assert run_json["status"] == "finished"
