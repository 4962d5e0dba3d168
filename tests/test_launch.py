"""Launchers: worker environment, sbatch rendering, and real local / torchrun launches.

The launches start tests/launch_probe.py (a small real worker that keeps the job contract) in
place of ``mcx.train``: they prove the launch mechanics, not training.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mcx.errors import InputError
from mcx.launch import LocalLauncher, Placement, TorchrunLauncher, launcher_for, render_sbatch, worker_env
from mcx.launch.env import DETERMINISTIC_ENV, check_env, omp_threads
from mcx.launch.process import child_pids
from mcx.launch.sbatch import time_limit_seconds
from mcx.launch.torchrun import grandchildren
from mcx.spec.schema import (
    DataSpec,
    ExperimentSpec,
    LaunchSpec,
    ModelSpec,
    SlurmSpec,
    TrainSpec,
)

TESTS = Path(__file__).resolve().parent
PROBE_ENV = {"PYTHONPATH": str(TESTS)}
HOSTILE = "a b 'q' \"d\" $(touch INJECTED) `touch INJECTED` ; & | * ~ \\ $HOME %j"


def spec(deterministic: bool = False) -> ExperimentSpec:
    return ExperimentSpec(
        name="launch-test",
        model=ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32),
        train=TrainSpec(global_batch_size=2, train_iters=3, lr=1e-3, deterministic=deterministic),
        data=DataSpec(path="data/x"),
    )


def stage(tmp_path: Path, name: str = "smoke", **job) -> Path:
    d = tmp_path / "run0123" / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"steps": 3, "step_seconds": 0.0, **job}))
    return d


def metric_steps(stage_dir: Path) -> list[int]:
    path = stage_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def wait_for_step(stage_dir: Path, step: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric_steps(stage_dir) and metric_steps(stage_dir)[-1] >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"no step {step} in {stage_dir / 'metrics.jsonl'} after {timeout} s")


# -- worker environment --------------------------------------------------------------------------


def test_worker_env_is_fixed_and_adds_deterministic_variables_only_when_asked():
    plain = worker_env(spec(), inherited={})
    assert plain == {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "MKL_CBWR": "AUTO,STRICT"}
    det = worker_env(spec(deterministic=True), inherited={})
    assert det == {**plain, **DETERMINISTIC_ENV}
    assert det["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert det["NCCL_ALGO"] == "Ring"
    assert det["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"


def test_worker_env_leaves_an_mkl_mode_the_user_set():
    assert "MKL_CBWR" not in worker_env(spec(), inherited={"MKL_CBWR": "COMPATIBLE"})
    assert worker_env(spec(), inherited={"MKL_CBWR": ""}).get("MKL_CBWR") is None


# GEMMs shaped like the CPU quickstart's (weight gradients sum over the batch's tokens), hashed.
GEMM_BITS = textwrap.dedent("""
    import hashlib, torch
    torch.manual_seed(0)
    h = hashlib.sha256()
    for m, k, n in [(384, 512, 128), (128, 512, 384), (4096, 512, 128), (128, 1024, 384), (128, 1024, 128),
                    (512, 128, 4096), (512, 4096, 128), (256, 1024, 128)]:
        h.update((torch.randn(m, k) @ torch.randn(k, n)).numpy().tobytes())
    print(h.hexdigest())
""")


def test_a_cpu_worker_s_gemms_have_the_same_bits_whatever_the_threads_mkl_uses():
    """MKL may run a GEMM on fewer threads than it was given, and its sums follow the threads (D46):
    with the worker's environment the bits must not depend on it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "OMP_"))}
    bits = set()
    for threads in ("1", "2"):
        env = {**base, **worker_env(spec(), inherited=base), "MKL_NUM_THREADS": threads}
        proc = subprocess.run([sys.executable, "-c", GEMM_BITS], env=env, capture_output=True, text=True,
                              timeout=120, check=True)
        bits.add(proc.stdout.strip())
    assert len(bits) == 1, bits


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"1BAD": "x"}, "not a valid environment variable name"),
        ({"A-B": "x"}, "not a valid environment variable name"),
        ({"A": "x\ny"}, "env.A: the value 'x\\ny' contains a newline"),
        ({"A": "x\0y"}, "contains a NUL"),
        ({"A": 3}, "must be a string"),
    ],
)
def test_check_env_rejects_what_cannot_reach_a_process_intact(env, fragment):
    with pytest.raises(InputError, match=None) as e:
        check_env(env)
    assert fragment in str(e.value)


