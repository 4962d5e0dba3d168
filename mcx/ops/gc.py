"""`mcx gc`: remove what mcx will never read again, and say why everything else stays.

Everything under ``.mcx/`` is listed, removed or kept, with a reason (docs/decisions.md D35):

- run directories (``runs/<id>/``, their reproductions ``runs/<id>/reproductions/rN/`` alike), each
  under its run lock, so a run being trained is never touched and a run cannot start while its
  directory is cleaned; a run whose records the tracking store does not have yet is left whole.
  In a finished stage: the intermediate checkpoints, partial saves and the dataset index cache go; the
  final checkpoint goes only once its recorded DVC hash is verified, object by object, on the remote
  it was pushed to (``--keep-final`` keeps it). In a stage that ended unfinished: ``latest`` stays
  (it resumes the stage), older checkpoints and partial saves go. A stage without ``result.json`` is
  left as it is: a worker outlives a killed ``mcx run`` and may still be saving. A run's replays
  (``replays/<name>/``, D70/D74) are caches of `mcx locate`, which replays them again when asked: each one
  that ended (its ``result.json``) goes; one without it may be replaying now and stays. The records stay.
- archived attempts (``archive/<id>-<time>/``, left by ``mcx run --force``), unless their records
  never reached the tracking store;
- reproduction worktrees left by a killed ``mcx reproduce`` and registrations whose directory is gone
  (mcx.ops.worktrees), and ``mcx-tune-*`` work directories of a killed ``mcx tune``;
- the embedded MLflow store, its artifacts, the embedded DVC remote and restore pointers stay.

Sizes are the bytes of regular files, each inode once; ``freed_bytes`` counts a file only when none
of its hard links stays. ``--dry-run`` makes the same decisions and removes nothing.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import asdict, frozen

from mcx.contract.checkpoints import PARTIAL, RETIRED, checkpoint_path, checkpoint_steps, read_latest
from mcx.contract.files import CACHE_DIR, CHECKPOINTS_DIR, JOB_FILE
from mcx.contract.result import read_stage_result
from mcx.contract.trace import REPLAYS_DIR
from mcx.fingerprint.filehashes import CACHE_FILE
from mcx.ops.tune import TUNE_PREFIX
from mcx.ops.usage import Inodes, freed_bytes, inodes, total
from mcx.ops.worktrees import remove, reproduction_worktrees
from mcx.track import paths
from mcx.track.dvc_check import RemoteCheck
from mcx.track.dvc_store import RESTORE_DIR
from mcx.track.errors import RunLocked
from mcx.track.journal import Journal
from mcx.track.runcache import acquire, holder_of
from mcx.track.sync import unsent

if TYPE_CHECKING:
    from mcx.track.dvc_check import RemoteCheck

Progress = Callable[[str], None]
ARCHIVE = "archive"
REPRODUCTIONS = "reproductions"
_ARCHIVED = re.compile(r"^([0-9a-f]{12})-")
KEPT_STORES = {  # top-level entries of .mcx/ that are records, never garbage
    paths.EMBEDDED_DB: ("tracking store", "the embedded MLflow store: every run's record"),
    paths.EMBEDDED_ARTIFACTS: ("tracking artifacts", "the embedded MLflow store's artifacts (records)"),
    paths.DVC_REMOTE_DIR: ("DVC remote", "the embedded DVC remote: the only copy, besides DVC's own cache, of the "
                           "checkpoints and dataset versions restored by hash"),
    RESTORE_DIR: ("restore pointers", "small .dvc pointers a restore writes; a running mcx run or reproduce may be "
                "reading one"),
    paths.POINTERS: ("checkpoint pointers", "each run's committed .dvc pointers to its checkpoints (git carries them to "
                     "other clones, D38)"),
    CACHE_FILE: ("data file hashes", "each data file's hash by inode, mtime and size (D37); rebuilt if removed, at the "
                 "cost of reading the data once"),
    paths.SWEEPS: ("sweeps", "each sweep's definition, Optuna study and records (docs/sweeps.md): what resumes it and "
               "what `mcx sweep show` reads"),
}


@frozen
class GcItem:
    path: Path
    kind: str
    size: int  # bytes
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


@frozen
class GcResult:
    dry_run: bool
    removed: tuple[GcItem, ...]
    kept: tuple[GcItem, ...]
    freed_bytes: int  # what the removals free on disk (would free, with --dry-run)
    state_bytes_before: int  # .mcx/ before
    state_bytes_after: int  # .mcx/ after (would be, with --dry-run)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "freed_bytes": self.freed_bytes, "state_bytes_before": self.state_bytes_before,
                "state_bytes_after": self.state_bytes_after, "removed": [i.to_dict() for i in self.removed],
                "kept": [i.to_dict() for i in self.kept]}


class _Tally:
    """The decisions so far, each with its files (for exact sizes and freed bytes)."""

    def __init__(self) -> None:
        self.removed: list[tuple[GcItem, Inodes]] = []
        self.kept: list[tuple[GcItem, Inodes]] = []

    def remove(self, path: Path, kind: str, why: str, files: Inodes | None = None) -> None:
        files = inodes(path) if files is None else files
        self.removed.append((GcItem(path, kind, total(files), why), files))

    def keep(self, path: Path, kind: str, why: str, files: Inodes | None = None) -> None:
        files = inodes(path) if files is None else files
        self.kept.append((GcItem(path, kind, total(files), why), files))


def gc(project: Path, *, dry_run: bool = False, keep_final: bool = False, progress: Progress | None = None) -> GcResult:
    """Remove (with ``dry_run``: list) what mcx no longer needs in ``project``; see the module docstring."""
    say = progress or (lambda _msg: None)
    state = paths.state_dir(project)
    before = inodes(state)
    tally = _Tally()
    with RemoteCheck(project) as remote:
        for entry in sorted(state.iterdir()) if state.is_dir() else []:
            if entry.name == paths.RUNS and entry.is_dir():
                _runs(project, entry, tally, remote, dry_run=dry_run, keep_final=keep_final, say=say)
            elif entry.name == ARCHIVE and entry.is_dir():
                _archive(project, entry, tally, dry_run=dry_run, say=say)
            elif entry.name.startswith(TUNE_PREFIX) and entry.is_dir():
                _tune_leftover(entry, tally, dry_run=dry_run, say=say)
            elif entry.name in KEPT_STORES or entry.name.startswith(paths.EMBEDDED_DB):
                tally.keep(entry, *KEPT_STORES.get(entry.name, KEPT_STORES[paths.EMBEDDED_DB]))
            else:
                tally.keep(entry, "unknown", "not something mcx makes (or not known to this version); left alone")
    _worktrees(project, tally, dry_run=dry_run, say=say)
    freed = freed_bytes(files for _, files in tally.removed)
    inside = {k: v for _, files in tally.removed for k, v in files.items() if k in before}
    return GcResult(dry_run=dry_run, removed=tuple(i for i, _ in tally.removed), kept=tuple(i for i, _ in tally.kept),
                    freed_bytes=freed, state_bytes_before=total(before),
                    state_bytes_after=total(before) - total(inside))


# -- run directories ------------------------------------------------------------------------------

def _runs(project: Path, runs: Path, tally: _Tally, remote: RemoteCheck, *, dry_run: bool, keep_final: bool,
          say: Progress) -> None:
    rdirs = sorted(p for p in runs.iterdir() if p.is_dir() and paths.RUN_ID_PATTERN.fullmatch(p.name))
    say(f"{len(rdirs)} run director{'y' if len(rdirs) == 1 else 'ies'} in {runs}")
    for other in sorted(set(runs.iterdir()) - set(rdirs)):
        tally.keep(other, "unknown", "not a run directory; left alone")
    seen: set[Path] = set()  # checkpoint directories already judged (a reproduction may share its run's)
    for run_path in rdirs:
        reps = run_path / REPRODUCTIONS
        for rep in sorted(reps.iterdir()) if reps.is_dir() else []:
            if rep.is_dir():
                _run(project, rep, tally, remote, seen, dry_run=dry_run, keep_final=keep_final, say=say)
            else:
                tally.keep(rep, "run record", "part of the run's record")
        _run(project, run_path, tally, remote, seen, dry_run=dry_run, keep_final=keep_final, say=say)


def _run(project: Path, run_path: Path, tally: _Tally, remote: RemoteCheck, seen: set[Path], *, dry_run: bool,
         keep_final: bool, say: Progress) -> None:
    own = inodes(run_path, skip=run_path / REPRODUCTIONS)  # sized before gc's own lock record is written
    with _held(run_path, dry_run=dry_run) as holder:
        if holder is not None:
            tally.keep(run_path, "training run", f"held by the run lock ({holder.describe()}): never touched while it "
                       "trains", own)
            return
        ops, pending = unsent(project, run_path)
        if ops or pending:
            tally.keep(run_path, "unsent records", f"{ops} tracking operations and {pending} bytes of metrics are not in "
                       "the tracking store yet; run `mcx sync`, then gc", own)
            return
        start = len(tally.removed), len(tally.kept)
        recorded = _recorded_checkpoints(run_path)
        for stage in paths.STAGES:
            if (run_path / stage).is_dir():
                _stage(project, run_path / stage, recorded.get(stage) or {}, tally, remote, seen, keep_final=keep_final)
        _replays(run_path / REPLAYS_DIR, tally)
        removed = tally.removed[start[0]:]
        listed = {k for _, files in (*removed, *tally.kept[start[1]:]) for k in files}
        tally.keep(run_path, "run record", "spec, fingerprint, plan, results, metrics and the tracking spool: what mcx "
                   "show, compare, reproduce and sync read", {k: v for k, v in own.items() if k not in listed})
        if not dry_run:
            for item, _ in removed:
                say(f"removing {item.path}")
                _delete(item.path)


def _stage(project: Path, stage_path: Path, recorded: dict[str, str], tally: _Tally, remote: RemoteCheck,
           seen: set[Path], *, keep_final: bool) -> None:
    result = read_stage_result(stage_path)  # the worker writes result.json last: without it, it may still run
    done = result is not None and result.ok  # what run.py reuses
    ckpt = _checkpoint_dir(stage_path)
    cache = stage_path / CACHE_DIR
    if done and cache.is_dir():
        tally.remove(cache, "dataset cache", "Megatron-Core's dataset index cache of a finished stage; "
                     "rebuilt if the stage ever runs again")
    elif cache.is_dir():
        tally.keep(cache, "dataset cache", "the unfinished stage reads it when it resumes")
    if ckpt.resolve() in seen or not ckpt.is_dir():
        return
    seen.add(ckpt.resolve())
    partial = [p for p in sorted(ckpt.iterdir()) if p.name.endswith((PARTIAL, RETIRED))]
    latest = read_latest(ckpt)
    steps = [checkpoint_path(ckpt, s) for s in checkpoint_steps(ckpt)]
    final = ckpt / latest if latest else None
    if result is None:  # a worker outlives a killed `mcx run` (its own session) and may be saving right now
        for p in (*partial, *steps):
            tally.keep(p, "latest checkpoint" if p == final else "checkpoint", "the stage has no result.json: it "
                       "was interrupted, or its worker still runs without its `mcx run`; left as it is")
        return
    for p in partial:
        tally.remove(p, "partial checkpoint", "left by an interrupted save or pruning; the worker would delete it "
                     "at its next start")
    if not done and (final is None or final not in steps):
        for p in steps:
            tally.keep(p, "checkpoint", "the unfinished stage has no valid `latest`; left for you to look at")
        return
    for p in steps:
        if p == final:
            continue
        if done:
            tally.remove(p, "intermediate checkpoint", "the stage finished; mcx never reads a checkpoint but the "
                         "last one again")
        else:
            tally.remove(p, "superseded checkpoint", "older than `latest`, the only checkpoint a resume reads")
    if final is None or final not in steps:
        return
    if not done:
        tally.keep(final, "latest checkpoint", f"the stage {result.status}; `mcx run` resumes it from here")
        return
    why = "kept by --keep-final" if keep_final else _final_kept_why(project, final, recorded, remote)
    if why:
        tally.keep(final, "final checkpoint", why)
    else:
        tally.remove(final, "final checkpoint", f"the DVC remote {recorded['remote']!r} holds it as {recorded['md5']} "
                     "(every object checked); restore it by hash (README: mcx gc)")


def _replays(replays: Path, tally: _Tally) -> None:
    """A run's (or reproduction's) `mcx locate` replays: re-created on demand, so those that ended go."""
    for replay in sorted(replays.iterdir()) if replays.is_dir() else []:
        if not replay.is_dir() or replay.is_symlink():
            tally.keep(replay, "unknown", "not a replay directory; left alone")
        elif read_stage_result(replay) is None:
            tally.keep(replay, "locate replay", "no result.json: an `mcx locate` may be replaying it now")
        else:
            tally.remove(replay, "locate replay", "a cache of `mcx locate` (its trace and log); the next locate of "
                         "this step replays it again from the run's checkpoint")


def _checkpoint_dir(stage_path: Path) -> Path:
    """The stage's checkpoint directory: job.json's where it is the stage's own (``<stage>/checkpoints``)
    or ``checkpoint.dir``'s ``<dir>/<run id>/<stage>``; any other path is a run directory's old place
    (the project was copied or moved), which gc leaves alone."""
    own = stage_path / CHECKPOINTS_DIR
    recorded = (paths.read_json(stage_path / JOB_FILE) or {}).get("checkpoint_dir")
    if not recorded:
        return own
    path = Path(recorded)
    run_id = stage_path.parent.name if stage_path.parent.parent.name != REPRODUCTIONS else stage_path.parent.parent.parent.name
    if path.parts[-2:] == (run_id, stage_path.name) and path.resolve() != own.resolve():
        return path
    return own


def _final_kept_why(project: Path, final: Path, recorded: dict[str, str], remote: RemoteCheck) -> str | None:
    """Why a finished stage's final checkpoint must stay here; None when DVC can bring it back."""
    md5, where, name = recorded.get("md5"), recorded.get("path"), recorded.get("remote")
    if not md5:
        return ("not in DVC (tracking.log_checkpoints = false, adding it failed, or its `mcx run` ended first): "
                "this is the only copy")
    if not where or (project / where).resolve() != final.resolve():
        return f"DVC records {where or 'no path'} for this stage, not this directory"
    if not name or name == "null":
        return f"added to DVC as {md5} but never pushed to a remote"
    return remote.lacks(name, md5)


