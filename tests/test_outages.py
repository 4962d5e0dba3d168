"""Tracking outages bounded (D50), against real engines: a real `mlflow server` on loopback stopped and
started again, a second server for `mcx sync --to`, a TCP listener that accepts and never answers (a
hung server) counting the connections mcx makes to it, and real processes racing on `.mcx/restore/`.

Timeouts on the subprocesses are hang guards only; what is asserted is what mcx did and said."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import MlflowServer, e2e_env, make_git_dvc_project, mcx_subprocess
from test_track import (
    STEPS,
    append_lines,
    assert_run_complete,
    client_for,
    make_run_dir,
    record_run,
    stage_lines,
    write_result,
)

from mcx.track import RunRecorder
from mcx.track.dvc_store import ensure_remote

REPO = Path(__file__).resolve().parents[1]
RUN_ARTIFACTS = {"spec.toml", "fingerprint.json", "plan.json", "smoke", "run.json"}
HANG_GUARD_S = 600


class SilentServer:
    """A TCP port that accepts connections and never answers: a hung server, or a proxy in front of a dead one."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # held open, never read or answered

    @property
    def connections(self) -> int:
        return len(self.accepted)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class SlowProxy:
    """A TCP proxy in front of a real server that holds every chunk a client sends for ``delay`` seconds:
    a server that answers, slowly."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream, self.delay = upstream_port, delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, self.delay), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


def sync_cli(project: Path, *args: str, **env: str):
    return mcx_subprocess(project, "sync", *args, env=e2e_env(**env), timeout=HANG_GUARD_S)


def offline_runs(project: Path, uri: str, n: int) -> list[str]:
    """``n`` runs recorded while ``uri`` did not answer: everything is spooled."""
    rids = [f"00000000d{i:03x}" for i in range(n)]
    for rid in rids:
        _, entry = record_run(project, make_run_dir(project, rid), tracking_uri=uri, live=False)
        assert entry.state == "pending", entry
    return rids


def assert_one_paragraph_naming(err: str, uri: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mcx: error: "), err
    assert uri in err and "`mcx sync --to URI`" in err and "start the server" in err, err
    assert "MlflowException" not in err and "Traceback" not in err and "HTTPConnectionPool" not in err, err


def test_sync_waits_on_a_hung_server_once_and_says_what_is_pending_by_run_and_stage(
        tmp_path: Path, silent: SilentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    # What a user's shell may hold for other MLflow work; mcx's spool is its retry (D50).
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    project = tmp_path / "p"
    rids = offline_runs(project, silent.uri, 3)
    before = silent.connections

    res = sync_cli(project, "--json", MLFLOW_HTTP_REQUEST_TIMEOUT="2", MLFLOW_HTTP_REQUEST_MAX_RETRIES="7")
    assert res.code == 1, res
    assert silent.connections - before == 1  # the first request found it down; no other run waited on it
    doc = json.loads(res.out)  # exactly one JSON object on stdout
    assert doc["ok"] is False
    assert [(r["run_id"], r["state"], r["pending"]) for r in doc["runs"]] == \
        [(rid, "pending", ["run", "smoke", "full"]) for rid in rids]
    assert doc["unreachable"] == [{"target": silent.uri, "reason": "no answer within 2 s",
                                   "waited_s": doc["unreachable"][0]["waited_s"]}]
    assert_one_paragraph_naming(res.err, silent.uri)
    assert "the records of 3 runs stay spooled" in res.err

    text = sync_cli(project, MLFLOW_HTTP_REQUEST_TIMEOUT="2")
    assert text.code == 1, text
    assert "3 still pending" in text.out
    for rid in rids:
        assert f"  {rid}: run, smoke, full -> {silent.uri}" in text.out.splitlines()


def test_the_end_of_a_run_does_not_wait_again_on_a_server_its_forwarder_found_hung(
        tmp_path: Path, silent: SilentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mcx run`'s end (the stage's last drain, then close()) makes no new request to a server the
    forwarder's polls found down: at most the poll already in flight completes."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    project = tmp_path / "p"
    rdir = make_run_dir(project, "00000000e001", stages=("smoke",))
    rec = RunRecorder.for_run(project, rdir, tracking_uri=silent.uri)
    rec.start(launcher="local")
    rec.start_stage("smoke")
    fwd = rec.forwarder("smoke", poll_s=0.05).start()
    append_lines(rdir / "smoke", stage_lines(1, 30, test_at=30))
    deadline = time.monotonic() + HANG_GUARD_S
    while rec.down() is None:  # the forwarder's poll waited out the timeout and marked the server down
        assert time.monotonic() < deadline, "the forwarder never tried the server"
        time.sleep(0.05)
    write_result(rdir / "smoke", 30)  # the worker exits: the stage ends
    at_end = silent.connections
    last = fwd.stop()
    rec.finish_stage("smoke")
    rec.finish("finished")
    entry = rec.close()
    assert silent.connections - at_end <= 1  # only a poll that was already under way
    assert last is not None and last.error == "no answer within 1 s" and last.pending_bytes > 0
    assert entry.state == "pending" and entry.error == "no answer within 1 s"
    assert entry.pending_records == ("run", "smoke")


@pytest.mark.slow
def test_the_end_of_a_run_leaves_what_a_slow_server_has_not_taken_to_sync(
        tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers every request, but slowly, holds `mcx run`'s end (close()) no longer than
    its sending budget; `mcx sync` sends the rest."""
    import mcx.track.recorder as recorder

    if mlflow_server.proc is None:
        mlflow_server.start()
    proxy = SlowProxy(mlflow_server.port, delay=0.5)
    monkeypatch.setattr(recorder, "CLOSE_SEND_S", 2.0)  # 30 s in a run; the proxy's delay is fixed
    try:
        project = tmp_path / "p"
        rid = "00000000e002"
        _, entry = record_run(project, make_run_dir(project, rid), tracking_uri=proxy.uri, live=False)
        assert entry.state == "pending" and entry.ops_sent >= 1 and entry.ops_pending >= 1, entry
        assert entry.error.startswith("the store answered too slowly"), entry
        assert entry.pending_records[0] == "run"
        res = sync_cli(project)
        assert res.code == 0 and res.out.strip().endswith("nothing pending"), res
        assert_run_complete(client_for(mlflow_server.uri), rid, parent_artifacts=RUN_ARTIFACTS)
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_drain_to_a_slow_server_stops_when_its_time_is_up_and_the_next_sends_the_rest_once(
        tmp_path: Path, mlflow_server: MlflowServer) -> None:
    """A stage's backlog sent to a server that answers slowly goes in time slices (the end of a stage
    waits one slice at most), each resuming where the last stopped, every metric exactly once."""
    from test_track import assert_exactly_once, expected_curves, runs_of

    if mlflow_server.proc is None:
        mlflow_server.start()
    proxy = SlowProxy(mlflow_server.port, delay=0.5)
    try:
        project = tmp_path / "p"
        rid = "00000000e003"
        rdir = make_run_dir(project, rid, stages=("smoke",))
        rec = RunRecorder.for_run(project, rdir, tracking_uri=proxy.uri)
        rec.start(launcher="local")
        rec.start_stage("smoke")
        assert rec.flush().pending == 0  # the records exist; the backlog is the metrics
        lines = stage_lines(1, 800)  # 5,760 metrics: 6 requests of at most 1,000
        total = sum(len(values) for values in expected_curves(lines).values())
        append_lines(rdir / "smoke", lines)
        fwd = rec.forwarder("smoke")
        sliced = fwd.drain(until=time.monotonic() + 0.2)
        assert sliced.error.startswith("the store answered too slowly"), sliced
        assert 0 < sliced.metrics < total and sliced.pending_bytes > 0, sliced
        rest = fwd.drain()
        assert rest.error is None and rest.pending_bytes == 0 and sliced.metrics + rest.metrics == total, rest
        assert_exactly_once(client_for(mlflow_server.uri), runs_of(client_for(mlflow_server.uri), rid)["smoke"], lines)
    finally:
        proxy.close()