def test_omp_threads_share_the_cpus():
    assert omp_threads(2, cpus=16) == "8"
    assert omp_threads(3, cpus=16) == "5"
    assert omp_threads(8, cpus=2) == "1"


def test_launcher_for_each_kind():
    assert isinstance(launcher_for(LaunchSpec(kind="local")), LocalLauncher)
    assert isinstance(launcher_for(LaunchSpec(kind="torchrun")), TorchrunLauncher)
    assert type(launcher_for(LaunchSpec(kind="slurm"))).__name__ == "SlurmLauncher"


# -- sbatch script -------------------------------------------------------------------------------


def slurm_spec(**kw) -> LaunchSpec:
    return LaunchSpec(kind="slurm", slurm=SlurmSpec(**kw))


def directives(script: str) -> list[list[str]]:
    """The #SBATCH lines as sbatch reads them: shell word splitting and quoting."""
    return [shlex.split(line[len("#SBATCH ") :]) for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_render_sbatch_gpu_layout_and_options():
    script = render_sbatch(
        Path("/scratch/runs/3f9c0a12b4de/full"),
        Placement(world_size=16, nodes=2, device="cuda"),
        LaunchSpec(
            kind="slurm",
            master_port=29511,
            slurm=SlurmSpec(partition="gpu", account="proj", qos="high", constraint="h100", time="2-00:00:00"),
        ),
        {"PYTHONHASHSEED": "0"},
        python="/opt/venv/bin/python",
    )
    words = [w for line in directives(script) for w in line]
    assert words == [
        "--job-name=mcx-3f9c0a12b4de-full",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--constraint=h100",
        "--time=2-00:00:00",
        "--requeue",
        "--signal=B:USR1@120",
        "--open-mode=append",
        "--output=/scratch/runs/3f9c0a12b4de/full/slurm-%j.out",
    ]
    assert "--cpus-per-task=" not in "\n".join(line for line in script.splitlines() if line.startswith("#SBATCH"))
    assert "--nnodes 2 --nproc-per-node 8" in script
    assert "port=29511" in script
    assert "export PYTHONHASHSEED=0" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_render_sbatch_cpu_layout_without_requeue_has_no_warning_signal():
    script = render_sbatch(Path("/r/x/smoke"), Placement(world_size=2), slurm_spec(requeue=False, time="10"), {})
    words = [w for line in directives(script) for w in line]
    assert "--cpus-per-task=2" in words and "--no-requeue" in words
    assert not any(w.startswith("--signal") for w in words)
    assert "scontrol requeue" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_dry_run_of_a_64_gpu_recipe_asks_one_node_and_the_estimate_for_its_smoke_job(e2e_clean_env):
    """`mcx run experiments/llama3_70b.toml --dry-run` (8 nodes x 8 H100 through Slurm, two days a job):
    the smoke job asks for one node and the plan's estimate for the smoke stage, the full job for 8
    nodes and launch.slurm.time; both are warned the same grace before their limits."""
    from conftest import mcx_inprocess

    from mcx.plan.planner import make_plan
    from mcx.spec import load_spec

    recipe = TESTS.parent / "experiments" / "llama3_70b.toml"
    spec = load_spec(recipe)
    limit = make_plan(spec, te_available=None).smoke.time
    assert spec.smoke.nodes is None and spec.smoke.time_limit is None and limit.source == "estimate"
    res = mcx_inprocess(TESTS.parent, "run", str(recipe), "--dry-run", "--json")
    assert res.code == 0, res
    scripts = res.json()["scripts"]
    smoke, full = ({w.split("=", 1)[0]: w.partition("=")[2] for line in directives(scripts[stage]) for w in line}
                   for stage in ("smoke", "full"))
    assert (smoke["--nodes"], smoke["--gpus-per-node"], smoke["--time"]) == ("1", "8", limit.slurm)
    assert limit.slurm == "00:15:00"  # the 10-minute floor and the recipe's 300 s grace; not "2-00:00:00"
    assert (full["--nodes"], full["--gpus-per-node"], full["--time"]) == ("8", "8", "2-00:00:00")
    assert smoke["--signal"] == full["--signal"] == "B:USR1@300"
    assert "--nnodes 1 --nproc-per-node 8" in scripts["smoke"] and "--nnodes 8 --nproc-per-node 8" in scripts["full"]


def test_render_sbatch_quotes_hostile_values(tmp_path: Path):
    stage_dir = stage(tmp_path, name=f"smoke {HOSTILE}")
    env = {"MCX_PROBE_VALUE": HOSTILE, "PYTHONHASHSEED": "0"}
    python = str(tmp_path / f"py {HOSTILE}")
    extra = (f"--comment={HOSTILE}", "--exclusive")
    script = render_sbatch(
        stage_dir,
        Placement(world_size=2),
        slurm_spec(partition=HOSTILE, account=HOSTILE, qos=HOSTILE, constraint=HOSTILE, extra_sbatch=extra),
        env,
        python=python,
    )
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    parsed = {w.split("=", 1)[0]: w.split("=", 1)[1] for line in directives(script) for w in line if "=" in w}
    for key in ("--partition", "--account", "--qos", "--constraint", "--comment"):
        assert parsed[key] == HOSTILE
    assert parsed["--output"] == str(stage_dir).replace("%", "%%") + "/slurm-%j.out"  # "%" kept literal
    assert ["--exclusive"] in directives(script)

    # Run the body with the Slurm commands replaced by recorders (BASH_ENV functions): the
    # worker command line and environment must arrive verbatim, and nothing may be executed.
    record = tmp_path / "record"
    record.mkdir()
    stubs = tmp_path / "stubs.sh"
    stubs.write_text(
        textwrap.dedent(
            f"""
            srun() {{ printf '%s\\0' "$@" > {shlex.quote(str(record / "argv"))}
                     env -0 > {shlex.quote(str(record / "env"))}; }}
            scontrol() {{ echo node-a; echo node-b; }}
            scancel() {{ :; }}
            """
        )
    )
    run_env = {
        "PATH": os.environ["PATH"],
        "BASH_ENV": str(stubs),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_CPUS_ON_NODE": "2",
    }
    proc = subprocess.run(["bash", "-s"], input=script, text=True, env=run_env, cwd=tmp_path, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    argv = (record / "argv").read_text().split("\0")[:-1]
    assert argv[-3:] == ["-m", "mcx.train", str(stage_dir)]
    assert python in argv
    assert "node-a:20042" in argv  # rendezvous on the first node, port from the job ID
    assert argv[argv.index("--rdzv-id") + 1] == "42"
    child_env = dict(item.split("=", 1) for item in (record / "env").read_text().split("\0") if item)
    assert child_env["MCX_PROBE_VALUE"] == HOSTILE
    assert child_env["OMP_NUM_THREADS"] == "1"
    assert not list(tmp_path.rglob("INJECTED"))


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"partition": "a\nb"}, "launch.slurm.partition"),
        ({"account": "a\rb"}, "launch.slurm.account"),
        ({"qos": "a\nb"}, "launch.slurm.qos"),
        ({"constraint": "x\n#SBATCH --uid=0"}, "launch.slurm.constraint"),
        ({"time": "1\n2"}, "launch.slurm.time"),
        ({"extra_sbatch": ("--comment=a\nb",)}, "launch.slurm.extra_sbatch[0]"),
    ],
)
def test_render_sbatch_rejects_newlines_naming_the_key(kw, key):
    with pytest.raises(InputError) as e:
        render_sbatch(Path("/r/x/smoke"), Placement(world_size=1), slurm_spec(**kw), {})
    assert key in str(e.value)


