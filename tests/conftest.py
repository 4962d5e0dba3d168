"""Shared pytest fixtures. Each helper keeps its fixtures in its own clearly marked section."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- skips that CI must not take ---

# In CI (CI set, as GitHub Actions and ./dev's callers set it) the test environment is complete: a skip for
# something missing would hide a failure, so it fails instead (tests/test_slurm.py, the Slurm cluster).
IN_CI = bool(os.environ.get("CI"))


def missing(what: str) -> None:
    """Skip because ``what`` is missing here; under CI, fail saying so."""
    if IN_CI:
        pytest.fail(f"CI is set but {what}")
    pytest.skip(what)

# --- pytest-xdist (./dev test runs -n 2 --dist loadfile, docs/decisions.md D59): workers sharing one machine ---

def _share_cpus() -> None:
    """Under xdist, each worker's torch and the mcx workers it starts get an equal share of the CPUs, unless
    the caller set OMP_NUM_THREADS: two workers of two threads each on 2 cores made a training step 9x slower
    (D59). Set before any test imports torch, which reads it once."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        from mcx.launch.env import omp_threads

        os.environ["OMP_NUM_THREADS"] = omp_threads(int(workers))


_share_cpus()

# The files that take longest, longest first (their summed test times in a clean-clone run, D59). xdist hands
# whole files to its workers in collection order (./dev passes --no-loadscope-reorder), so these start first
# and no long file starts last, while the other worker runs the many short ones.
SLOW_FILES = ("test_reproduce.py", "test_slurm.py", "test_faults.py", "test_sweep.py", "test_outages.py",
              "test_watchdog.py", "test_eval.py", "test_types.py", "test_locate_layouts.py", "test_detach.py",
              "test_hf.py", "test_lineage.py", "test_e2e.py", "test_mixture.py", "test_detach_local.py",
              "test_identity.py", "test_gc.py", "test_data.py", "test_share.py", "test_prepare.py", "test_track.py",
              "test_fullstate.py", "test_artifacts.py", "test_train.py", "test_container.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))  # stable: in-file order kept


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on a resource this machine has one of, across xdist workers (and sessions)."""
    with open(Path(tempfile.gettempdir()) / f"mcx-tests-{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _one_test_on_the_slurm_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked slurm use the one local cluster (two nodes of 2 CPUs, on this machine) one at a time: a job of
    another worker's test would hold the CPUs that a test's jobs wait on or must share (two sweep trials at once)."""
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    with machine_lock("slurm"):
        yield

# --- end of pytest-xdist fixtures ---

# --- tracking (mcx.track): git+DVC projects, hand-written run directories, a real MLflow server ---

def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=mcx-test", "-c", "user.email=mcx-test@example.invalid", *args],
                   cwd=cwd, check=True, capture_output=True)


def git_head(project: Path) -> str:
    return subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def make_git_dvc_project(root: Path) -> Path:
    """A real project: git repo + `dvc init`, .mcx/ ignored, one commit."""
    root.mkdir(parents=True, exist_ok=True)
    from dvc.repo import Repo

    _git(root, "init", "-q", "-b", "main")
    Repo.init(str(root)).close()  # `dvc init`, in-process (the CLI would pay DVC's import again)
    (root / ".gitignore").write_text("/.mcx/\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "init")
    return root


@pytest.fixture
def git_dvc_project(tmp_path: Path, embedded_mlflow_db: Path) -> Path:
    return seed_embedded_store(make_git_dvc_project(tmp_path / "project"), embedded_mlflow_db)


@pytest.fixture(scope="session")
def embedded_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, created (schema migrations: seconds) once per session."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def seed_embedded_store(project: Path, template: Path) -> Path:
    """Give ``project`` a copy of the empty store, as if mcx had created it there."""
    import shutil

    (project / ".mcx").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, project / ".mcx" / "mlflow.db")
    return project


@pytest.fixture
def mlflow_project(tmp_path: Path, embedded_mlflow_db: Path) -> Path:
    """A project directory (no git) whose embedded MLflow store exists and is empty."""
    return seed_embedded_store(tmp_path / "p", embedded_mlflow_db)