def _recorded_checkpoints(run_path: Path) -> dict[str, dict[str, str]]:
    """``{stage: {"md5", "path", "remote"}}`` as the run journaled them (tags ``mcx.checkpoint.<stage>.*``)."""
    out: dict[str, dict[str, str]] = {}
    for op in Journal(run_path / paths.TRACK_DIR).ops():
        if op.get("op") == "tags" and op.get("record") == "run":
            for key, value in (op.get("tags") or {}).items():
                m = re.fullmatch(r"mcx\.checkpoint\.(\w+)\.(md5|path|remote)", key)
                if m:
                    out.setdefault(m[1], {})[m[2]] = value
    return out


# -- archived attempts, worktrees, tune leftovers -------------------------------------------------

def _archive(project: Path, archive: Path, tally: _Tally, *, dry_run: bool, say: Progress) -> None:
    entries = sorted(archive.iterdir())
    say(f"{len(entries)} archived attempt{'' if len(entries) == 1 else 's'} in {archive}")
    for entry in entries:
        m = _ARCHIVED.match(entry.name)
        if not m or not entry.is_dir():
            tally.keep(entry, "unknown", "not an archived attempt; left alone")
            continue
        run_path = paths.runs_dir(project) / m[1]
        with _held(run_path, dry_run=dry_run, create=False) as holder:
            if holder is not None:
                tally.keep(entry, "archived attempt", f"its run is training ({holder.describe()}) and may be "
                           "archiving into it")
                continue
            ops, pending = unsent(project, entry)
            if ops or pending:
                tally.keep(entry, "archived attempt", f"{ops} tracking operations and {pending} bytes of metrics never "
                           "reached the tracking store, and `mcx sync` does not send archived attempts; delete it "
                           "yourself if they are not needed")
                continue
            tally.remove(entry, "archived attempt", "an attempt `mcx run --force` replaced; its MLflow record and "
                         "DVC-tracked checkpoints stay")
            if not dry_run:
                say(f"removing {entry}")
                _delete(entry)