def test_render_sbatch_rejects_newlines_in_env_and_stage_dir():
    with pytest.raises(InputError, match="env.X"):
        render_sbatch(Path("/r/x/smoke"), Placement(world_size=1), slurm_spec(), {"X": "a\nb"})
    with pytest.raises(InputError, match="stage directory"):
        render_sbatch(Path("/r/x\n/smoke"), Placement(world_size=1), slurm_spec(), {})


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        ("--output=/tmp/x", "mcx sets itself"),
        ("--partition=gpu", "launch.slurm.partition"),
        ("-p gpu", "one option per entry"),
        ("--mail-type END", "one option per entry"),
        ("exclusive", "not an sbatch option"),
    ],
)
def test_render_sbatch_checks_extra_sbatch(option, fragment):
    with pytest.raises(InputError) as e:
        render_sbatch(Path("/r/x/smoke"), Placement(world_size=1), slurm_spec(extra_sbatch=(option,)), {})
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("90", 5400), ("1:30", 90), ("04:00:00", 14400), ("2-00", 172800), ("1-02:03", 93780),
     ("1-00:00:01", 86401), ("UNLIMITED", None)],
)  # fmt: skip
def test_time_limit_seconds(value, seconds):
    assert time_limit_seconds(value) == seconds


def test_time_limit_and_grace_are_checked():
    with pytest.raises(InputError, match="launch.slurm.time"):
        time_limit_seconds("four hours")
    with pytest.raises(InputError, match="signal_grace_seconds"):
        render_sbatch(Path("/r/x/smoke"), Placement(world_size=1), slurm_spec(time="2", signal_grace_seconds=120), {})


