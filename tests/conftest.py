"""Shared pytest fixtures. Each helper keeps its fixtures in its own clearly marked section."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# --- tracking (mcx.track): git+DVC projects, hand-written run directories, a real MLflow server ---

def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=mcx-test", "-c", "user.email=mcx-test@example.invalid", *args],
                   cwd=cwd, check=True, capture_output=True)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on loopback, which a test can stop and start again on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
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