@pytest.mark.slow
def test_server_down_then_up_sync_sends_everything_and_exits_0(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    mlflow_server.stop()
    project = tmp_path / "p"
    rids = offline_runs(project, mlflow_server.uri, 2)
    # A worker killed mid-line leaves a torn last line: never sendable, so never "pending" (issue 35's
    # "2 still pending: None" after the server came back).
    with open(project / ".mcx" / "runs" / rids[1] / "full" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 61, "lo')

    down = sync_cli(project, "--json")
    assert down.code == 1, down
    doc = json.loads(down.out)
    assert [r["pending"] for r in doc["runs"]] == [["run", "smoke", "full"]] * 2
    assert doc["unreachable"][0]["reason"] == "connection refused"
    assert_one_paragraph_naming(down.err, mlflow_server.uri)

    mlflow_server.start()
    up = sync_cli(project)
    assert up.code == 0, up
    assert up.out.strip().endswith("nothing pending") and "mcx: error" not in up.err, up
    client = client_for(mlflow_server.uri)
    for rid in rids:
        assert_run_complete(client, rid, parent_artifacts=RUN_ARTIFACTS)
    again = sync_cli(project, "--json")
    assert again.code == 0 and again.json()["ops_sent"] == 0 and again.json()["metrics_sent"] == 0, again


@pytest.mark.slow
def test_sync_to_sends_the_records_to_another_server(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    mlflow_server.stop()
    project = tmp_path / "p"
    rids = offline_runs(project, mlflow_server.uri, 2)
    other = MlflowServer(tmp_path / "other")
    other.start()
    try:
        moved = sync_cli(project, "--to", other.uri, "--json")
        assert moved.code == 0, moved
        assert [(r["run_id"], r["state"], r["target"]) for r in moved.json()["runs"]] == \
            [(rid, "synced", other.uri) for rid in rids]
        client = client_for(other.uri)
        for rid in rids:
            runs = assert_run_complete(client, rid, parent_artifacts=RUN_ARTIFACTS)
            assert runs["full"].data.tags["mcx.steps"] == str(STEPS["full"])
        # The runs now record to the other server: a plain sync finds nothing pending, the first stays down.
        plain = sync_cli(project, "--json")
        assert plain.code == 0 and plain.json()["ops_sent"] == 0, plain
    finally:
        other.stop()


def test_sync_to_a_uri_with_credentials_or_without_a_scheme_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    project = tmp_path / "p"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    offline_runs(project, f"http://127.0.0.1:{port}", 1)
    journal = sorted(p.read_bytes() for p in (project / ".mcx").rglob("*.json*"))
    res = sync_cli(project, "--to", "http://me:secret@127.0.0.1:1")
    assert res.code == 2 and "--to holds credentials" in res.err and "secret" not in res.err, res
    bare = sync_cli(project, "--to", "mlflow-b")
    assert bare.code == 2 and "--to 'mlflow-b' is not a tracking URI" in bare.err, bare
    assert sorted(p.read_bytes() for p in (project / ".mcx").rglob("*.json*")) == journal
    assert not (project / "mlflow-b").exists()


# --- shared files under .mcx/ between concurrent runs -------------------------------------------------------

KEEPER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mcx.track.dvc_store import keep_version
    project, md5, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.005)
    for _ in range(3):
        keep_version(project, project / "data", md5=md5)
""")


def test_concurrent_runs_keep_the_same_dataset_version_without_taking_each_others_pointer(tmp_path: Path) -> None:
    """`mcx run` keeps its dataset's version in DVC through a pointer under .mcx/restore/; runs of one
    project at the same time each keep theirs (issue 35: the shared pointer vanished under one of them)."""
    from dvc.repo import Repo

    project = make_git_dvc_project(tmp_path / "p")
    (project / "data").mkdir()
    for i in range(20):
        (project / "data" / f"part-{i}.bin").write_bytes(os.urandom(4096))
    with Repo(str(project)) as repo:
        md5 = repo.add(str(project / "data"))[0].outs[0].hash_info.value
    ensure_remote(project)  # .dvc/config.local (DVC's own file, outside .mcx/) set once, as the first run does
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", KEEPER, str(project), md5, str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0, err[-3000:]
    assert list((project / ".mcx" / "restore").iterdir()) == []  # each removed its own, and only its own
    assert any((project / ".mcx" / "dvc-remote").rglob("*.dir"))  # the version reached the remote
