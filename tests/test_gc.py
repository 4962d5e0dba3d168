"""`mcx gc` against real files, real git worktrees, real DVC (add, push, restore) and real lock holders.

Most tests build run directories by hand the way the control plane and the worker leave them (the
recorder's real journal, checkpoints pushed to the embedded DVC remote by mcx.track.dvc_store); the
last one trains a tiny run for real, collects, restores the final checkpoints by hash and reproduces it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import _git, make_e2e_project, mcx_inprocess
from test_track import make_run_dir, write_result

from mcx.ops.gc import gc
from mcx.track import RunRecorder, paths, restore, track_checkpoint

RID, FAILED, BUSY, UNSENT, SHORT = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd", "eeeeeeeeeeee"


# -- run directories as mcx run leaves them ------------------------------------------------------------

def checkpoint(ckpt: Path, step: int, size: int = 50_000) -> Path:
    """A complete checkpoint (what mcx.train.checkpoint commits): random weights and meta.json."""
    d = ckpt / f"iter_{step:07d}"
    d.mkdir(parents=True)
    (d / "state.pt").write_bytes(os.urandom(size))
    (d / "meta.json").write_text(json.dumps({"format": 1, "step": step}))
    return d


def stage(rdir: Path, name: str, steps: list[int], *, status: str, latest: int | None = None) -> Path:
    sdir = rdir / name
    ckpt = sdir / "checkpoints"
    for s in steps:
        checkpoint(ckpt, s)
    if latest is not None:
        (ckpt / "latest").write_text(f"iter_{latest:07d}\n")
    (sdir / "cache").mkdir()
    (sdir / "cache" / "train-sample_index.npy").write_bytes(os.urandom(3000))
    (sdir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 9.0}\n')
    if status != "interrupted":
        write_result(sdir, steps[-1] if steps else 0, status=status)
    return ckpt


def record(project: Path, rdir: Path, finals: dict[str, Path], status: str, *, send: bool = True) -> None:
    """The recorder's journal, as `mcx run` writes it; each final checkpoint added to DVC and pushed."""
    rec = RunRecorder.for_run(project, rdir)
    rec.start(launcher="local")
    for name in ("smoke", "full"):
        if (rdir / name).is_dir():
            rec.start_stage(name)
            ck = track_checkpoint(project, finals[name]).to_dict() if name in finals else None
            rec.finish_stage(name, checkpoint=ck)
    (rdir / "run.json").write_text(json.dumps({"status": status, "attempt": 1}))
    rec.finish(status)
    if send:
        assert rec.close().state == "synced"


def finished_run(project: Path, run_id: str = RID) -> Path:
    rdir = make_run_dir(project, run_id)
    smoke = stage(rdir, "smoke", [8, 10], status="finished", latest=10)
    full = stage(rdir, "full", [6, 12], status="finished", latest=12)
    (full / "iter_0000018.tmp").mkdir()  # a save that a crash interrupted
    (full / "iter_0000018.tmp" / "part").write_bytes(os.urandom(700))
    record(project, rdir, {"smoke": smoke / "iter_0000010", "full": full / "iter_0000012"}, "finished")
    return rdir


LOCKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mcx.track.runcache import acquire
    lock = acquire(Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(600)
""")


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process holding ``directory``'s run lock (as `mcx run`, `mcx reproduce`, `mcx tune` do)."""
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under ``roots`` with its content hash (lock files are rewritten by their holders)."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p)] = "dir"
    return out


def file_bytes(path: Path) -> int:
    """Bytes of the regular files at or under ``path``, counted without mcx.ops.gc."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def items(result, which: str = "removed") -> dict[str, tuple[str, int, str]]:
    return {str(i.path): (i.kind, i.size, i.why) for i in getattr(result, which)}


def worktree(project: Path, home: Path) -> Path:
    """A worktree where `mcx reproduce` makes one (<tmp>/mcx-repro-<id>-XXXX/code)."""
    home.mkdir(parents=True)
    subprocess.run(["git", "-C", str(project), "worktree", "add", "-q", "--detach", str(home / "code"), "HEAD"],
                   check=True, capture_output=True)
    (home / "code" / "restored.bin").write_bytes(os.urandom(4000))  # data restored into it by hash
    return home / "code"


def admin_of(project: Path, path: Path) -> Path:
    """Git's registration directory of the worktree at ``path``."""
    for admin in (project / ".git" / "worktrees").iterdir():
        if (admin / "gitdir").read_text().strip() == str(path / ".git"):
            return admin
    raise AssertionError(f"{path} is not registered")


def registered(project: Path) -> str:
    return subprocess.run(["git", "-C", str(project), "worktree", "list", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout


# -- the rules -----------------------------------------------------------------------------------------

def test_gc_removes_what_is_never_read_again_and_dry_run_lists_exactly_that(git_dvc_project: Path, tmp_path: Path):
    project = git_dvc_project
    state = project / ".mcx"
    rdir = finished_run(project)
    smoke_final = rdir / "smoke" / "checkpoints" / "iter_0000010"
    full_final = rdir / "full" / "checkpoints" / "iter_0000012"
    finals = {p: snapshot(p) for p in (smoke_final, full_final)}

    failed = make_run_dir(project, FAILED)
    stage(failed, "smoke", [8, 10], status="finished", latest=10)
    fckpt = stage(failed, "full", [4, 8], status="failed", latest=8)
    (fckpt / "iter_0000010.retired").mkdir()
    record(project, failed, {"smoke": failed / "smoke" / "checkpoints" / "iter_0000010"}, "failed")

    busy = make_run_dir(project, BUSY)  # training now: another process holds its lock
    stage(busy, "smoke", [8, 10], status="finished", latest=10)
    stage(busy, "full", [6], status="interrupted", latest=6)
    unsent = make_run_dir(project, UNSENT)  # its records never reached the tracking store
    stage(unsent, "full", [6, 12], status="finished", latest=12)
    record(project, unsent, {}, "finished", send=False)

    archived = state / "archive" / f"{RID}-20261201T101010"  # an attempt `mcx run --force` replaced
    archived.mkdir(parents=True)
    checkpoint(archived / "full" / "checkpoints", 12)
    (archived / "run.json").write_text(json.dumps({"status": "finished", "attempt": 1}))
    tune_left = state / "mcx-tune-k1ll3d"
    checkpoint(tune_left / "mbs4" / "checkpoints", 2)
    tune_busy = state / "mcx-tune-running"
    (tune_busy / "mbs2").mkdir(parents=True)
    (state / "notes.txt").write_text("the user's own file\n")

    stale = worktree(project, tmp_path / "tmp" / f"mcx-repro-{RID}-k1ll3d")  # its reproduce was killed
    in_use = worktree(project, tmp_path / "tmp" / f"mcx-repro-{RID}-running")
    gone = worktree(project, tmp_path / "tmp" / f"mcx-repro-{RID}-deleted")
    gone_admin = admin_of(project, gone)
    subprocess.run(["rm", "-rf", str(gone.parent)], check=True)
    mine = tmp_path / "mine"  # the user's own worktree, its directory gone: not mcx's to prune
    subprocess.run(["git", "-C", str(project), "worktree", "add", "-q", "--detach", str(mine), "HEAD"], check=True)
    subprocess.run(["rm", "-rf", str(mine)], check=True)

    holders = [hold_lock(busy), hold_lock(tune_busy), hold_lock(in_use.parent)]
    try:
        watched = (state, project / ".git" / "worktrees", tmp_path / "tmp")
        before = snapshot(*watched)
        dry = gc(project, dry_run=True)
        assert snapshot(*watched) == before  # --dry-run removes nothing, writes nothing
        expected = {p: file_bytes(Path(p)) for p in items(dry)}
        expected[str(stale.parent)] += file_bytes(admin_of(project, stale))  # its registration goes with it
        expected_state = file_bytes(state)
        real = gc(project)
        assert items(real) == items(dry) and items(real, "kept") == items(dry, "kept")
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()

    removed, kept = items(real), items(real, "kept")
    ck = lambda r, s, step: str(r / s / "checkpoints" / f"iter_{step:07d}")  # noqa: E731
    assert {p: k for p, (k, _, _) in removed.items()} == {
        ck(rdir, "smoke", 8): "intermediate checkpoint", ck(rdir, "smoke", 10): "final checkpoint",
        str(rdir / "smoke" / "cache"): "dataset cache",
        ck(rdir, "full", 6): "intermediate checkpoint", ck(rdir, "full", 12): "final checkpoint",
        str(rdir / "full" / "checkpoints" / "iter_0000018.tmp"): "partial checkpoint",
        str(rdir / "full" / "cache"): "dataset cache",
        ck(failed, "smoke", 8): "intermediate checkpoint", ck(failed, "smoke", 10): "final checkpoint",
        str(failed / "smoke" / "cache"): "dataset cache",
        ck(failed, "full", 4): "superseded checkpoint",
        str(failed / "full" / "checkpoints" / "iter_0000010.retired"): "partial checkpoint",
        str(archived): "archived attempt", str(tune_left): "tune leftover",
        str(stale.parent): "reproduction worktree",
        str(gone_admin): "worktree registration",
    }
    assert "holds it as" in removed[ck(rdir, "full", 12)][2]
    assert kept[ck(failed, "full", 8)][0] == "latest checkpoint"  # a failed stage resumes from it
    assert kept[str(failed / "full" / "cache")][0] == "dataset cache"
    assert kept[str(busy)][0] == "training run" and str(holders[0].pid) in kept[str(busy)][2]
    assert kept[str(unsent)][0] == "unsent records" and "mcx sync" in kept[str(unsent)][2]
    assert kept[str(tune_busy)][0] == "tune leftover" and kept[str(in_use.parent)][0] == "reproduction worktree"
    assert kept[str(state / "notes.txt")][0] == "unknown"
    assert {kept[str(state / n)][0] for n in ("mlflow.db", "mlartifacts", "dvc-remote")} == {
        "tracking store", "tracking artifacts", "DVC remote"}

    # Exact bytes: each removal's files, the total freed, and .mcx/ before and after, counted independently.
    assert {p: size for p, (_, size, _) in removed.items()} == expected
    assert real.freed_bytes == sum(expected.values())
    assert real.state_bytes_before == expected_state
    assert real.state_bytes_after == file_bytes(state) == expected_state - sum(
        v for p, v in expected.items() if p.startswith(str(state)))
    assert sum(i.size for i in (*real.removed, *real.kept) if str(i.path).startswith(str(state))) == expected_state

    for path in removed:
        assert not Path(path).exists(), path
    assert {p for p in kept if not Path(p).exists()} == set()
    assert (busy / "full" / "checkpoints" / "iter_0000006").is_dir() and (busy / "smoke" / "cache").is_dir()
    assert (unsent / "full" / "checkpoints" / "iter_0000006").is_dir()
    listing = registered(project)
    assert str(stale) not in listing and str(gone) not in listing and str(in_use) in listing
    assert str(mine) in listing  # the user's prunable registration is left to them
    assert (rdir / "full" / "checkpoints" / "latest").read_text() == "iter_0000012\n"

    # The final checkpoints come back by hash, byte for byte, from the .dvc file gc left beside them.
    for final, files in finals.items():
        got = restore(project, dvc_file=final.parent / f"{final.name}.dvc")
        assert got == final and snapshot(final) == files
    again = gc(project, dry_run=True)  # in the collected run, a second gc finds only what was brought back
    assert {str(i.path): i.kind for i in again.removed if rdir in i.path.parents} == {
        str(p): "final checkpoint" for p in finals}


def test_a_final_checkpoint_stays_unless_the_remote_holds_every_object(git_dvc_project: Path):
    project = git_dvc_project
    rdir = finished_run(project)
    full_final = rdir / "full" / "checkpoints" / "iter_0000012"
    assert "final checkpoint" not in {k for k, _, _ in items(gc(project, dry_run=True, keep_final=True)).values()}
    kept = items(gc(project, dry_run=True, keep_final=True), "kept")
    assert kept[str(full_final)] == ("final checkpoint", file_bytes(full_final), "kept by --keep-final")

    weights = hashlib.md5((full_final / "state.pt").read_bytes()).hexdigest()
    obj = project / ".mcx" / "dvc-remote" / "files" / "md5" / weights[:2] / weights[2:]
    obj.rename(obj.with_name("elsewhere"))  # the remote lost the weights; its .dir manifest is still there
    result = gc(project)
    kept, removed = items(result, "kept"), items(result)
    assert kept[str(full_final)][0] == "final checkpoint"
    assert "lacks 1 of the 3 objects" in kept[str(full_final)][2]
    assert full_final.is_dir() and str(rdir / "full" / "checkpoints" / "iter_0000006") in removed

    nolog = make_run_dir(project, SHORT, stages=("full",))  # tracking.log_checkpoints = false: nothing in DVC
    stage(nolog, "full", [6, 12], status="finished", latest=12)
    record(project, nolog, {}, "finished")
    kept = items(gc(project), "kept")
    assert "the only copy" in kept[str(nolog / "full" / "checkpoints" / "iter_0000012")][2]


def test_a_stage_without_a_result_or_a_valid_latest_keeps_its_checkpoints(git_dvc_project: Path):
    project = git_dvc_project
    rdir = make_run_dir(project, RID, stages=("full",))
    ckpt = stage(rdir, "full", [4, 8], status="interrupted", latest=8)  # no result.json
    (ckpt / "iter_0000012.tmp").mkdir()  # a worker whose `mcx run` was killed may be saving it right now
    record(project, rdir, {}, "interrupted")
    result = gc(project)
    assert result.removed == ()
    kept = items(result, "kept")
    assert {n: kept[str(ckpt / n)][0] for n in ("iter_0000004", "iter_0000008", "iter_0000012.tmp")} == {
        "iter_0000004": "checkpoint", "iter_0000008": "latest checkpoint", "iter_0000012.tmp": "checkpoint"}
    assert "no result.json" in kept[str(ckpt / "iter_0000004")][2]
    (ckpt / "latest").unlink()
    write_result(rdir / "full", 8, status="failed")  # ended, but no valid `latest` to resume from
    result = gc(project)
    assert [i.kind for i in result.removed] == ["partial checkpoint"]
    assert "no valid `latest`" in items(result, "kept")[str(ckpt / "iter_0000004")][2]


def test_force_attempt_numbers_survive_gc_of_the_archive(git_dvc_project: Path):
    from mcx.ops.run import _archive

    project = git_dvc_project
    rdir = finished_run(project)
    (rdir / "run.json").write_text(json.dumps({"status": "finished", "attempt": 2}))
    _archive(project, rdir)
    assert json.loads((rdir / "run.json").read_text()) == {"attempt": 3}
    gc(project)
    assert not any((project / ".mcx" / "archive").iterdir())
    # mcx run's _write_run_files keeps a recorded attempt number (setdefault), so the next MLflow
    # parent run is attempt 3 and not a second "attempt 1" the emptied archive would count.
    assert json.loads((rdir / "run.json").read_text())["attempt"] == 3


def test_freed_bytes_count_a_hard_linked_file_once_its_last_link_goes(tmp_path: Path):
    from mcx.ops.usage import freed_bytes, inodes

    (tmp_path / "run").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "run" / "weights").write_bytes(os.urandom(1000))
    os.link(tmp_path / "run" / "weights", tmp_path / "cache" / "weights")  # as a DVC cache of type hardlink
    os.link(tmp_path / "run" / "weights", tmp_path / "run" / "weights.again")
    (tmp_path / "run" / "own").write_bytes(os.urandom(10))
    run, cache = inodes(tmp_path / "run"), inodes(tmp_path / "cache")
    assert sorted(size for size, _, _ in run.values()) == [10, 1000]  # each inode once
    assert freed_bytes([run]) == 10  # the cache still links the weights
    assert freed_bytes([run, cache]) == 1010


# -- the command line -----------------------------------------------------------------------------------

def test_cli_table_json_and_bad_arguments(git_dvc_project: Path):
    project = git_dvc_project
    rdir = finished_run(project)
    text = mcx_inprocess(project, "gc", "--dry-run")
    assert text.code == 0, text
    assert "would remove 7 items" in text.out and "intermediate checkpoint" in text.out and "kept" in text.out
    assert "would free" in text.out and "gc: 1 run directory" in text.err
    assert (rdir / "full" / "checkpoints" / "iter_0000006").is_dir()
    out = mcx_inprocess(project, "gc", "--json")
    assert out.code == 0, out
    assert len(out.out.strip().splitlines()) == 1
    doc = json.loads(out.out)
    assert doc["dry_run"] is False and doc["freed_bytes"] == sum(i["size"] for i in doc["removed"])
    assert {i["kind"] for i in doc["removed"]} >= {"intermediate checkpoint", "final checkpoint", "dataset cache"}
    assert "removing" in out.err and not (rdir / "full" / "checkpoints" / "iter_0000006").exists()
    for bad in (["gc", "--bogus"], ["gc", "--dry-run=yes"]):
        res = mcx_inprocess(project, *bad)
        assert res.code == 2 and res.out == ""
        assert res.err.startswith("mcx: error: ") and len(res.err.strip().splitlines()) == 1


# -- a real tiny run -------------------------------------------------------------------------------------

FAST = ["--set", "train.train_iters=12", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=6",
        "--set", "checkpoint.interval=6", "--set", "smoke.train_iters=10", "--set", "smoke.loss_window=3",
        "--set", "smoke.resume_check_iters=2"]


@pytest.mark.slow
@pytest.mark.usefixtures("e2e_clean_env")
def test_gc_after_a_real_tiny_run_then_restore_and_reproduce(tmp_path: Path):
    project = make_e2e_project(tmp_path / "project")
    run = mcx_inprocess(project, "run", "experiments/tiny.toml", *FAST, "--json", "--quiet")
    assert run.code == 0, run
    run_id = run.json()["run_id"]
    rdir = project / ".mcx" / "runs" / run_id
    finals = {s: rdir / s / "checkpoints" / (rdir / s / "checkpoints" / "latest").read_text().strip()
              for s in ("smoke", "full")}
    final_files = {s: snapshot(p) for s, p in finals.items()}
    before = file_bytes(project / ".mcx")

    dry = mcx_inprocess(project, "gc", "--dry-run", "--json")
    assert dry.code == 0, dry
    assert file_bytes(project / ".mcx") == before
    real = mcx_inprocess(project, "gc", "--json")
    assert real.code == 0, real
    d, r = dry.json(), real.json()
    assert d["removed"] == r["removed"] and d["freed_bytes"] == r["freed_bytes"] and d["dry_run"] is True
    kinds = sorted(i["kind"] for i in r["removed"])
    assert kinds == ["dataset cache", "dataset cache", "final checkpoint", "final checkpoint",
                     "intermediate checkpoint", "intermediate checkpoint"], r["removed"]
    assert r["state_bytes_before"] == before and r["state_bytes_after"] == file_bytes(project / ".mcx")
    assert before - file_bytes(project / ".mcx") == r["freed_bytes"] > 0
    kept = {i["kind"] for i in r["kept"]}
    assert {"DVC remote", "tracking store", "tracking artifacts", "run record", "checkpoint pointers"} <= kept <= {"DVC remote", "tracking store", "tracking artifacts", "run record",
                                            "restore pointers", "checkpoint pointers", "data file hashes"}

    # Nothing mcx reads was lost: the run is still found finished, and its finals come back by hash.
    again = mcx_inprocess(project, "run", "experiments/tiny.toml", *FAST, "--json", "--quiet")
    assert again.code == 0 and again.json()["cached"] is True, again
    for s, final in finals.items():  # by the run's committed pointer, as `dvc pull` of it or `mcx pull` does (D38)
        assert not final.exists()
        restore(project, dvc_file=paths.pointer_file(project, run_id, s))
        assert snapshot(final) == final_files[s]

    rep = mcx_inprocess(project, "reproduce", run_id, "--json")
    assert rep.code == 0 and rep.json()["verdict"] == "bitwise", rep
    assert "mcx-repro-" not in registered(project)
    after = gc(project)  # the reproduction is a run directory like any other
    reps = {str(i.path.relative_to(rdir)) for i in after.removed if i.kind == "intermediate checkpoint"}
    assert reps == {f"reproductions/r1/{s}/checkpoints/{n}" for s, n in (("smoke", "iter_0000008"),
                                                                          ("full", "iter_0000006"))}


def test_locate_replays_are_caches_that_go_once_they_ended(git_dvc_project: Path):
    """A run's and a reproduction's `mcx locate` replays (D74): each that ended goes, its link to the run's
    checkpoint with it (the checkpoint itself is judged as a checkpoint); one still replaying stays."""
    project = git_dvc_project
    rdir = finished_run(project)

    def replay(where: Path, name: str, ended: bool) -> Path:
        out = where / "replays" / name
        (out / "trace").mkdir(parents=True)
        (out / "trace" / "rank0.jsonl").write_text('{"phase": "batch"}\n' * 50)
        (out / "trace" / "tensors.rank0.pt").write_bytes(os.urandom(5000))
        (out / "checkpoints").mkdir()
        os.symlink(rdir / "full" / "checkpoints" / "iter_0000006", out / "checkpoints" / "iter_0000006")
        if ended:
            write_result(out, 12)
        return out

    done, running = replay(rdir, "step12", True), replay(rdir, "step12.layers", False)
    rep = replay(rdir / "reproductions" / "r1", "step12.noise", True)
    sizes = {str(p): ("locate replay", file_bytes(p)) for p in (done, rep)}  # the trace only: a link is no file
    dry = gc(project, dry_run=True)
    assert done.is_dir() and rep.is_dir()
    removed, kept = items(gc(project)), items(dry, "kept")
    assert items(dry) == removed
    assert {p: (k, size) for p, (k, size, _) in removed.items() if "/replays/" in p} == sizes
    assert "the next locate of this step replays it" in removed[str(done)][2]
    assert kept[str(running)][0] == "locate replay" and "may be replaying it now" in kept[str(running)][2]
    assert not done.exists() and not rep.exists() and running.is_dir()
