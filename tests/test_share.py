"""A run shared with another clone, as a team shares it (D38): nothing replaced.

One CPU run of the quickstart in a first clone whose team configured a shared local-directory DVC
remote the DVC way (`dvc remote add -d team DIR`, committed). The clone commits what `mcx run` says
to commit and pushes to a bare origin; a second clone fetches the full stage's checkpoint with plain
`dvc pull <pointer>`, then the rest with `mcx pull RUN_ID`, and gets the same bytes; bad input of
`mcx pull` in a third clone exits 2 and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_e2e_project, mcx_inprocess, mcx_subprocess
from test_e2e import FAST, SPEC

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=mcx-test", "-c", "user.email=mcx-test@example.invalid", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})


def hashes(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def workspace(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory of a clone but git's own and DVC's scratch (.dvc/tmp)."""
    skip = (".git", ".dvc/tmp")
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if not any(p.relative_to(root).as_posix().startswith(s) for s in skip)}


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("share")
    shared = root / "team-dvc-remote"
    shared.mkdir()
    first = make_e2e_project(root / "first")
    assert dvc(first, "remote", "add", "-d", "team", str(shared)).returncode == 0
    git(first, "commit", "-qam", "the team's DVC remote")
    origin = root / "origin.git"
    git(root, "init", "-q", "--bare", "-b", "main", str(origin))
    git(first, "remote", "add", "origin", str(origin))
    git(first, "push", "-q", "origin", "main")
    return SimpleNamespace(root=root, shared=shared, origin=origin, first=first)


@pytest.fixture(scope="module")
def run(team: SimpleNamespace):
    """The quickstart in the first clone, through the real command line."""
    res = mcx_subprocess(team.first, "run", SPEC, *FAST, "--json")
    assert res.code == 0, res
    return res


@pytest.fixture(scope="module")
def rid(run) -> str:
    return run.json()["run_id"]


@pytest.fixture(scope="module")
def shared(team: SimpleNamespace, run, rid: str) -> SimpleNamespace:
    """What the run said to commit, committed and pushed."""
    git(team.first, "add", f".mcx/checkpoints/{rid}")
    git(team.first, "commit", "-qm", f"mcx run {rid}")
    git(team.first, "push", "-q", "origin", "main")
    return team


def clone(team: SimpleNamespace, name: str) -> Path:
    dest = team.root / name
    git(team.root, "clone", "-q", str(team.origin), str(dest))
    return dest


def ckpt(project: Path, rid: str, stage: str) -> Path:
    latest = (project / ".mcx" / "runs" / rid / stage / "checkpoints" / "latest").read_text().strip()
    return project / ".mcx" / "runs" / rid / stage / "checkpoints" / latest


def test_the_run_pushes_to_the_team_remote_and_says_what_to_commit(team, run, rid):
    for stage in ("smoke", "full"):
        assert (f"{stage} stage: checkpoint .mcx/runs/{rid}/{stage}/checkpoints/iter_" in run.err
                and "is in DVC (pushed to remote 'team')" in run.err), run.err[-3000:]
    assert f"git add .mcx/checkpoints/{rid} && git commit" in run.err
    assert f"`dvc pull .mcx/checkpoints/{rid}/full.dvc` or `mcx pull {rid}`" in run.err
    assert "configured on this machine only" not in run.err  # the team's remote is in .dvc/config
    untracked = git(team.first, "status", "--porcelain", "-uall").splitlines()
    assert untracked == [f"?? .mcx/checkpoints/{rid}/full.dvc", f"?? .mcx/checkpoints/{rid}/smoke.dvc"]
    assert not (team.first / ".mcx" / "dvc-remote").exists()  # the embedded remote is not used
    for stage in ("smoke", "full"):  # no .dvc file beside the checkpoints, where git cannot carry it
        assert not list((team.first / ".mcx" / "runs" / rid / stage / "checkpoints").glob("*.dvc"))
    # The pointers are outside the code identity: the same spec is the same run, found finished.
    again = mcx_inprocess(team.first, "run", SPEC, *FAST, "--json")
    assert again.code == 0 and again.json()["run_id"] == rid and again.json()["cached"] is True, again


def test_a_second_clone_pulls_the_checkpoint_with_plain_dvc_then_the_rest_with_mcx_pull(shared, rid):
    first, second = shared.first, clone(shared, "second")
    assert not (second / ".mcx" / "runs").exists() and not (second / "data").exists()
    res = dvc(second, "pull", f".mcx/checkpoints/{rid}/full.dvc")
    assert res.returncode == 0, res.stderr
    full = ckpt(first, rid, "full")
    assert full.name == "iter_0000012"
    assert hashes(second / full.relative_to(first)) == hashes(full) and "meta.json" in hashes(full)
    assert not (second / ".mcx" / "runs" / rid / "smoke").exists() and not (second / "data").exists()

    res = mcx_subprocess(second, "pull", rid)
    assert res.code == 0, res
    smoke = ckpt(first, rid, "smoke")
    where = f"from remote 'team' ({shared.shared})"
    assert f"already here: {full.relative_to(first).as_posix()} (full stage checkpoint" in res.out
    assert f"fetched {smoke.relative_to(first).as_posix()} (smoke stage checkpoint" in res.out and where in res.out
    assert "fetched data.path = data/quickstart: version " in res.out
    assert hashes(second / smoke.relative_to(first)) == hashes(smoke)
    assert hashes(second / "data") == hashes(first / "data")
    assert git(second, "status", "--porcelain") == ""
    again = mcx_subprocess(second, "pull", rid, "--json")
    assert again.code == 0, again
    got = again.json()
    assert not any(c["fetched"] for c in got["checkpoints"]) and not any(d["fetched"] for d in got["data"])
    assert [c["stage"] for c in got["checkpoints"]] == ["smoke", "full"]


