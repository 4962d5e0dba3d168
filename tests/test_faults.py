"""Fault injection: mcx and its worker under real faults, with nothing replaced.

Every fault is the real thing: SIGKILL and SIGTERM sent to real worker processes (found in the
process tree of a real `mcx run`), SIGTERM to `mcx run` and SIGINT to its process group (a Ctrl-C),
a real full filesystem (a tmpfs mounted small as checkpoint.dir), NaN injected into the live
weights of a real Megatron-Core model (the spec's [debug] table, docs/spec.md), a real `mlflow server`
stopped for a whole run and in the middle of one, two real `mcx run` processes racing for one run ID,
and a hostile project path and spec values rendered into a Slurm batch script that real bash then runs.

The model is the quickstart shrunk to seconds on CPU (FAULT). One uninterrupted `mcx run` of it is
the reference every interrupted run must match bit for bit (train loss, gradient norm and learning
rate at every step; the validation and test losses).

Many kills, few interpreter starts: most trials of the kill tests run the worker in processes
forked from a *fork server* (ZYGOTE) that has imported torch and Megatron-Core once, the way a
zygote or a forkserver does. Each forked process runs the worker's own entry point
(``mcx.train.__main__.main``) on a stage directory whose job.json is the one `mcx run` wrote for the
reference, and is killed for real; only the seconds of `python -m mcx.train`'s imports are saved.
The trials that go through `mcx run` (its LocalLauncher starts `python -m mcx.train`) cover the
real launch path. Kill points are chosen by a seeded RNG (KILL_SEED), so a failure replays.

SIGSTOP is used in three places, only to pin a race to the side the test needs, never as the
fault itself: to freeze a worker while it writes a checkpoint (so the test can see the partial
directory before SIGKILL lands), to hold a worker while the MLflow server is stopped (so the outage
is really mid-run), and to hold the winner of a run-ID race while `mcx run --wait` queues.

Every command runs with secrets in its environment (SECRETS); the last test greps every byte that
this module's runs left in run directories, spools and MLflow stores for them.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import E2E_ENV_DROP, e2e_env, make_e2e_project, mcx_inprocess, missing, seed_embedded_store
from mcx.launch.process import child_pids

ROOT = Path(__file__).resolve().parent.parent
SPEC = "experiments/tiny.toml"
STEPS = 48
INTERVAL = 4  # checkpoint.interval
FAULT = [
    "--set", "model.num_layers=2", "--set", "model.hidden_size=64", "--set", "model.ffn_hidden_size=192",
    "--set", "model.seq_length=64", "--set", "model.max_position_embeddings=64",
    "--set", f"train.train_iters={STEPS}", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=16",
    "--set", "train.eval_iters=1", "--set", f"checkpoint.interval={INTERVAL}",
]
RUN = ["run", SPEC, *FAULT, "--skip-smoke", "--quiet"]
# The checkpoint-write kills widen the model so that a save lasts long enough to be caught mid-way.
WIDE = {"hidden_size": 128, "ffn_hidden_size": 384}
KILL_SEED = 20240806
KILL_TRIALS = 10
SECRETS = {"MY_API_TOKEN": "mcx-fault-token-7d41c9e2b8", "MLFLOW_TRACKING_PASSWORD": "mcx-fault-password-5be03f1a"}
CURVE_FIELDS = ("step", "loss", "grad_norm", "lr")

pytestmark = pytest.mark.slow

# Every project and MLflow server root this module used; the secrets test greps them all.
TOUCHED: list[Path] = []


# -- processes --------------------------------------------------------------------------------------

def proc_state(pid: int) -> str | None:
    """The state letter of a process (R running, S sleeping, T stopped, Z zombie), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while proc_state(pid) not in ("T", "t", None, "Z"):
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.0002)