def test_layout_checks():
    with pytest.raises(InputError, match="launch.kind = 'torchrun'"):
        LocalLauncher().start(Path("/nonexistent"), Placement(world_size=2), LaunchSpec(), {})
    with pytest.raises(InputError, match="several nodes"):
        TorchrunLauncher().start(Path("/nonexistent"), Placement(world_size=4, nodes=2), LaunchSpec(), {})
    with pytest.raises(InputError, match="not a multiple"):
        render_sbatch(Path("/r/x/smoke"), Placement(world_size=3, nodes=2), slurm_spec(), {})


# -- local launcher ------------------------------------------------------------------------------


def local(tmp_path: Path) -> LocalLauncher:
    return LocalLauncher(module="launch_probe", log=tmp_path / "launch.log")


def test_local_runs_the_worker_with_the_worker_env(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=3)
    (stage_dir / "result.json").write_text('{"status": "finished", "stale": true}')
    env = {**worker_env(spec(deterministic=True)), **PROBE_ENV, "MCX_PROBE_VALUE": HOSTILE}
    handle = local(tmp_path).start(stage_dir, Placement(world_size=1), LaunchSpec(), env)
    outcome = handle.wait(60)
    assert outcome.state == "finished", outcome.detail
    assert outcome.exit_code == 0 and outcome.job_id == str(handle.pid)
    assert "stale" not in outcome.result
    assert outcome.result["steps"] == 3 and outcome.result["argv"] == [str(stage_dir)]
    assert outcome.result["env"]["MCX_PROBE_VALUE"] == HOSTILE
    for name, value in worker_env(spec(deterministic=True)).items():
        assert outcome.result["env"].get(name, value) == value
    assert outcome.result["env"]["PYTHONHASHSEED"] == "0"
    assert outcome.result["env"]["NCCL_ALGO"] == "Ring"
    assert metric_steps(stage_dir) == [1, 2, 3]


def test_local_failure_reports_the_exit_code(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=5, fail_at_step=2)
    outcome = local(tmp_path).start(stage_dir, Placement(world_size=1), LaunchSpec(), PROBE_ENV).wait(60)
    assert outcome.state == "failed"
    assert outcome.exit_code == 3
    assert "exited with code 3" in outcome.detail and "fail_at_step reached" in outcome.detail