def test_a_clone_without_the_data_pulls_it_checks_it_and_trains_on_it(shared, rid):
    """`mcx run` where data/quickstart is absent pulls data.dvc's output from the team remote (not the quickstart
    rebuilt), checks it by content, and trains on the same data; its record says the data was checked."""
    fourth = clone(shared, "fourth")
    res = mcx_subprocess(fourth, "run", SPEC, *FAST, "--stage", "smoke", "--json")
    assert res.code == 0, res
    said = " ".join(res.err.split())
    assert "data: pulled data.dvc's output from DVC remote 'team' for data.path = 'data/quickstart'; its files match " \
           "the record" in said and "rebuilt" not in said, said[-2000:]
    fingerprint = json.loads((fourth / ".mcx" / "runs" / res.json()["run_id"] / "fingerprint.json").read_text())
    assert fingerprint["data"]["info"]["dataset"]["verified"] == "content matches the DVC record", fingerprint["data"]
    assert not [w for w in fingerprint["warnings"] if "not in the workspace" in w], fingerprint["warnings"]
    first = json.loads((shared.first / ".mcx" / "runs" / rid / "fingerprint.json").read_text())
    assert fingerprint["data"]["id"] == first["data"]["id"]  # the same data (the commit differs: the pointers')
    # its largest token id, taken once pulled (planning could not) and checked against the vocabulary (D51)
    top = fingerprint["data"]["info"]["dataset"]["max_token_id"]
    assert top == first["data"]["info"]["dataset"]["max_token_id"] < 4096
    assert hashes(fourth / "data") == hashes(shared.first / "data")


def test_a_damaged_object_on_the_team_remote_stops_mcx_run_and_mcx_pull(shared, rid):
    """DVC would pull it without a word; mcx names the file, keeps it out of the workspace and the cache, and exits
    2 (`mcx run` before training or recording anything)."""
    idx = shared.first / "data" / "quickstart" / "corpus.idx"
    md5 = hashlib.md5(idx.read_bytes()).hexdigest()
    obj = shared.shared / "files" / "md5" / md5[:2] / md5[2:]
    good = obj.read_bytes()
    os.chmod(obj, 0o644)
    obj.write_bytes(good[:-1] + bytes([good[-1] ^ 0x01]))
    try:
        for verb, args, again in (("run", [SPEC, *FAST], "`dvc pull data.dvc`"), ("pull", [rid], f"`mcx pull {rid}`")):
            where = clone(shared, f"damaged-{verb}")
            res = mcx_subprocess(where, verb, *args)
            assert res.code == 2, res
            assert res.err.startswith("mcx: error: ") and "Traceback" not in res.err, res.err
            said = " ".join(res.err.split())
            assert "1 file pulled from DVC remote" in said and "data/quickstart/corpus.idx" in said, said
            assert f"then {again} here" in said, said
            assert not (where / "data" / "quickstart" / "corpus.idx").exists()
            assert not list((where / ".dvc" / "cache").rglob(md5[2:]))
            if verb == "run":  # nothing trained or recorded (`mcx pull` has brought the intact checkpoints)
                assert not (where / ".mcx" / "runs").exists() or not any((where / ".mcx" / "runs").iterdir())
    finally:
        obj.write_bytes(good)


@pytest.mark.parametrize("args, shown", [
    (["0123456789ab"], "unknown run ID 0123456789ab: no .mcx/checkpoints/0123456789ab/ in this checkout"),
    (["../../etc"], "'../../etc' is not a run ID"),
    (["RID", "--remote", "NOWHERE"], "is not reachable from here (no such directory)"),
], ids=["unknown", "malformed", "unreachable-remote"])
def test_bad_pull_input_exits_2_and_writes_nothing(shared, rid, args, shown):
    third = shared.root / "third"
    if not third.exists():
        clone(shared, "third")
    nowhere = str(shared.root / "nowhere")
    args = [rid if a == "RID" else nowhere if a == "NOWHERE" else a for a in args]
    before = workspace(third)
    res = mcx_subprocess(third, "pull", *args)
    assert res.code == 2, res
    assert res.err.startswith("mcx: error: ") and res.err.count("\n") == 1 and "Traceback" not in res.err
    assert shown in res.err and res.out == ""
    assert workspace(third) == before