def _reserved_port() -> socket.socket:
    """A socket bound (not listening) to a free loopback port with SO_REUSEADDR: the kernel gives that port to
    no other bind(0) (another xdist worker's server, a torchrun rendezvous) while it is open, connections to it
    are refused as to a stopped server, and a server that also sets SO_REUSEADDR (uvicorn, gunicorn) can
    still listen on it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


class MlflowServer:
    """A real `mlflow server` on loopback, which a test can stop and start again on the same port (held for
    this object's life, so no other process takes it while the server is down)."""

    def __init__(self, root: Path) -> None:
        import weakref

        self.root = root
        reservation = _reserved_port()
        weakref.finalize(self, reservation.close)
        self.port = reservation.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> None:
        assert self.proc is None
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("mlflow server did not answer /health in time")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its workers
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A stopped server (tests start and stop it); always stopped at the end of the module."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield server
    server.stop()

# --- end of tracking fixtures ---

# --- end-to-end (tests/test_e2e.py, tests/test_reproduce.py): a real project, the real CLI ---

E2E_ROOT = Path(__file__).resolve().parent.parent
# What a user's project holds, copied from this repository (the dataset comes separately).
E2E_FILES = ("experiments/tiny.toml", "experiments/tiny_moe.toml", ".dvc/config", ".dvc/.gitignore", ".dvcignore",
             "data.dvc", ".gitignore", "lockfiles/cpu.txt")
# Variables that would send records elsewhere, choose another lockfile, or inject faults.
E2E_ENV_DROP = ("MLFLOW_TRACKING_URI", "MCX_PROJECT", "MCX_LOCKFILE")


def e2e_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in E2E_ENV_DROP}
    return {**env, **extra}


def quickstart_dataset() -> Path:
    """This repository's data/quickstart, built with `mcx data prepare` (checked against data.dvc) if missing."""
    path = E2E_ROOT / "data" / "quickstart"
    if (path / "manifest.json").exists():
        return path
    # One xdist worker prepares it; the other waits, then finds it (data.dvc: a file every checkout has).
    with open(E2E_ROOT / "data.dvc", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "manifest.json").exists():
            subprocess.run([sys.executable, "-m", "mcx", "--project", str(E2E_ROOT), "data", "prepare"],
                           cwd=E2E_ROOT, env=e2e_env(), check=True, capture_output=True, timeout=1200)
    return path


def make_e2e_project(root: Path) -> Path:
    """A user's project: a git repository with the quickstart specs, data.dvc, the CPU lockfile and
    the prepared dataset (git-ignored, DVC-tracked), one commit."""
    import shutil

    for rel in E2E_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(E2E_ROOT / rel, root / rel)
    shutil.copytree(quickstart_dataset(), root / "data" / "quickstart")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "quickstart project")
    return root


class CliResult:
    """Exit code, stdout and stderr of one mcx command."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self):
        """The last stdout line as JSON (what --json promises)."""
        import json

        lines = self.out.strip().splitlines()
        assert lines, f"no stdout; stderr:\n{self.err[-3000:]}"
        return json.loads(lines[-1])

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, stdout={self.out[-1500:]!r}, stderr={self.err[-3000:]!r})"


def mcx_subprocess(project: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900,
                   prefix: tuple[str, ...] = ()) -> CliResult:
    """`python -m mcx --project PROJECT ARGS...` in the project, as a user types it (``prefix``: a command
    that runs it, such as unshare)."""
    proc = subprocess.run([*prefix, sys.executable, "-m", "mcx", "--project", str(project), *args], cwd=project,
                          env=env or e2e_env(), capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def mcx_inprocess(project: Path, *args: str) -> CliResult:
    """mcx.cli.main.main([...]) in this process, from the project directory (no interpreter start, no
    second MLflow import). The caller keeps the environment clean (e2e_clean_env); workers still run
    as real subprocesses."""
    import contextlib
    import io

    from mcx.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(project), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--project", str(project), *args])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def e2e_clean_env():
    """Module-wide: no MLFLOW_TRACKING_URI / MCX_* from the caller's shell reaches in-process commands."""
    with pytest.MonkeyPatch.context() as mp:
        for key in E2E_ENV_DROP:
            mp.delenv(key, raising=False)
        yield

# --- end of end-to-end fixtures ---