def _worktrees(project: Path, tally: _Tally, *, dry_run: bool, say: Progress) -> None:
    for wt in reproduction_worktrees(project):
        files = {**inodes(wt.home), **inodes(wt.admin)}  # sized before gc's own lock record is written
        with _held(wt.home, dry_run=dry_run, create=False) as holder:
            if holder is not None:
                tally.keep(wt.home, "reproduction worktree", f"in use by mcx reproduce ({holder.describe()})", files)
                continue
            if wt.path.is_dir():
                tally.remove(wt.home, "reproduction worktree", "left by an `mcx reproduce` killed before its cleanup; "
                             "the reproduction's records are in its run directory", files)
            else:
                tally.remove(wt.admin, "worktree registration", f"registers {wt.path}, which is gone (what `git "
                             "worktree prune` drops)", files)
            if not dry_run:
                say(f"removing {tally.removed[-1][0].path}")
                remove(project, wt)


def _tune_leftover(path: Path, tally: _Tally, *, dry_run: bool, say: Progress) -> None:
    files = inodes(path)
    with _held(path, dry_run=dry_run) as holder:
        if holder is not None:
            tally.keep(path, "tune leftover", f"in use by a running `mcx tune` ({holder.describe()})", files)
            return
        tally.remove(path, "tune leftover", "the trials of an `mcx tune` that was killed; nothing reads them", files)
        if not dry_run:
            say(f"removing {path}")
            _delete(path)


# -- locks, deletion --------------------------------------------------------------------------

@contextmanager
def _held(directory: Path, *, dry_run: bool, create: bool = True) -> Iterator[Any]:
    """Yields the holder of ``directory``'s run lock (None: free). Unless ``dry_run``, a free lock is
    taken for the block, so that nothing starts there while gc works (``create=False``: only when the
    directory exists, a lock is never made for a run that is not there)."""
    if dry_run or (not create and not directory.is_dir()):
        yield holder_of(directory)
        return
    try:
        lock = acquire(directory)
    except RunLocked as exc:
        yield exc.holder or holder_of(directory)
        return
    with lock:
        yield None


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)  # gone meanwhile is fine