def test_a_crashed_worker_leaves_no_helper_process_behind(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=5, crash_at_step=3, helper=True)
    outcome = local(tmp_path).start(stage_dir, Placement(world_size=1), LaunchSpec(), PROBE_ENV).wait(60)
    assert outcome.state == "failed" and outcome.exit_code == -9, outcome.detail
    helper = int((stage_dir / "helper.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{helper}").exists() and "Z" not in _state(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{helper}").exists() or "Z" in _state(helper)  # gone, or dead and awaiting its reaper


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return "gone"


def test_local_cancel_checkpoints_and_a_rerun_resumes(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=6, step_seconds=0.3)
    handle = local(tmp_path).start(stage_dir, Placement(world_size=1), LaunchSpec(), PROBE_ENV)
    wait_for_step(stage_dir, 2)
    handle.cancel()
    outcome = handle.wait(30)
    assert outcome.state == "cancelled" and outcome.interrupted_by is None  # mcx's own stop (a watch), not the user's
    assert outcome.result["status"] == "preempted"
    saved = outcome.result["steps"]
    assert f"iter_{saved:07d}" in outcome.detail
    again = local(tmp_path).start(stage_dir, Placement(world_size=1), LaunchSpec(), PROBE_ENV).wait(60)
    assert again.state == "finished" and again.result["steps"] == 6
    assert metric_steps(stage_dir) == [1, 2, 3, 4, 5, 6]


def test_the_latest_checkpoint_is_read_where_the_job_keeps_its_checkpoints(tmp_path: Path):
    """checkpoint.dir puts a stage's checkpoints outside its run directory: `latest` (the resume, the
    checkpoint recorded in DVC, what an interrupted run says it resumes from) is read where job.json says."""
    from mcx.contract.checkpoints import latest_checkpoint
    from mcx.launch.base import resume_note

    stage_dir, elsewhere = tmp_path / "run" / "full", tmp_path / "ckpt" / "run" / "full"
    stage_dir.mkdir(parents=True)
    assert latest_checkpoint(stage_dir) is None and resume_note(stage_dir).startswith("No checkpoint was saved")
    (stage_dir / "checkpoints").mkdir()
    (stage_dir / "checkpoints" / "latest").write_text("iter_0000004\n")
    assert latest_checkpoint(stage_dir) == "iter_0000004"  # no job.json: the default place
    (stage_dir / "job.json").write_text(json.dumps({"checkpoint_dir": str(elsewhere)}))
    assert latest_checkpoint(stage_dir) is None  # the job's checkpoints are elsewhere, and none is saved there yet
    elsewhere.mkdir(parents=True)
    (elsewhere / "latest").write_text("iter_0000008\n")
    assert latest_checkpoint(stage_dir) == "iter_0000008" and "iter_0000008" in resume_note(stage_dir)


CONTROL_PLANE = """
import sys
from pathlib import Path
from mcx.launch import LocalLauncher, Placement
from mcx.spec.schema import LaunchSpec
stage = Path(sys.argv[1])
handle = LocalLauncher(module="launch_probe", log=stage / "launch.log").start(
    stage, Placement(world_size=1), LaunchSpec(), {"PYTHONPATH": sys.argv[2]})
print(handle.pid, flush=True)
outcome = handle.wait()
print(outcome.state, outcome.result["status"], outcome.result["term_signals"], outcome.interrupted_by, flush=True)
"""


def test_ctrl_c_on_the_control_plane_reaches_the_worker_once_as_sigterm(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=200, step_seconds=0.1)
    plane = subprocess.Popen(
        [sys.executable, "-c", CONTROL_PLANE, str(stage_dir), str(TESTS)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=TESTS.parent,
    )
    worker_pid = int(plane.stdout.readline())
    assert child_pids(plane.pid) == [worker_pid]
    assert os.getsid(worker_pid) == worker_pid  # its own session: a terminal's Ctrl-C reaches only mcx
    wait_for_step(stage_dir, 2)
    plane.send_signal(signal.SIGINT)
    out, _ = plane.communicate(timeout=30)
    assert plane.returncode == 0
    assert out.split() == ["cancelled", "preempted", "1", "SIGINT"]  # the user's stop, named: `mcx run` exits 130
    assert (stage_dir / "checkpoints" / "latest").exists()


# -- torchrun launcher ---------------------------------------------------------------------------


def test_torchrun_two_cpu_processes_all_reduce_and_rank0_writes_the_result(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launcher's own share, not the caller's (xdist's)
    stage_dir = stage(tmp_path, steps=3)
    env = {**worker_env(spec(deterministic=True)), **PROBE_ENV}
    launcher = TorchrunLauncher(module="launch_probe", log=tmp_path / "launch.log")
    outcome = launcher.start(stage_dir, Placement(world_size=2), LaunchSpec(kind="torchrun"), env).wait(120)
    assert outcome.state == "finished", (outcome.detail, (tmp_path / "launch.log").read_text())
    assert outcome.result["world_size"] == 2
    assert outcome.result["allreduce"] == 3.0  # 1 + 2: both ranks joined the gloo group
    assert outcome.result["term_inherited"] == "SIG_DFL"  # the agent's SIGTERM handler is not inherited
    assert outcome.result["env"]["OMP_NUM_THREADS"] == omp_threads(2)
    assert outcome.result["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert metric_steps(stage_dir) == [1, 2, 3]


def test_torchrun_interrupt_reaches_every_worker_and_they_checkpoint(tmp_path: Path):
    stage_dir = stage(tmp_path, steps=500, step_seconds=0.1)
    launcher = TorchrunLauncher(module="launch_probe", log=tmp_path / "launch.log")
    handle = launcher.start(stage_dir, Placement(world_size=2), LaunchSpec(kind="torchrun"), PROBE_ENV)
    wait_for_step(stage_dir, 2, timeout=90)
    assert len(grandchildren(handle.pid)) == 2  # the watchdog's agent's workers
    handle.interrupt()
    outcome = handle.wait(60)
    assert outcome.state == "cancelled", outcome.detail
    assert outcome.exit_code == 0  # both workers left cleanly: the agent ignored SIGTERM and waited
    assert outcome.result["status"] == "preempted"
    assert outcome.result["term_signals"] == 1  # from mcx only: torchrun did not add its own
    assert (stage_dir / "checkpoints" / "latest").read_text() == f"iter_{outcome.result['steps']:07d}"
