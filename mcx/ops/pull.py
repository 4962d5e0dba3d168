"""`mcx pull RUN_ID`: a run's final checkpoints, and the dataset version it trained on where that is
missing, fetched into place from the DVC remote, by the run's committed pointers (D38); every file fetched
checked against its DVC record (mcx.ops.data.check_pulled: DVC takes a remote's damaged object as it is), and
a checkpoint's also against its own checksums.json (D48), as is a checkpoint already here before DVC compares
it: each damaged file is named (a fetched one removed from the workspace) and the pull exits 2.

The remote: ``--remote`` (a configured name, or a URL or path held in memory only), else a remote
configured here with the URL the run pushed to, else that URL itself, else this clone's default
remote. Nothing is written to DVC's config; a local remote that is not a directory here is refused
before anything is fetched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from mcx.errors import DataError
from mcx.fingerprint.dvcfiles import DvcOut
from mcx.fingerprint.dvcworkspace import shown_path
from mcx.fingerprint.init_from import check_checkpoint
from mcx.ops.data import check_pulled
from mcx.track.dvc_store import _inside, _pointer
from mcx.track.paths import check_run_id
from mcx.track.share import configured_remotes, fetch, is_local, read_pointers, unknown_run
from mcx.weights.checksums import FILE, verify

if TYPE_CHECKING:
    from mcx.track.share import Pointer, Remotes

MEMORY_REMOTE = "mcx-pull"  # the name of a remote held in memory only


@frozen(kw_only=True)
class PulledCheckpoint:
    """A stage's final checkpoint: where it is (project-relative), its DVC hash and size, whether it was fetched
    (False: it was here already)."""

    stage: str
    path: str
    md5: str
    nfiles: int | None
    size: int | None
    fetched: bool


@frozen(kw_only=True)
class PulledData:
    """A dataset version the run trained on: its spec key and path, the DVC output holding it, whether it was
    fetched (False: the path was here)."""

    spec: str | None
    path: str | None
    output: str | None
    md5: str | None
    fetched: bool


@frozen(kw_only=True)
class Pulled:
    """What `mcx pull` did, and from which remote (``url``: None where no URL is known for its name)."""

    run_id: str
    remote_name: str
    remote_url: str | None
    checkpoints: tuple[PulledCheckpoint, ...]
    data: tuple[PulledData, ...]

    def to_dict(self) -> dict[str, Any]:
        """The object `mcx pull --json` prints."""
        return {"run_id": self.run_id, "remote": {"name": self.remote_name, "url": self.remote_url},
                "checkpoints": [{"stage": c.stage, "path": c.path, "md5": c.md5, "nfiles": c.nfiles, "size": c.size,
                                 "fetched": c.fetched} for c in self.checkpoints],
                "data": [{"spec": d.spec, "path": d.path, "output": d.output, "md5": d.md5, "fetched": d.fetched}
                         for d in self.data]}


def pull(run_id: str, *, project: Path, remote: str | None = None) -> Pulled:
    root = Path(project).resolve()
    pointers = read_pointers(root, check_run_id(run_id))
    if not pointers:
        raise unknown_run(root, run_id)
    for p in pointers:
        _inside(root, p.target, f"the checkpoint {p.dvc_file.name} points at")
    name, url = _choose(root, run_id, pointers, remote, configured_remotes(root))
    for p in pointers:  # the files here already are checked before DVC compares them (it would blame the remote)
        if (p.target / FILE).is_file():  # without one: written before checkpoints carried checksums (D36)
            check_checkpoint(root, run_id, p.target, f"{p.stage} stage", missing=False)  # missing: fetched
    checkpoints = []
    for p in pointers:
        fetched = fetch(root, p.dvc_file, remote=name, url=url)
        if fetched:
            out = DvcOut(path=p.target, hash_name="md5", value=p.md5, size=p.size, nfiles=p.nfiles,
                         record=p.dvc_file, stage=None)
            check_pulled(root, out, remote=url or name, again=f"`mcx pull {run_id}`")
            _check_sums(root, run_id, p)
        checkpoints.append(PulledCheckpoint(stage=p.stage, path=p.target.relative_to(root).as_posix(), md5=p.md5,
                                            nfiles=p.nfiles, size=p.size, fetched=fetched))
    data = []
    entries = {(e.get("output"), e.get("md5")): e for p in pointers for e in p.data}
    for (output, md5), entry in entries.items():
        fetched = False
        if not (root / str(entry.get("path"))).exists():
            target = _inside(root, root / str(output), f"{entry.get('spec')}'s DVC output")
            pointer = _pointer(root, str(md5), target, unique=True)  # removed below: a concurrent pull keeps its own (D50)
            try:
                fetched = fetch(root, pointer, remote=name, url=url)
            finally:
                pointer.unlink(missing_ok=True)
            if fetched:
                out = DvcOut(path=target, hash_name="md5", value=str(md5), size=None, nfiles=None, record=pointer,
                             stage=None)
                check_pulled(root, out, remote=url or name, again=f"`mcx pull {run_id}`")
        data.append(PulledData(spec=entry.get("spec"), path=entry.get("path"), output=output, md5=md5,
                               fetched=fetched))
    return Pulled(run_id=run_id, remote_name=name, remote_url=url or configured_remotes(root).urls.get(name),
                  checkpoints=tuple(checkpoints), data=tuple(data))


def _check_sums(root: Path, run_id: str, pointer: Pointer) -> None:
    """A fetched checkpoint whose files match their DVC md5 but not its checksums.json was damaged before
    `dvc add` hashed it, so every copy is: its damaged files are removed here and named (DataError)."""
    if not (pointer.target / FILE).is_file():  # its DVC record has none: written before checkpoints carried them
        return
    problems, _ = verify(pointer.target)
    if not problems:
        return
    names = [line.partition(":")[0] for line in problems]
    for name in names:
        if name != FILE:
            (pointer.target / name).unlink(missing_ok=True)
    raise DataError(f"the {pointer.stage} stage checkpoint pulled for run {run_id} "
                    f"({shown_path(pointer.target, root)}) matches its DVC record but not its own {FILE} "
                    f"({'; '.join(problems[:5])}{f' and {len(problems) - 5} more' if len(problems) > 5 else ''}): it "
                    "was damaged before it was added to DVC, so every copy of this version is; mcx removed the "
                    "damaged files here;",
                    f"train the run again where it was made (`mcx run SPEC --force` of its spec), commit its new "
                    f"pointer, and pull that run instead.")


def _local(url: str, root: Path) -> str:
    return os.path.normpath(root / os.path.expanduser(url))


def _choose(root: Path, run_id: str, pointers: list[Pointer], override: str | None,
            remotes: Remotes) -> tuple[str, str | None]:
    """(remote name, URL to hold in memory or None for a configured one); see the module docstring."""
    recorded: dict[str, Any] = next((p.remote for p in pointers if p.remote), {})
    rname, rurl = recorded.get("name"), recorded.get("url")
    if override is not None:
        name, url = ((override, None) if override in remotes.urls
                     else (MEMORY_REMOTE, override if not is_local(override) else _local(override, root)))
    else:
        def same(u: str) -> bool:
            if not rurl or u == rurl:
                return u == rurl
            return is_local(u) and is_local(rurl) and _local(u, root) == _local(rurl, root)

        here = sorted((n for n, u in remotes.urls.items() if same(u)), key=lambda n: n != rname)
        if here:
            name, url = here[0], None
        elif rurl and (not is_local(rurl) or Path(rurl).is_dir()):
            name, url = (rname if rname and rname not in remotes.urls else MEMORY_REMOTE), rurl
        elif remotes.default:
            name, url = remotes.default, None
        else:
            raise DataError(f"run {run_id} was pushed to remote {rname!r} ({rurl or 'URL not recorded'}), which is not "
                            "reachable from here, and no other DVC remote is configured here;",
                            f"name the remote that holds it (mcx pull {run_id} --remote NAME_OR_URL), or configure "
                            "the team's shared remote (`dvc remote add -d NAME URL`, commit .dvc/config).")
    where = url or remotes.urls.get(name, "")
    if where and is_local(where) and not Path(where).is_dir():
        label = f"remote {name!r} ({where})" if name != MEMORY_REMOTE else f"remote {where}"
        raise DataError(f"{label} is not reachable from here (no such directory);",
                        f"name one that is (mcx pull {run_id} --remote NAME_OR_URL), or configure the team's shared "
                        "remote (`dvc remote add -d NAME URL`, commit .dvc/config).")
    return name, url
