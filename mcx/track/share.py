"""A run's checkpoints for other clones: the committed pointer files and fetching them (D38).

``mcx run`` writes ``.mcx/checkpoints/<id>/<stage>.dvc`` for each stage's final checkpoint
(``dvc_store.track_checkpoint(dvc_file=...)``): a plain DVC file whose output is
``../../runs/<id>/<stage>/checkpoints/iter_N`` and whose ``meta.mcx`` names the run, the stage, the
remote it was pushed to (its URL unless that holds credentials) and the dataset versions the run
trained on. ``.mcx/`` is git-ignored but for this directory (``/.mcx/*`` then ``!/.mcx/checkpoints/``
in ``.gitignore``), and the code fingerprint leaves ``.mcx/`` out, so writing one does not change the
next run's ID; the user commits it, and a clone pulls with ``dvc pull <pointer>`` or ``mcx pull <id>``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import DataError, RunIdError
from mcx.track import paths
from mcx.track.dvc_store import DvcRecord, _git_view, _inside, _locked, _quiet, _repo, _root


@frozen
class Pointer:
    """One committed pointer file, as read (without DVC)."""

    stage: str
    dvc_file: Path  # absolute
    target: Path  # absolute: the checkpoint directory it points at
    md5: str
    nfiles: int | None
    size: int | None
    remote: dict[str, Any]  # {"name", "url"} the run pushed to; url None when it held credentials
    data: list[dict[str, Any]]  # [{"spec", "path", "output", "md5"}]: the dataset versions the run trained on


def read_pointers(project_root: Path, run_id: str) -> list[Pointer]:
    """The run's pointers (smoke before full); [] when this checkout has none."""
    import yaml  # PyYAML, a dvc dependency

    order = {stage: i for i, stage in enumerate(paths.STAGES)}
    found = sorted(paths.pointer_dir(project_root, run_id).glob("*.dvc"), key=lambda p: (order.get(p.stem, 9), p.name))
    out = []
    for f in found:
        try:
            doc = yaml.safe_load(f.read_text(encoding="utf-8"))
            entry, mcx = doc["outs"][0], (doc.get("meta") or {}).get("mcx") or {}
            out.append(Pointer(stage=mcx.get("stage", f.stem), dvc_file=f.resolve(),
                               target=Path(os.path.normpath(f.parent.resolve() / entry["path"])), md5=entry["md5"],
                               nfiles=entry.get("nfiles"), size=entry.get("size"), remote=mcx.get("remote") or {},
                               data=list(mcx.get("data") or [])))
        except (yaml.YAMLError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise DataError(f"{f} is not a checkpoint pointer mcx wrote ({exc.__class__.__name__}: {exc});",
                            "restore it from git (git checkout -- it), or remove it.") from None
    return out


@frozen
class Remotes:
    """The DVC remotes configured here (every config level), without writing anything."""

    urls: dict[str, str]
    default: str | None
    shared: frozenset[str]  # the ones in the committed .dvc/config, which every clone sees


def configured_remotes(project_root: Path) -> Remotes:
    from dvc.config import Config

    config = Config(dvc_dir=str(_root(project_root) / ".dvc"))  # the config files alone: nothing is written
    urls = {name: str(conf.get("url", "")) for name, conf in config.get("remote", {}).items()}
    shared = frozenset(config.read("repo").get("remote") or {})
    return Remotes(urls=urls, default=config.get("core", {}).get("remote"), shared=shared)


def is_local(url: str) -> bool:
    return "://" not in url


def fetch(project_root: Path, dvc_file: Path, *, remote: str, url: str | None = None) -> bool:
    """Pull the output of ``dvc_file`` into place from ``remote`` (a configured name, or with ``url``
    a remote of that name held in memory only: nothing is written to DVC's config). True: fetched;
    False: already there. DataError, with nothing left in the workspace, when it cannot be done."""
    from dvc.exceptions import CheckoutError, ConfirmRemoveError, DvcException

    root = _root(project_root)
    pointer = _inside(root, Path(dvc_file), ".dvc file")
    where = f"remote {remote!r}" + (f" ({url})" if url else "")
    config = {"remote": {remote: {"url": url}}} if url else None
    with _repo(root, git_view=_git_view(root, pointer), config=config) as repo, _quiet():
        stage = repo.stage.load_one(str(pointer))
        target, md5 = Path(stage.outs[0].fs_path), stage.outs[0].hash_info.value
        new = _topmost_missing(root, target)
        try:
            stats = _locked(repo.pull, targets=[str(pointer)], remote=remote)
        except ConfirmRemoveError:
            raise DataError(f"{target} holds files that are not version {md5};",
                            "move it away (or delete it) and run again; nothing was changed there.") from None
        except CheckoutError:
            _remove(new)
            raise DataError(f"{where} does not hold version {md5} of {target.relative_to(root)};",
                            "push it there from the clone that made it (`dvc push` of the same .dvc file there), "
                            "or name the remote that holds it (mcx pull --remote NAME_OR_URL).") from None
        except DvcException as exc:
            _remove(new)
            raise DataError(f"cannot read {where}: {exc};",
                            "check that it is reachable from here, or name another (mcx pull --remote NAME_OR_URL)."
                            ) from None
    return bool(stats.get("added") or stats.get("modified") or stats.get("deleted"))


def _topmost_missing(root: Path, target: Path) -> Path | None:
    """The outermost directory on the way to ``target`` that does not exist yet (DVC creates it)."""
    missing = None
    for d in (target, *target.parents):
        if d == root or d.exists():
            break
        missing = d
    return missing


def _remove(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def unknown_run(project_root: Path, run_id: str) -> RunIdError:
    """The error for a run with no pointers in this checkout, saying why that may be."""
    rel = paths.pointer_dir(project_root, run_id).relative_to(project_root)
    if (paths.run_dir(project_root, run_id) / "run.json").is_file():
        return RunIdError(f"run {run_id} is recorded here but has no checkpoint pointer in {rel}/ (its checkpoints "
                          "were not added to DVC: tracking.log_checkpoints = false, or DVC failed when it ran);",
                          f"`mcx show {run_id}` shows its record; its checkpoints, if any, are under "
                          f".mcx/runs/{run_id}/.")
    return RunIdError(f"unknown run ID {run_id}: no {rel}/ in this checkout;",
                      "`git pull` the commit that added it (mcx run says to commit it), or list runs with `mcx ls`.")


def share_hint(project_root: Path, dvc_record: DvcRecord, run_id: str, stage: str, remotes: Remotes) -> str:
    """What ``mcx run`` says once a stage's checkpoint is tracked: what to commit, and how a clone pulls it."""
    root = Path(project_root).resolve()
    pointer = Path(dvc_record.dvc_file).relative_to(root).as_posix()
    folder = Path(pointer).parent.as_posix()
    text = f"{stage} stage: checkpoint {dvc_record.path} is in DVC (pushed to remote {dvc_record.remote!r})"
    if paths.git_ignores(root, Path(dvc_record.dvc_file)):
        return (text + f"; git ignores its pointer {pointer}: in .gitignore replace `/.mcx/` with `/.mcx/*` and "
                f"`!/.mcx/checkpoints/`, then commit {folder} so that clones can pull it")
    text += (f"; commit its pointer (git add {folder} && git commit) so that a clone can `dvc pull {pointer}` "
             f"or `mcx pull {run_id}`")
    if dvc_record.remote not in remotes.shared:
        url = remotes.urls.get(dvc_record.remote or "", "")
        text += (f"; remote {dvc_record.remote!r} ({url}) is configured on this machine only: for clones elsewhere, "
                 "configure a shared remote once (`dvc remote add -d NAME URL`, commit .dvc/config)")
    return text
