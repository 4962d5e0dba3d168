"""DVC records: checkpoints added and pushed by hash, datasets and checkpoints restored by hash.

The project is a DVC repository (``dvc init`` beside ``git init``). mcx uses DVC's Python API
(``dvc.repo.Repo``: about 0.6 s to import, no subprocess per call) with absolute paths throughout.

Remote (``ensure_remote``): ``[tracking] dvc_remote`` names a remote configured in the project, or
gives a URL or path, which mcx configures as the remote ``mcx`` in ``.dvc/config.local`` (a local
path made absolute against the project root). Unset, it is the default remote DVC itself would use
here (a team's ``dvc remote add -d`` in the committed ``.dvc/config``: what a clone's ``dvc pull``
reads), else the embedded remote ``mcx-local`` = ``<project>/.mcx/dvc-remote``, machine-local in
``.dvc/config.local``. mcx makes its remote the default in ``.dvc/config.local`` only where no other
default exists, and drops that when the project gets one of its own. mcx never writes ``.dvc/config``:
a tracked file changed by a run would change the code identity, hence the ID, of the next run.

Checkpoints: a run's stage checkpoint is described by a pointer file git can carry,
``.mcx/checkpoints/<id>/<stage>.dvc`` (``track_checkpoint(dvc_file=...)``; docs/decisions.md D38,
``mcx.track.share``), opened with DVC's git view. Without a pointer (a reproduction's checkpoints) the
``.dvc`` file goes beside the checkpoint under the git-ignored ``.mcx/runs/``, which DVC refuses in its
git view, so those calls open the repository without it (``core.no_scm`` for that call only). Either
way the hash (``md5``, ``nfiles``, ``size``) goes into MLflow (``mcx.checkpoint.<stage>.md5``), from
where any clone that reaches the same remote restores it by hash.

Datasets: ``mcx run`` keeps the version it trains on in the cache and on the remote
(``keep_version``), and ``mcx reproduce`` brings a recorded version back into the reproduction's own
git worktree (``restore_into``), never over the user's workspace.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from attrs import asdict, frozen

from mcx.errors import DataError, EnvironmentProblem, InputError
from mcx.jsonfile import write_bytes_atomic
from mcx.track import paths
from mcx.track.redact import redact_text

if TYPE_CHECKING:
    from dvc.repo import Repo

EMBEDDED_REMOTE = "mcx-local"
CONFIGURED_REMOTE = "mcx"
RESTORE_DIR = "restore"
LOCK_RETRY_S = 60.0


@frozen
class DvcRecord:
    """A directory (or file) version held by DVC: what MLflow records about a checkpoint."""

    md5: str  # "<32 hex>.dir" for a directory, as in the .dvc file
    size: int | None
    nfiles: int | None
    path: str  # project-relative POSIX path of the tracked directory
    dvc_file: str  # absolute path of the .dvc file that points at it
    remote: str | None  # the remote it was pushed to (None: not pushed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _require_dvc() -> None:
    try:
        import dvc.repo  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(f"DVC is not importable here ({exc})",
                                 "install the tracking extra (`pip install 'mcx[track]'`, or ./dev env); until then "
                                 "datasets and checkpoints are not versioned by DVC.") from None


def _root(project_root: Path) -> Path:
    _require_dvc()
    root = Path(project_root).resolve()
    if not (root / ".dvc").is_dir():
        raise EnvironmentProblem(f"{root} is not a DVC repository (no .dvc/)",
                                 "run `dvc init` in the project root (mcx data prepare does this).")
    return root


# DVC's repository lock is a file lock, which keeps other processes out but not this one's other threads (a
# sweep's concurrent trials), and DVC keeps process-wide state (its logger, its UI): one thread at a time.
_THREADS = threading.RLock()


@contextmanager
def _repo(root: Path, *, git_view: bool, config: dict[str, Any] | None = None) -> Iterator[Repo]:
    """The DVC repo at ``root``; without ``git_view`` it ignores git (for git-ignored .dvc files under .mcx/).
    ``config`` is merged over the config files, in memory only. Held by one thread of this process at a time."""
    from dvc.lock import LockError
    from dvc.repo import Repo
    from dvc.scm import SCM

    with _THREADS:
        deadline = time.monotonic() + LOCK_RETRY_S
        while True:
            try:
                scm = None if git_view else SCM(str(root), no_scm=True)
                repo = Repo(str(root), scm=scm, config=config)
                break
            except LockError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            yield repo
        finally:
            repo.close()


def _locked(fn, *args: Any, **kwargs: Any) -> Any:
    """Run a repo operation, retrying while another DVC process holds the repository lock."""
    from dvc.lock import LockError

    deadline = time.monotonic() + LOCK_RETRY_S
    while True:
        try:
            return fn(*args, **kwargs)
        except LockError:
            if time.monotonic() > deadline:
                raise EnvironmentProblem("another DVC command holds the project's lock (.dvc/tmp/lock)",
                                         "wait for it to finish, then run again.") from None
            time.sleep(0.5)


def _inside(root: Path, path: Path, what: str) -> Path:
    full = (root / path).resolve() if not Path(path).is_absolute() else Path(path).resolve()
    if full != root and root not in full.parents:
        raise InputError(f"{what} {full} is outside the project {root}",
                         "DVC tracks only paths inside the project; move it there, or set "
                         "tracking.log_checkpoints = false.")
    return full


def _url(root: Path, remote: str) -> str:
    """A remote URL as mcx configures it: a local path made absolute against the project root."""
    return remote if "://" in remote else os.path.normpath(root / os.path.expanduser(remote))


def _own_default(repo: Repo) -> str | None:
    """The default remote the user or the project chose, if any (not mcx's embedded one). mcx's own
    default in config.local is dropped when another level has one, as it would shadow it."""
    levels = ("local", "repo", "global", "system")
    chosen = [(repo.config.read(level).get("core") or {}).get("remote") for level in levels]
    local = chosen[0]
    if local and local != EMBEDDED_REMOTE:
        return local
    other = next((name for name in chosen[1:] if name), None)  # the nearest level wins, as in DVC
    if other and local == EMBEDDED_REMOTE:
        with repo.config.edit("local") as conf:
            conf.get("core", {}).pop("remote", None)
    return other


def ensure_remote(project_root: Path, remote: str | None = None) -> str:
    """The name of the DVC remote mcx pushes to, configured if needed (see the module docstring)."""
    root = _root(project_root)
    with _repo(root, git_view=False) as repo:
        remotes = repo.config.get("remote", {})
        if remote is not None and remote in remotes:
            return remote
        if remote is None:
            default = _own_default(repo)
            if default is not None:
                return default
            name, url = EMBEDDED_REMOTE, str(paths.state_dir(root) / paths.DVC_REMOTE_DIR)
            Path(url).mkdir(parents=True, exist_ok=True)
        else:
            name, url = CONFIGURED_REMOTE, _url(root, remote)
        # Written only when something is missing: DVC rewrites the file in place, and a concurrent run opening the
        # repository meanwhile would read it empty (its remote "doesn't exist").
        local = repo.config.read("local")
        has_url = local.get("remote", {}).get(name, {}).get("url") == url
        has_default = bool(repo.config.get("core", {}).get("remote") or local.get("core", {}).get("remote"))
        if not (has_url and has_default):
            with repo.config.edit("local") as conf:
                if conf.get("remote", {}).get(name, {}).get("url") != url:
                    conf.setdefault("remote", {})[name] = {"url": url}
                if not repo.config.get("core", {}).get("remote") and not conf.get("core", {}).get("remote"):
                    conf.setdefault("core", {})["remote"] = name
        return name


def _record(root: Path, stage: Any, remote: str | None) -> DvcRecord:
    out = stage.outs[0]
    meta = out.meta
    return DvcRecord(md5=out.hash_info.value, size=meta.size, nfiles=meta.nfiles,
                     path=Path(out.fs_path).resolve().relative_to(root).as_posix(),
                     dvc_file=str(Path(stage.path).resolve()), remote=remote)


def track_checkpoint(project_root: Path, path: Path, *, remote: str | None = None, push: bool = True,
                     dvc_file: Path | None = None, meta: dict[str, Any] | None = None) -> DvcRecord:
    """``dvc add`` a finished stage's checkpoint directory and push it; returns its hash record.

    ``remote`` is ``[tracking] dvc_remote`` (None: see ``ensure_remote``). ``dvc_file``: where the
    ``.dvc`` file goes (a run's pointer, ``paths.pointer_file``), with ``meta`` and the remote pushed
    to under its ``meta.mcx``; None: beside the checkpoint. Adding the same content again is a no-op
    that returns the same md5.
    """
    _require_dvc()  # EnvironmentProblem where DVC is not installed (a training machine without the tracking extra)
    from dvc.exceptions import DvcException

    root = _root(project_root)
    full = _inside(root, Path(path), "checkpoint directory")
    if not full.exists():
        raise InputError(f"checkpoint directory {full} does not exist", "the stage wrote no checkpoint to track.")
    name = ensure_remote(root, remote) if push else None
    pointer = None if dvc_file is None else _inside(root, Path(dvc_file), ".dvc file")
    with _repo(root, git_view=pointer is not None and _git_view(root, pointer)) as repo:
        if pointer is None:
            stages = _locked(repo.add, [str(full)])
        else:  # a hand-written pointer (path and meta), completed by `dvc commit`
            url = repo.config.get("remote", {}).get(name, {}).get("url") if name else None
            _write_pointer(pointer, full, {**(meta or {}), "remote": {"name": name, "url": _shareable(url)}})
            try:
                stages = _locked(repo.commit, str(pointer), force=True)
            except BaseException:
                pointer.unlink(missing_ok=True)
                raise
        if push:
            try:
                _locked(repo.push, targets=[stages[0].path], remote=name)
            except DvcException as exc:  # hashed and in the cache: `dvc push` can send it later
                raise EnvironmentProblem(f"{full} is in the DVC cache but could not be pushed to remote {name!r}: "
                                         f"{exc}", f"push it when the remote is reachable: dvc push {stages[0].path}"
                                         ) from None
        return _record(root, stages[0], name)


def _write_pointer(pointer: Path, target: Path, meta: dict[str, Any]) -> None:
    import yaml  # PyYAML, a dvc dependency

    pointer.parent.mkdir(parents=True, exist_ok=True)
    doc = {"outs": [{"path": os.path.relpath(target, pointer.parent)}], "meta": {"mcx": meta}}
    pointer.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def _shareable(url: str | None) -> str | None:
    """``url`` if it may go into a committed file (no credentials in it), else None."""
    return str(url) if url is not None and redact_text(str(url)) == str(url) else None


def _git_view(root: Path, dvc_file: Path) -> bool:
    """Whether DVC may open the project with git for ``dvc_file``: not for a git-ignored one (DVC
    refuses those) nor for mcx's restore pointers (they would overlap the project's own .dvc files)."""
    if paths.state_dir(root) / RESTORE_DIR in dvc_file.parents:
        return False
    return not paths.git_ignores(root, dvc_file)


def _pointer(root: Path, md5: str, target: Path, *, unique: bool = False) -> Path:
    """A .dvc file under .mcx/restore/ that points at ``target`` with ``md5``, written whole (a
    temporary file renamed into place: a concurrent run reads the old or the new one, never a torn one).
    ``unique``: a name of its own, for a pointer its caller removes when done, so that a concurrent
    run's removal of its own pointer cannot take this one away (D50)."""
    if not md5 or "/" in md5 or len(md5.split(".")[0]) != 32:
        raise InputError(f"{md5!r} is not a DVC md5", "give the md5 recorded for the checkpoint or dataset.")
    pdir = paths.state_dir(root) / RESTORE_DIR
    pdir.mkdir(parents=True, exist_ok=True)
    stem = f"{target.name}-{md5.split('.')[0][:12]}"
    rel = json.dumps(os.path.relpath(target, pdir))  # a JSON string is a YAML double-quoted scalar
    body = f"outs:\n- md5: {md5}\n  hash: md5\n  path: {rel}\n".encode()
    if not unique:
        write_bytes_atomic(pdir / f"{stem}.dvc", body)
        return pdir / f"{stem}.dvc"
    fd, tmp = tempfile.mkstemp(prefix=f"{stem}-", suffix=".dvc", dir=pdir)  # nobody else opens it
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    return Path(tmp)


def restore(
    project_root: Path, *, dvc_file: Path | None = None, md5: str | None = None, path: Path | None = None,
    remote: str | None = None, force: bool = False,
) -> Path:
    """Bring back a dataset or checkpoint version: from ``dvc_file``, or by ``md5`` at ``path``.

    Fetches from the local cache, else the remote; returns the restored path. A different version
    already at ``path`` is replaced only with ``force`` (DataError otherwise).
    """
    _require_dvc()
    from dvc.exceptions import CheckoutError, ConfirmRemoveError, DvcException

    root = _root(project_root)
    if dvc_file is None:
        if md5 is None or path is None:
            raise ValueError("restore needs dvc_file, or md5 and path")
        target = _inside(root, Path(path), "restore path")
        pointer = _pointer(root, md5, target)
    else:
        pointer = _inside(root, Path(dvc_file), ".dvc file")
        target = None
    name = ensure_remote(root, remote)
    with _repo(root, git_view=_git_view(root, pointer)) as repo, _quiet():
        try:
            _locked(repo.pull, targets=[str(pointer)], remote=name, force=force)
        except (CheckoutError, ConfirmRemoveError) as exc:
            raise DataError(f"cannot restore {target or pointer}: {exc}",
                            "it holds another version or local changes; move it away, or restore with force=True.",
                            ) from None
        except DvcException as exc:
            raise DataError(f"cannot restore {target or pointer} from remote {name!r}: {exc}",
                            "check that the remote holds it (dvc push from where it was made).") from None
        if target is None:
            stage = repo.stage.load_one(str(pointer))
            target = Path(stage.outs[0].fs_path)
    return target


@contextmanager
def _quiet() -> Iterator[None]:
    """DVC's own warnings (missing cache files, progress) stay out of mcx's output: mcx says it once."""
    import logging

    loggers = [logging.getLogger(name) for name in ("dvc", "dvc_data", "dvc_objects")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def keep_version(project_root: Path, path: Path, *, md5: str, remote: str | None = None, push: bool = True) -> bool:
    """Make version ``md5`` of ``path`` (a DVC-tracked dataset in the workspace) restorable by hash.

    ``mcx run`` calls this for the dataset it trains on, so that ``mcx reproduce`` can bring that
    version back after ``path`` changed. When the DVC cache lacks the version, DVC hashes the
    workspace (its state database makes a repeat cheap) and saves it to the cache only if it *is*
    that version: DataError otherwise. Then, with ``push``, the version goes to the remote. The
    project's own ``.dvc`` files are never written (a pointer under ``.mcx/restore/`` is used).
    Returns whether the cache had to be filled.
    """
    root = _root(project_root)
    target = _inside(root, Path(path), "dataset")
    name = ensure_remote(root, remote) if push else None
    pointer = _pointer(root, md5, target, unique=True)  # removed below: concurrent runs each keep their own
    try:
        with _repo(root, git_view=False) as repo, _quiet():
            out = repo.stage.load_one(str(pointer)).outs[0]
            filled = out.changed_cache()
            if filled:
                out.save()
                if out.hash_info.value != md5:
                    raise DataError(f"{target} hashes to {out.hash_info.value}, but DVC records {md5} for it "
                                    "(a change that kept every file's size);",
                                    f"record the new version with `dvc add {target}` (or `dvc commit`), or "
                                    "restore the recorded one, discarding the change, with "
                                    f"`dvc checkout --force {target}`.")
                _locked(out.commit, relink=False)
            if name is not None:
                _locked(repo.push, targets=[str(pointer)], remote=name)
    finally:
        pointer.unlink(missing_ok=True)
    return filled


def restore_into(project_root: Path, checkout: Path, *, md5: str, path: Path, remote: str | None = None) -> Path:
    """Bring version ``md5`` of ``path`` (project-relative) into ``checkout``, another working tree of
    this project (a reproduction's git worktree), from the project's DVC cache, else its remote.

    The project's workspace is not touched: the checkout is opened as a DVC repository of its own
    that uses the project's cache directory and remotes. DataError naming the fix when neither the
    cache nor the remote holds the version. Returns the restored path inside ``checkout``.
    """
    _require_dvc()
    from dvc.exceptions import DvcException
    from dvc.scm import SCM

    root = _root(project_root)
    rel = Path(path)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"restore_into needs a project-relative path, not {path}")
    name = ensure_remote(root, remote)
    with _repo(root, git_view=False) as repo:
        cache_dir = str(Path(repo.cache.local.path).parents[1])  # <cache dir>/files/md5
        remotes = {k: dict(v) for k, v in repo.config.get("remote", {}).items()}
        url = remotes.get(name, {}).get("url", name)
    dest = Path(checkout).resolve()
    (dest / ".dvc").mkdir(exist_ok=True)  # a commit made before `dvc init` has none
    target = dest / rel
    pointer = _pointer(dest, md5, target)
    from dvc.repo import Repo

    config = {"cache": {"dir": cache_dir}, "remote": remotes, "core": {"remote": name}}
    missing = None
    with _THREADS, Repo(str(dest), scm=SCM(str(dest), no_scm=True), config=config) as other, _quiet():
        try:
            _locked(other.fetch, targets=[str(pointer)], remote=name)
        except DvcException as exc:  # the remote cannot be read; the cache alone may still hold it
            missing = str(exc)
        out = other.stage.load_one(str(pointer)).outs[0]
        if out.changed_cache():
            raise DataError(f"version {md5} of {rel} is neither in the DVC cache ({cache_dir}) nor on the remote "
                            f"{name!r} ({url}){f': {missing}' if missing else ''};",
                            "push it there from a machine that has it (`dvc push` with that version checked out), "
                            "or point tracking.dvc_remote (or `dvc remote add -d`) at the remote that holds it, "
                            f"or put that version back at {rel} yourself.")
        _locked(other.checkout, targets=[str(pointer)], force=True)
    return target