def is_worker(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[1:3] == [b"-m", b"mcx.train"]


def find_worker(parent: int, timeout: float = 300) -> int:
    """The `python -m mcx.train` child of ``parent`` (an `mcx run` process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in child_pids(parent):
            if is_worker(pid):
                return pid
        time.sleep(0.01)
    raise AssertionError(f"no worker started under pid {parent} within {timeout}s")


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


class Reaper:
    """Processes a test started or stopped: whatever is left at teardown is continued and killed."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def add(self, pid: int) -> int:
        self.pids.append(pid)
        return pid

    def close(self) -> None:
        for pid in reversed(self.pids):
            if alive(pid):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    r = Reaper()
    yield r
    r.close()


def mcx_popen(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m mcx --project PROJECT ARGS...` started, not awaited (the test acts on it meanwhile)."""
    return subprocess.Popen([sys.executable, "-m", "mcx", "--project", str(project), *args], cwd=project,
                            env=env or fault_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def flat(text: str) -> str:
    """Console output with its line wrapping undone."""
    return " ".join(text.split())


def run_json(project: Path, run_id: str | None = None) -> dict:
    """run.json of ``run_id`` (or of the project's one run): status and, once ended, the summary."""
    runs = project / ".mcx" / "runs"
    if run_id is None:
        found = sorted(p.name for p in runs.iterdir())
        assert len(found) == 1, f"one spec gave run IDs {found}: were mcx's sources edited while the test ran?"
        rdir = runs / found[0]
    else:
        rdir = runs / run_id
    return json.loads((rdir / "run.json").read_text())


# -- stage directories ------------------------------------------------------------------------------

def records(stage: Path, kind: str | None = "train") -> list[dict]:
    """Complete metrics.jsonl lines (a line torn by a kill is not one)."""
    out = []
    path = stage / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out


def curve(stage: Path) -> list[tuple]:
    return [tuple(r[f] for f in CURVE_FIELDS) for r in records(stage)]


def evals(stage: Path) -> list[tuple]:
    return [(r["kind"], r["step"], r["loss"]) for r in records(stage, None) if r["kind"] in ("valid", "test")]


def latest_step(ckpts: Path) -> int:
    pointer = ckpts / "latest"
    return int(pointer.read_text().strip()[len("iter_"):]) if pointer.exists() else 0


def wait_for_step(stage: Path, step: int, *, since: float, pid: int, timeout: float = 300) -> int:
    """Wait until the process started at ``since`` has recorded train step ``step``; the step reached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [r["step"] for r in records(stage) if r["time"] >= since]
        if mine and max(mine) >= step:
            return max(mine)
        assert alive(pid), f"pid {pid} ended before step {step}: {(stage / 'worker.log').read_text()[-3000:]}"
        time.sleep(0.002)
    raise AssertionError(f"step {step} not reached within {timeout}s")


class LogTail:
    """The lines a stage's worker.log gained since the last call (one worker process's lines)."""

    def __init__(self, stage: Path) -> None:
        self.path = stage / "worker.log"
        self.seen = 0

    def new(self) -> str:
        text = self.path.read_text() if self.path.exists() else ""
        part, self.seen = text[self.seen:], len(text)
        return part


def last_step(stage: Path, since: float) -> int:
    """The last train step that the process started at ``since`` recorded completely."""
    return max((r["step"] for r in records(stage) if r["time"] >= since), default=0)


def committed(log_text: str) -> list[int]:
    return [int(line.split("checkpoint iter_")[1].split()[0]) for line in log_text.splitlines()
            if "checkpoint iter_" in line and line.endswith("committed")]


# -- the environment, projects, the reference run ---------------------------------------------------

def fault_env(**extra: str) -> dict[str, str]:
    """A subprocess's environment: the clean e2e environment plus the secrets."""
    return e2e_env(**SECRETS, **extra)


@pytest.fixture(scope="module", autouse=True)
def module_env() -> Iterator[None]:
    """In-process commands see what subprocesses see: no caller's MLFLOW_/MCX_ settings, the secrets."""
    with pytest.MonkeyPatch.context() as mp:
        for key in E2E_ENV_DROP:
            mp.delenv(key, raising=False)
        for key, value in SECRETS.items():
            mp.setenv(key, value)
        yield


@pytest.fixture
def new_project(tmp_path_factory: pytest.TempPathFactory, embedded_mlflow_db: Path) -> Callable[..., Path]:
    """A fresh quickstart project (git, DVC files, dataset, an empty embedded MLflow store)."""

    def make(name: str = "project") -> Path:
        project = make_e2e_project(tmp_path_factory.mktemp("faults") / name)
        seed_embedded_store(project, embedded_mlflow_db)
        TOUCHED.append(project)
        return project

    return make


@dataclass
class Reference:
    project: Path
    run_id: str
    stage: Path  # the full stage's directory
    curve: list[tuple]  # (step, loss, grad_norm, lr) of every step
    job: dict
    checkpoint_bytes: int  # the size of one complete checkpoint


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, embedded_mlflow_db: Path, module_env) -> Reference:
    """One uninterrupted `mcx run` of FAULT: the curve every interrupted run must match bit for bit."""
    project = seed_embedded_store(make_e2e_project(tmp_path_factory.mktemp("faults") / "reference"),
                                  embedded_mlflow_db)
    TOUCHED.append(project)
    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    summary = run_json(project)["summary"]
    assert summary["status"] == "finished" and summary["stages"]["full"]["steps"] == STEPS
    stage = project / ".mcx" / "runs" / summary["run_id"] / "full"
    ref = Reference(project, summary["run_id"], stage, curve(stage), json.loads((stage / "job.json").read_text()),
                    sum(p.stat().st_size for p in (stage / "checkpoints" / f"iter_{STEPS:07d}").iterdir()))
    assert [c[0] for c in ref.curve] == list(range(1, STEPS + 1))
    assert [(k, s) for k, s, _ in evals(stage)] == [("valid", 16), ("valid", 32), ("valid", 48), ("test", 48)]
    return ref


def assert_intact(ckpts: Path, step: int, where: str) -> None:
    """The checkpoint of ``step`` (0: none yet) is complete and every file of it matches its checksums."""
    if step == 0:
        return
    from mcx.weights.checksums import verify  # torch-free

    path = ckpts / f"iter_{step:07d}"
    problems, read = verify(path)
    assert (path / "meta.json").is_file() and problems == [] and read > 0, f"{where}: {path.name}: {problems}"


def assert_kill_left_a_consistent_stage(stage: Path, ref: Reference, last: int, latest: int, floor: list[int],
                                        where: str) -> None:
    """After a SIGKILL at step ``last``: ``latest`` names the newest checkpoint the worker reached, or
    the one before when the kill landed inside that one's save, and never less than what it had
    (``floor``: the checkpoint it resumed from, those it logged as committed); that checkpoint is
    complete and its files match their checksums; metrics.jsonl is steps 1..last of the uninterrupted
    curve, bit for bit."""
    boundary = last // INTERVAL * INTERVAL
    assert latest in (boundary, boundary - INTERVAL) and latest >= max(floor), where
    assert_intact(stage / "checkpoints", latest, where)
    assert curve(stage) == ref.curve[:last], where
    assert not (stage / "result.json").exists(), where  # killed before it could write one


def assert_matches_reference(stage: Path, uninterrupted: Path, what: str) -> None:
    """``stage`` trained every step, and its curve and evaluations are ``uninterrupted``'s, bit for bit."""
    got, want = curve(stage), curve(uninterrupted)
    assert [c[0] for c in got] == list(range(1, STEPS + 1)), f"{what}: steps {[c[0] for c in got]}"
    diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert diff is None, f"{what}: step {got[diff][0]} is {got[diff]}, the uninterrupted run had {want[diff]}"
    assert evals(stage) == evals(uninterrupted), what


# -- the fork server ----------------------------------------------------------------------------------

ZYGOTE = textwrap.dedent('''
    """Fork server: import the worker once, then fork one worker process per request.

    stdin: "run STAGE_DIR" -> stdout: the child's pid; "wait PID" -> its exit code (-N: signal N).
    """
    import os
    import sys
    import threading
    import traceback
    import warnings

    from mcx.train.worker import _import_worker

    _import_worker("cpu")  # the worker's own import step: torch, Megatron-Core, mcx.train
    from mcx.train.__main__ import main

    assert threading.active_count() == 1, threading.enumerate()
    # The one native thread besides this one is OpenBLAS's pool (numpy), which shuts itself down
    # around fork(); Python 3.12 warns about any second thread.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            pid = os.fork()
            if pid == 0:  # the worker, as `python -m mcx.train STAGE_DIR` would run it
                code = 70
                try:
                    out = os.open(os.path.join(arg, "worker.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(out, 1)
                    os.dup2(out, 2)
                    os.chdir(arg)
                    code = main([arg])
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            print(pid, flush=True)
        elif cmd == "wait":
            _, status = os.waitpid(int(arg), 0)
            print(os.waitstatus_to_exitcode(status), flush=True)
''')


class Zygote:
    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.log = workdir / "zygote.err"
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], cwd=workdir, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(self.log, "wb"), text=True)
        self.children: list[int] = []

    def _ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def _answer(self) -> str:
        answer = self.proc.stdout.readline()
        assert answer, f"the fork server died: {self.log.read_text()[-3000:]}"
        return answer.strip()

    def ready(self) -> None:
        assert self._answer() == "ready"

    def run(self, stage: Path) -> int:
        pid = int(self._ask(f"run {stage}"))
        self.children.append(pid)
        return pid

    def wait(self, pid: int) -> int:
        code = int(self._ask(f"wait {pid}"))
        self.children.remove(pid)
        return code

    def close(self) -> None:
        for pid in self.children:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory, module_env) -> Iterator[Zygote]:
    from mcx.launch.env import worker_env
    from mcx.spec import load_spec

    spec = load_spec(str(ROOT / SPEC), [a for a in FAULT if a != "--set"])
    env = fault_env(**worker_env(spec), PYTHONPATH=str(ROOT))  # what the launcher gives `python -m mcx.train`
    z = Zygote(tmp_path_factory.mktemp("zygote"), env)
    try:
        z.ready()
        yield z
    finally:
        z.close()


def worker_stage(ref: Reference, root: Path, **model: int) -> Path:
    """A stage directory holding the reference's job.json (its own checkpoint directory; ``model``
    changes model.* keys)."""
    job = json.loads(json.dumps(ref.job))
    job["checkpoint_dir"] = str(root / "checkpoints")
    job["spec"]["model"].update(model)
    root.mkdir(parents=True)
    (root / "job.json").write_text(json.dumps(job, indent=1))
    TOUCHED.append(root)
    return root


# -- 1. SIGKILL at random steps -------------------------------------------------------------------------

def stage_of(worker: int) -> Path:
    """The stage directory a `python -m mcx.train STAGE_DIR` process works in."""
    return Path(Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")[3].decode())


def test_sigkill_at_random_steps_through_mcx_run_resumes_and_matches_bitwise(new_project, reference, reaper):
    """`mcx run` (the real command line) whose worker is SIGKILLed at a random step: it exits 1 and
    says the worker was killed. `mcx run` again resumes from the last checkpoint; the curve is the
    uninterrupted one, and MLflow holds every step exactly once (steps re-run are not sent twice).
    The many kill points are the next test's; this one covers the launch path."""
    rng = random.Random(KILL_SEED)
    project = new_project()
    step = rng.randint(2, STEPS // 2)
    since = time.time()
    proc = mcx_popen(project, *RUN)
    reaper.add(proc.pid)
    worker = reaper.add(find_worker(proc.pid))
    env = environ_of(worker)
    assert all(env.get(k) == v for k, v in SECRETS.items())  # the secrets reach the worker (see the last test)
    stage = stage_of(worker)
    wait_for_step(stage, step, since=since, pid=worker)
    os.kill(worker, signal.SIGKILL)
    code, out, err = finish(proc)
    last, latest = last_step(stage, since), latest_step(stage / "checkpoints")
    where = f"killed at step {last} (target {step}, seed {KILL_SEED}), latest checkpoint {latest}"
    assert code == 1, err[-3000:]
    record = run_json(project)
    assert record["status"] == "failed" and record["summary"]["exit_code"] == 1
    assert "killed by SIGKILL" in record["summary"]["error"] and "killed by SIGKILL" in flat(err), err[-3000:]
    assert_kill_left_a_consistent_stage(stage, reference, last, latest, [0], where)

    # The next `mcx run` of the run ID (in-process) resumes and finishes.
    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    assert f"resuming from iter_{latest:07d}" in flat(res.err), where
    assert run_json(project)["status"] == "finished"
    assert_matches_reference(stage, reference.stage, where)

    # MLflow: every step exactly once (steps re-run after a resume are not sent again).
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")
    assert_recorded_once(client, stage.parent.name, stage)


def test_a_checkpoint_cut_short_after_a_kill_is_set_aside_and_mcx_run_resumes_from_the_one_before(
        new_project, reference, reaper):
    """The issue's report, through `mcx run`: the worker SIGKILLed mid-run, then the latest checkpoint's
    state.pt cut short on disk (resume used to fail on every rerun with "OSError: [Errno 22] Invalid
    argument", naming no file). The next `mcx run` says which file of which checkpoint is damaged, with
    the size recorded and the size found, and that it resumes from the checkpoint before; the curve is
    the uninterrupted one bit for bit, MLflow holds every step once, and result.json and run.json carry
    the warning. The damaged checkpoint is kept, renamed."""
    rng = random.Random(KILL_SEED + 4)
    project = new_project()
    step = rng.randint(3 * INTERVAL, STEPS // 2 + INTERVAL)  # two checkpoints or more before the kill
    since = time.time()
    proc = mcx_popen(project, *RUN)
    reaper.add(proc.pid)
    worker = reaper.add(find_worker(proc.pid))
    stage = stage_of(worker)
    wait_for_step(stage, step, since=since, pid=worker)
    os.kill(worker, signal.SIGKILL)
    code, out, err = finish(proc)
    assert code == 1, err[-3000:]
    ckpts = stage / "checkpoints"
    latest = latest_step(ckpts)
    assert_intact(ckpts, latest, f"killed at step {step}")
    state = ckpts / f"iter_{latest:07d}" / "state.pt"
    size = state.stat().st_size
    with open(state, "r+b") as f:
        f.truncate(size // 3)

    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    before = latest - INTERVAL
    warning = (f"checkpoint iter_{latest:07d} is damaged (state.pt: {size // 3} B, expected {size} B); kept as "
               f"iter_{latest:07d}.damaged. Resuming from iter_{before:07d}, the newest intact checkpoint: the steps "
               f"after {before} are trained again")
    assert f"full stage: {warning}" in flat(res.err), res.err[-3000:]
    assert json.loads((stage / "result.json").read_text())["warnings"] == [warning]
    record = run_json(project)
    assert record["status"] == "finished" and record["summary"]["stages"]["full"]["warnings"] == [warning]
    assert_matches_reference(stage, reference.stage, f"killed at step {step}, then iter_{latest:07d} cut short")
    assert (ckpts / f"iter_{latest:07d}.damaged" / "state.pt").stat().st_size == size // 3
    assert_intact(ckpts, latest_step(ckpts), "after the resume")
    from mlflow import MlflowClient

    assert_recorded_once(MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}"), stage.parent.name,
                         stage)


def assert_recorded_once(client, run_id: str, stage: Path) -> None:
    """The store holds one parent run for ``run_id`` and, in its full-stage child, every number of
    every metrics.jsonl line (``<kind>/<field>`` at the line's step) exactly once. The values of
    the training numbers are metrics.jsonl's; measurements (time, memory) of a step that ran twice
    (killed, then replayed by the resumed worker) are the first run's, the one MLflow got first."""
    exps = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(exps, f"tags.`mcx.run_id` = '{run_id}' and tags.`mcx.record` = 'run'")
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0]
    kids = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    full = [k for k in kids if k.data.tags.get("mcx.stage") == "full"]
    assert len(full) == 1, [k.data.tags for k in kids]
    expected: dict[str, list[tuple[int, float]]] = {}
    for rec in records(stage, None):
        for field, value in rec.items():
            if field not in ("kind", "step", "time") and type(value) in (int, float):
                expected.setdefault(f"{rec['kind']}/{field}", []).append((rec["step"], float(value)))
    assert {"train/loss", "train/grad_norm", "train/lr", "valid/loss", "test/loss"} <= set(expected)
    recorded = {k for k in full[0].data.metrics if k.split("/")[0] in ("train", "valid", "test")}
    assert recorded == set(expected), recorded ^ set(expected)
    for key, values in sorted(expected.items()):
        history = sorted((m.step, m.value) for m in client.get_metric_history(full[0].info.run_id, key))
        if key.split("/")[1] in ("loss", "grad_norm", "lr", "ppl"):
            assert history == sorted(values), key
        else:
            assert [step for step, _ in history] == sorted(step for step, _ in values), key
    assert parent.info.status == "FINISHED" and parent.data.tags["mcx.status"] == "finished"


def test_sigkill_at_random_steps_of_the_worker_resumes_and_matches_bitwise(reference, zygote, tmp_path):
    """KILL_TRIALS worker processes in a row on one stage directory, each SIGKILLed at a random
    step after the checkpoint it resumed from; then one runs to the end. After every kill: `latest`
    names the last checkpoint that process committed, and metrics.jsonl is a prefix of the
    uninterrupted curve, bit for bit (so every resume continued the exact timeline)."""
    rng = random.Random(KILL_SEED + 1)
    stage = worker_stage(reference, tmp_path / "stage")
    ckpts = stage / "checkpoints"
    log = LogTail(stage)
    kills = []
    for trial in range(KILL_TRIALS):
        resumed_from = latest_step(ckpts)
        step = min(resumed_from + rng.randint(1, 6), STEPS - 1)
        since = time.time()
        pid = zygote.run(stage)
        wait_for_step(stage, step, since=since, pid=pid)
        os.kill(pid, signal.SIGKILL)
        assert zygote.wait(pid) == -signal.SIGKILL
        text = log.new()
        last, latest = last_step(stage, since), latest_step(ckpts)
        kills.append((step, last, latest))
        where = f"trial {trial} (seed {KILL_SEED + 1}; target step, last step, latest): {kills}"
        if resumed_from:
            assert f"resumed from iter_{resumed_from:07d}" in text, where
        assert_kill_left_a_consistent_stage(stage, reference, last, latest, [resumed_from, *committed(text)], where)
    assert any(last > latest for _, last, latest in kills)  # some resumes had steps to replay
    pid = zygote.run(stage)
    assert zygote.wait(pid) == 0, (stage / "worker.log").read_text()[-3000:]
    assert f"resumed from iter_{kills[-1][2]:07d}" in log.new()
    assert json.loads((stage / "result.json").read_text())["status"] == "finished"
    assert_matches_reference(stage, reference.stage, f"worker killed at {kills}")


# -- 2. SIGKILL during a checkpoint write -----------------------------------------------------------------

def partial_contents(tmp: Path) -> str:
    """What a killed save left: its files and sizes."""
    try:
        return ", ".join(f"{p.name} {p.stat().st_size} B" for p in sorted(tmp.iterdir())) or "empty"
    except FileNotFoundError:
        return "gone"


def test_sigkill_during_checkpoint_writes_never_takes_a_partial_checkpoint(reference, zygote, tmp_path):
    """Worker processes in a row on one stage directory, each frozen the moment it is writing a
    chosen checkpoint (``iter_N.tmp`` exists) and SIGKILLed there, until KILL_TRIALS kills landed
    mid-write. After each: ``latest`` still names the previous complete checkpoint and nothing
    names the partial one; the next process removes the partial directory and resumes from the
    previous checkpoint. The model is widened (WIDE) so that a save takes long enough to be caught
    reliably. Finally the stage runs to the end and matches its uninterrupted run bit for bit."""
    rng = random.Random(KILL_SEED + 2)
    uninterrupted = worker_stage(reference, tmp_path / "uninterrupted", **WIDE)
    pid = zygote.run(uninterrupted)
    assert zygote.wait(pid) == 0, (uninterrupted / "worker.log").read_text()[-3000:]
    assert len(curve(uninterrupted)) == STEPS and curve(uninterrupted) != reference.curve

    stage = worker_stage(reference, tmp_path / "stage", **WIDE)
    ckpts = stage / "checkpoints"
    log = LogTail(stage)
    hits, misses = [], []
    stale: dict[str, int] = {}
    while len(hits) < KILL_TRIALS:
        assert len(misses) <= KILL_TRIALS, f"too many saves finished before the kill landed: {misses}"
        previous = latest_step(ckpts)
        assert previous < STEPS, f"the stage ended before {KILL_TRIALS} saves were caught: {hits}, missed {misses}"
        target = previous + INTERVAL * (rng.randint(1, 2) if previous + 2 * INTERVAL <= STEPS else 1)
        since = time.time()
        pid = zygote.run(stage)
        # Resumed and training: the partial directory the last kill left is gone by now (one of the
        # same name may be this process's own save already, created later).
        wait_for_step(stage, previous + 1, since=since, pid=pid)
        for name, created in stale.items():
            assert not (ckpts / name).exists() or (ckpts / name).stat().st_ctime_ns != created, name
        partial = ckpts / f"iter_{target:07d}.tmp"
        deadline = time.monotonic() + 300
        while not partial.exists():
            assert alive(pid) and time.monotonic() < deadline, f"no save of step {target}"
            time.sleep(0.0002)
        freeze(pid)
        left = partial_contents(partial)
        pointer = latest_step(ckpts)
        os.kill(pid, signal.SIGKILL)
        assert zygote.wait(pid) == -signal.SIGKILL
        stale = {p.name: p.stat().st_ctime_ns for p in ckpts.glob("*.tmp")}
        text = log.new()
        if previous:
            assert f"resumed from iter_{previous:07d}" in text
        where = f"save of step {target} (seed {KILL_SEED + 2}), kills so far {hits}"
        if left == "gone":  # the stop landed after the rename: not a kill in the middle of writing
            misses.append(target)
            assert pointer == latest_step(ckpts) in (target, target - INTERVAL), where
            assert_intact(ckpts, pointer, where)
            continue
        hits.append((target, left))
        before = target - INTERVAL  # the previous complete checkpoint (0: none yet)
        assert pointer == latest_step(ckpts) == before, where
        assert committed(text)[-1:] == ([before] if before > previous else []), where
        assert not (ckpts / f"iter_{target:07d}").exists(), where  # never renamed into place
        assert_intact(ckpts, before, where)
    previous = latest_step(ckpts)
    pid = zygote.run(stage)
    assert zygote.wait(pid) == 0, (stage / "worker.log").read_text()[-3000:]
    assert previous == 0 or f"resumed from iter_{previous:07d}" in log.new()
    assert not list(ckpts.glob("*.tmp"))
    assert_matches_reference(stage, uninterrupted, f"killed while saving (step, what the save had written): {hits}")


# -- 3. a full disk while saving ------------------------------------------------------------------------

@dataclass
class DiskFull:
    project: Path
    res: object  # CliResult of the `mcx run`
    record: dict  # run.json
    checkpoints: Path  # the full stage's checkpoint directory, on the small filesystem


@pytest.fixture(scope="module")
def disk_full(tmp_path_factory: pytest.TempPathFactory, embedded_mlflow_db: Path, reference) -> Iterator[DiskFull]:
    """`mcx run` with checkpoint.dir on a real tmpfs that holds one and a half checkpoints: the
    first save fits, the second runs out of space. Mounting needs root (CAP_SYS_ADMIN)."""
    where = tmp_path_factory.mktemp("small-fs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={reference.checkpoint_bytes * 3 // 2},mode=0755",
                              "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        missing(f"a tmpfs cannot be mounted here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        project = seed_embedded_store(make_e2e_project(tmp_path_factory.mktemp("faults") / "disk-full"),
                                      embedded_mlflow_db)
        TOUCHED.append(project)
        res = mcx_inprocess(project, *RUN, "--set", f'checkpoint.dir="{where}"')
        record = run_json(project)
        yield DiskFull(project, res, record, where / record["run_id"] / "full")
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True, capture_output=True)


def test_disk_full_while_saving_exits_1_and_keeps_the_previous_checkpoint(disk_full):
    """`mcx run` exits 1, run.json and result.json say failed, and the first checkpoint is complete,
    loadable and still `latest`: the failed save's partial ``.tmp`` directory was removed (it holds the space)."""
    res, record, ckpts = disk_full.res, disk_full.record, disk_full.checkpoints
    assert res.code == 1, res
    assert record["status"] == "failed" and record["summary"]["exit_code"] == 1
    result = json.loads((disk_full.project / ".mcx" / "runs" / record["run_id"] / "full" / "result.json").read_text())
    assert result["status"] == "failed" and result["exit_code"] == 1 and result["error"]
    assert result["error"] in flat(res.err)  # reported, not only recorded (brackets and all)
    assert latest_step(ckpts) == INTERVAL
    assert sorted(p.name for p in ckpts.iterdir()) == [f"iter_{INTERVAL:07d}", "latest"]
    meta = json.loads((ckpts / f"iter_{INTERVAL:07d}" / "meta.json").read_text())
    assert meta["step"] == INTERVAL and meta["consumed_samples"] == INTERVAL * 8
    import torch

    state = torch.load(ckpts / f"iter_{INTERVAL:07d}" / "state.pt", weights_only=True)  # complete: it loads
    assert state["scheduler"]["num_steps"] == INTERVAL


def test_disk_full_while_saving_says_the_disk_is_full_and_where(disk_full):
    error = disk_full.record["summary"]["error"]
    assert "No space left on device" in error, error  # the cause, in the OS's words
    assert str(disk_full.checkpoints) in error, error  # and where
    assert "checkpoint.dir" in error, error  # and the spec key that moves it


# -- 4. NaN ------------------------------------------------------------------------------------------

NAN_STEP = 14


def test_nan_in_the_weights_stops_mcx_run_as_diverged_with_advice(new_project, reference):
    """Every weight made NaN before step NAN_STEP (debug.nan_params_at_step): the loss and the gradients
    are NaN, the divergence guard stops the stage at that step, `mcx run` exits 1 with the reason and
    the advice, run.json says diverged, and the last checkpoint before it is kept."""
    project = new_project()
    res = mcx_inprocess(project, *RUN, "--set", f"debug.nan_params_at_step={NAN_STEP}")
    assert res.code == 1, res
    assert f"debug.nan_params_at_step: added nan to the model weights before step {NAN_STEP}" in \
        (project / ".mcx" / "runs" / run_json(project)["run_id"] / "full" / "worker.log").read_text()
    record = run_json(project)
    assert record["status"] == "diverged" and record["summary"]["exit_code"] == 1
    error = record["summary"]["error"]
    assert f"Training diverged: the loss is nan at step {NAN_STEP}" in error, error
    assert "Try: lower train.lr" in error and "The last checkpoint (before the divergence) is kept." in error
    assert error in flat(res.err)  # printed, advice included
    stage = project / ".mcx" / "runs" / record["run_id"] / "full"
    result = json.loads((stage / "result.json").read_text())
    assert result["status"] == "diverged" and result["exit_code"] == 1 and result["steps"] == NAN_STEP
    # Every step before the injection is the reference's; the injected step's loss is NaN (null).
    train = records(stage)
    assert [r["step"] for r in train] == list(range(1, NAN_STEP + 1))
    assert curve(stage)[:-1] == reference.curve[:NAN_STEP - 1] and train[-1]["loss"] is None
    # The last good checkpoint is kept, and nothing after it was saved.
    ckpts = stage / "checkpoints"
    good = (NAN_STEP - 1) // INTERVAL * INTERVAL
    assert latest_step(ckpts) == good
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("iter_")) == \
        [f"iter_{good - INTERVAL:07d}", f"iter_{good:07d}"]  # checkpoint.keep = 2
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    (parent,) = client.search_runs(exps, f"tags.`mcx.run_id` = '{record['run_id']}' and tags.`mcx.record` = 'run'")
    assert parent.info.status == "FAILED" and parent.data.tags["mcx.status"] == "diverged"


# -- 5. SIGTERM and Ctrl-C -------------------------------------------------------------------------------

HANG_S = 300  # a hang guard: a worker still running this long after SIGTERM is not stopping


def wait_exit(pid: int, timeout: float) -> float:
    """Seconds until ``pid`` exits (becomes a zombie or disappears), for the failure message."""
    t0 = time.monotonic()
    while alive(pid):
        assert time.monotonic() - t0 < timeout, f"pid {pid} still running {timeout}s after SIGTERM"
        time.sleep(0.01)
    return time.monotonic() - t0


# Where the signal goes, which signal, and how `mcx run` ends: a scheduler preempting the worker is the
# worker's own documented stop (exit 0, "preempted"); SIGTERM to `mcx run` (`kill PID`) and Ctrl-C (SIGINT
# to the terminal's whole foreground process group) are the user's, exit 130, "interrupted" (D47).
STOPS = (("worker", signal.SIGTERM, 0, "preempted"), ("mcx run", signal.SIGTERM, 130, "interrupted"),
         ("process group", signal.SIGINT, 130, "interrupted"))


def test_sigterm_and_ctrl_c_checkpoint_stop_and_the_rerun_matches(new_project, reference, reaper):
    """SIGTERM to the worker (a scheduler preempting it), SIGTERM to `mcx run` itself, then SIGINT to the
    process group of `mcx run` as a terminal's Ctrl-C sends it (both forwarded to the worker as SIGTERM):
    each time the worker saves a checkpoint at the step it reached and exits of its own accord before
    the end (exit 0, not killed; how fast is benchmarks' business, not a test's). The
    preempted run exits 0 with status preempted; the interrupted ones exit 130 with status interrupted
    and one line saying that the stage is resumable, from which checkpoint, and how. A last `mcx run`
    resumes and the curve is the uninterrupted one."""
    rng = random.Random(KILL_SEED + 3)
    project = new_project()
    stops = []
    for target, sig, exit_code, status in STOPS:
        since = time.time()
        proc = mcx_popen(project, *RUN)
        reaper.add(proc.pid)
        worker = reaper.add(find_worker(proc.pid))
        stage = stage_of(worker)
        step = latest_step(stage / "checkpoints") + rng.randint(2, 2 * INTERVAL)
        wait_for_step(stage, step, since=since, pid=worker)
        if target == "process group":
            os.killpg(proc.pid, sig)  # mcx_popen starts `mcx run` as its group's leader
        else:
            os.kill(worker if target == "worker" else proc.pid, sig)
        took = wait_exit(worker, HANG_S)
        code, out, err = finish(proc)
        result = json.loads((stage / "result.json").read_text())
        stopped = result["steps"]
        stops.append((target, sig.name, step, stopped, round(took, 2)))
        where = f"{sig.name} to the {target}: {stops}"
        assert code == exit_code, f"{where}\n{err[-3000:]}"
        # The worker stopped on SIGTERM (the scheduler's, or the one `mcx run` forwarded) and saved; the stage's
        # record says who stopped it, as `mcx ls` shows it.
        assert result["status"] == status and result["exit_code"] == 0, where
        assert result["details"]["stop_signal"] == signal.SIGTERM, where
        listed = json.loads(mcx_inprocess(project, "ls", "--json").out)
        assert [(r["status"], r["stages"]["full"]["status"]) for r in listed] == [(status, status)], where
        assert step <= stopped < STEPS and latest_step(stage / "checkpoints") == stopped, where  # saved there
        record = run_json(project)
        assert record["status"] == status and record["summary"]["exit_code"] == exit_code, where
        assert record["summary"]["stages"]["full"]["status"] == status, where
        assert curve(stage) == reference.curve[:stopped], where
        if status == "interrupted":
            line = (f"mcx: interrupted by {sig.name}: the full stage stopped at step {stopped} and is resumable from "
                    f"its checkpoint iter_{stopped:07d}: the same `mcx run` command resumes it")
            assert [x for x in err.splitlines() if x.startswith("mcx:")] == [line], f"{where}\n{err[-3000:]}"
            assert record["summary"]["error"] == line[len("mcx: "):], where
    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    assert f"resuming from iter_{stops[-1][3]:07d}" in flat(res.err)
    assert run_json(project)["status"] == "finished"
    assert_matches_reference(stage, reference.stage, f"stopped at {stops}")


# -- 6. the tracking server away ----------------------------------------------------------------------

def server_client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def sync_all(project: Path) -> dict:
    res = mcx_inprocess(project, "sync", "--json")
    assert res.code == 0, res
    return res.json()


def test_tracking_server_down_for_the_whole_run_then_sync_records_every_metric_once(
        new_project, reference, mlflow_server, monkeypatch):
    """MLFLOW_TRACKING_URI names a real server that is down: `mcx run` trains to the end (exit 0),
    says the records are spooled; after the server starts, `mcx sync` sends every metric exactly
    once, and a second sync sends nothing."""
    TOUCHED.append(mlflow_server.root)
    mlflow_server.stop()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    project = new_project()
    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    assert "tracking store unreachable" in flat(res.err) and "records are spooled: run `mcx sync`" in flat(res.err)
    record = run_json(project)
    stage = project / ".mcx" / "runs" / record["run_id"] / "full"
    assert record["status"] == "finished"
    assert_matches_reference(stage, reference.stage, "trained with the server down")

    mlflow_server.start()
    report = sync_all(project)
    assert report["ok"] and report["metrics_sent"] > 0, report
    assert_recorded_once(server_client(mlflow_server.uri), record["run_id"], stage)
    again = sync_all(project)
    assert again["ok"] and again["ops_sent"] == 0 and again["metrics_sent"] == 0, again


def test_training_machine_without_mlflow_or_dvc_trains_then_sync_records_every_metric_once(
        new_project, reference, tmp_path):
    """A GPU node that has the worker's packages but not the tracking extra (no mlflow, no dvc
    importable): `mcx run` trains to the end (exit 0) and says why nothing was recorded; where mlflow
    is installed, `mcx sync` then sends every metric exactly once."""
    blocker = tmp_path / "no-tracking-extra"
    for name in ("mlflow", "dvc"):
        (blocker / name).mkdir(parents=True)
        (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed')\n")
    project = new_project()
    proc = mcx_popen(project, *RUN, env=fault_env(PYTHONPATH=str(blocker)))
    code, out, err = finish(proc)
    assert code == 0, err
    assert "MLflow is not importable here" in flat(err) and "records are spooled: run `mcx sync`" in flat(err)
    assert "checkpoint not added to DVC: DVC is not importable here" in flat(err)
    assert flat(err).count("stays spooled") <= 1, err  # said once, not at every flush
    record = run_json(project)
    stage = project / ".mcx" / "runs" / record["run_id"] / "full"
    assert record["status"] == "finished"
    assert_matches_reference(stage, reference.stage, "trained without the tracking extra")
    report = sync_all(project)
    assert report["ok"] and report["metrics_sent"] > 0, report
    assert_recorded_once(server_client(f"sqlite:///{project / '.mcx' / 'mlflow.db'}"), record["run_id"], stage)


def test_tracking_server_stopped_mid_run_then_sync_records_every_metric_once(
        new_project, reference, mlflow_server, reaper):
    """A real server that goes away while the worker trains: some metrics reached it, the rest are
    spooled; `mcx run` finishes (exit 0); after a restart `mcx sync` completes the record, with no
    metric sent twice. The worker is held (SIGSTOP) while the server stops, so the outage is mid-run."""
    TOUCHED.append(mlflow_server.root)
    if mlflow_server.proc is None:
        mlflow_server.start()
    client = server_client(mlflow_server.uri)
    # The module's earlier tests recorded this run ID on the same server, and mcx records into the run
    # that carries its ID: each trial starts from a server without them. The worker runs at the lowest
    # priority so that this process, polling its steps, is scheduled first; should it still finish
    # before it is held (a loaded machine), a fresh project tries again.
    for _ in range(3):
        for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
            client.delete_run(run.info.run_id)
        project = new_project()
        since = time.time()
        proc = mcx_popen(project, *RUN, env=fault_env(MLFLOW_TRACKING_URI=mlflow_server.uri))
        reaper.add(proc.pid)
        worker = reaper.add(find_worker(proc.pid))
        os.setpriority(os.PRIO_PROCESS, worker, 19)
        stage = stage_of(worker)
        run_id = stage.parent.name
        wait_for_step(stage, STEPS // 4, since=since, pid=worker)
        freeze(worker)
        if alive(worker) and max(r["step"] for r in records(stage)) < STEPS:
            break
        os.kill(worker, signal.SIGCONT)
        finish(proc)
    else:
        raise AssertionError(f"the worker finished all {STEPS} steps before it could be held, three times")
    deadline = time.monotonic() + 120
    sent: list = []
    while not sent:  # the forwarder sends every few seconds
        assert time.monotonic() < deadline and proc.poll() is None, "no metric reached the server"
        parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                     f"tags.`mcx.run_id` = '{run_id}' and tags.`mcx.record` = 'run'")
        kids = parents and client.search_runs([parents[0].info.experiment_id],
                                              f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
        if kids:
            sent = client.get_metric_history(kids[0].info.run_id, "train/loss")
        time.sleep(0.25)
    mlflow_server.stop()
    os.kill(worker, signal.SIGCONT)
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "records are spooled: run `mcx sync`" in flat(err)
    assert len(sent) < STEPS  # the server had part of the run when it went away
    assert_matches_reference(stage, reference.stage, "trained while the server went away")

    mlflow_server.start()
    report = sync_all(project)
    assert report["ok"] and report["metrics_sent"] > 0, report
    assert_recorded_once(client, run_id, stage)
    again = sync_all(project)
    assert again["ok"] and again["ops_sent"] == 0 and again["metrics_sent"] == 0, again


# -- 7. two `mcx run`s of one run ID --------------------------------------------------------------------

def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False


def test_concurrent_mcx_runs_of_one_run_id_train_once(new_project, reference, reaper):
    """Two `mcx run`s of the same spec started together: exactly one trains; the other reports the
    run ID is training in the winner's process and exits 1. A third, with --wait, started while the
    winner trains, waits for it and reports the cached result. The run directory and the MLflow
    store hold one clean run."""
    project = new_project()
    since = time.time()
    racers = [mcx_popen(project, *RUN) for _ in range(2)]
    for p in racers:
        reaper.add(p.pid)
    deadline = time.monotonic() + 300
    worker = None
    while worker is None:
        assert time.monotonic() < deadline, "neither `mcx run` started a worker"
        for p in racers:
            found = [pid for pid in child_pids(p.pid) if is_worker(pid)]
            if found:
                winner, worker = p, reaper.add(found[0])
        time.sleep(0.01)
    (loser,) = [p for p in racers if p is not winner]
    stage = stage_of(worker)
    wait_for_step(stage, 2, since=since, pid=worker)
    freeze(worker)  # hold the winner mid-training while the others arrive
    code, out, err = finish(loser, timeout=300)
    assert code == 1, err[-3000:]
    assert f"run {stage.parent.name} is training in " in flat(err) and f"pid {winner.pid}" in flat(err), err[-3000:]
    assert "--wait" in flat(err)

    waiter = mcx_popen(project, *RUN, "--wait", "--json")
    reaper.add(waiter.pid)
    lock = stage.parent / "lock"
    held_since = None
    while held_since is None or time.monotonic() - held_since < 2.0:  # several of its lock polls
        assert waiter.poll() is None, waiter.communicate()
        if holds_open(waiter.pid, lock):
            held_since = held_since or time.monotonic()
        else:
            held_since = None
        time.sleep(0.05)
    os.kill(worker, signal.SIGCONT)
    code, out, err = finish(winner)
    assert code == 0, err[-3000:]
    code, wout, werr = finish(waiter)
    assert code == 0, werr[-3000:]
    cached = json.loads(wout.strip().splitlines()[-1])
    assert cached["cached"] is True and cached["status"] == "finished" and cached["run_id"] == stage.parent.name
    assert "already finished" in flat(werr) and "not training again" in flat(werr)

    # One clean run: one run directory, one timeline, no archive, the lock free, one MLflow record.
    runs = project / ".mcx" / "runs"
    assert [p.name for p in runs.iterdir()] == [stage.parent.name]
    assert not (project / ".mcx" / "archive").exists()
    assert run_json(project)["status"] == "finished"
    assert_matches_reference(stage, reference.stage, "trained while two others wanted the run ID")
    from mcx.track.runcache import holder_of

    assert holder_of(stage.parent) is None
    assert_recorded_once(server_client(f"sqlite:///{project / '.mcx' / 'mlflow.db'}"), stage.parent.name, stage)


# -- 8. security ------------------------------------------------------------------------------------------

def hostile(pwned: Path) -> str:
    """A value that runs ``touch PWNED`` wherever a shell evaluates it unquoted, in every way it can."""
    return f"$(touch {pwned}) `touch {pwned}`; touch {pwned} && echo 'q' \"d\" $HOME %j"


STUBS = {  # Slurm's commands, for running a batch script on a machine without Slurm: record, answer
    "srun": '#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done > "$MCX_STUB_DIR/srun.argv"\n',
    "scontrol": '#!/bin/sh\necho node-1\n',
    "scancel": '#!/bin/sh\nexit 0\n',
}


def test_hostile_spec_values_are_never_executed(tmp_path, new_project):
    """A project whose path, and a spec whose name and Slurm fields, hold shell commands: the name
    is refused (exit 2, nothing written); `mcx run --dry-run` renders the Slurm scripts with every
    value quoted, and real bash running those scripts (Slurm's commands stubbed to record their
    arguments) executes none of it: srun receives the hostile path as one literal argument."""
    import tomli_w

    pwned = tmp_path / "pwned"
    evil = hostile(pwned)
    project = new_project(f"p {hostile(pwned)}")
    spec = project / "experiments" / "hostile.toml"
    spec.write_text(tomli_w.dumps({
        "extends": "tiny.toml",
        "description": evil,
        "launch": {"kind": "slurm", "slurm": {"partition": evil, "account": evil, "qos": evil, "constraint": evil,
                                              "extra_sbatch": [f"--comment={evil}"]}},
    }))

    named = mcx_inprocess(project, "run", str(spec), "--set", f"name={json.dumps('x' + evil)}", "--dry-run")
    assert named.code == 2 and "name: " in named.err and "must be 1-100 letters, digits" in named.err, named
    assert not (project / ".mcx" / "runs").exists()

    res = mcx_inprocess(project, "run", str(spec), "--dry-run", "--json")
    assert res.code == 0, res
    dry = res.json()
    assert dry["status"] == "dry-run" and set(dry["scripts"]) == {"smoke", "full"}
    assert not pwned.exists()
    assert not (project / ".mcx" / "runs").exists()  # a dry run writes nothing

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    for stage, script in dry["scripts"].items():
        sdir = project / ".mcx" / "runs" / dry["run_id"] / stage
        # sbatch reads the #SBATCH lines with shell quoting: each is one option, the value intact.
        options = dict(shlex.split(line[len("#SBATCH "):])[0].split("=", 1) for line in script.splitlines()
                       if line.startswith("#SBATCH ") and "=" in line)
        for key in ("--partition", "--account", "--qos", "--constraint"):
            assert options[key] == evil, (key, options[key])
        assert options["--comment"] == evil
        assert options["--output"].startswith(str(sdir).replace("%", "%%"))
        # bash runs the script body: the stage directory, the exports, srun's command line.
        sdir.mkdir(parents=True)
        (tmp_path / f"{stage}.sh").write_text(script)
        ran = subprocess.run(["bash", str(tmp_path / f"{stage}.sh")], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60, env={"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path),
                                              "MCX_STUB_DIR": str(tmp_path), "SLURM_JOB_ID": "42",
                                              "SLURM_JOB_NODELIST": "node-1", "SLURM_JOB_NUM_NODES": "1",
                                              "SLURM_CPUS_ON_NODE": "2"})
        assert ran.returncode == 0, ran.stderr
        assert not pwned.exists(), f"the {stage} script ran a command from the spec or the path:\n{script}"
        argv = (tmp_path / "srun.argv").read_text().split("\0")[:-1]
        assert argv[-3:] == ["-m", "mcx.train", str(sdir)], argv
    assert not pwned.exists()


def test_no_secret_reaches_a_run_directory_or_a_tracking_store(reference):
    """SECRETS were in the environment of every command and worker of this module (the kill test
    checks a worker's environment). Not one byte of them is in any file a run left: run and stage
    directories, checkpoints, the tracking spools, the embedded MLflow stores (SQLite bytes and
    artifacts), the DVC remotes, the MLflow server's database and artifacts."""
    assert all(os.environ.get(k) == v for k, v in SECRETS.items())
    roots = [p / ".mcx" if (p / ".mcx").is_dir() else p for p in dict.fromkeys(TOUCHED)]
    files = [f for root in roots for f in root.rglob("*") if f.is_file()]
    assert len(files) > 50 and any(f.name == "mlflow.db" for f in files)
    leaks = [(str(f), name) for f in files for name, value in SECRETS.items() if value.encode() in f.read_bytes()]
    assert not leaks, leaks
    # The recorded environment saw MLFLOW_TRACKING_PASSWORD (it records MLFLOW_* variables) and redacted it.
    reports = list((reference.project / ".mcx").rglob("environment.json"))  # the spooled copy and the artifact
    assert reports
    for report in reports:
        assert json.loads(report.read_text())["environment_variables"]["MLFLOW_TRACKING_PASSWORD"] == "***"


# -- a job file of an older mcx with test hooks ---------------------------------------------------------

def test_a_job_file_with_an_older_mcxs_test_hooks_is_refused(new_project, tmp_path):
    """Fault injection is the spec's [debug] table; the job contract has no test switch. A job file that
    an older control plane wrote with ``test_hooks`` is refused by the worker (exit 2, the key and the
    fix in result.json), before anything trains: it is never half-applied."""
    import subprocess
    import sys

    project = new_project()
    res = mcx_inprocess(project, *RUN)
    assert res.code == 0, res
    job = json.loads((project / ".mcx" / "runs" / run_json(project)["run_id"] / "full" / "job.json").read_text())
    assert "test_hooks" not in job and "debug" not in job["spec"]  # no [debug]: nothing about it in the contract
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "job.json").write_text(json.dumps({**job, "test_hooks": {"perturb_params_at_step": "5"}}))
    proc = subprocess.run([sys.executable, "-m", "mcx.train", str(stage)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    said = json.loads((stage / "result.json").read_text())["error"]
    assert "test_hooks: an older mcx's test hooks" in said and "[debug]" in said, said
    assert not (stage / "metrics.jsonl").exists()
