"""`mcx pull RUN_ID`: a run's final checkpoints, and the dataset version it trained on where that is
missing, fetched into place from the DVC remote, by the run's committed pointers (D38); the dataset checked
file by file against its record (mcx.ops.data.check_pulled).

The remote: ``--remote`` (a configured name, or a URL or path held in memory only), else a remote
configured here with the URL the run pushed to, else that URL itself, else this clone's default
remote. Nothing is written to DVC's config; a local remote that is not a directory here is refused
before anything is fetched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mcx.errors import DataError

MEMORY_REMOTE = "mcx-pull"  # the name of a remote held in memory only


def pull(run_id: str, *, project: Path, remote: str | None = None) -> dict[str, Any]:
    from mcx.fingerprint.dvcfiles import DvcOut
    from mcx.ops.data import check_pulled
    from mcx.track.dvc_store import _inside, _pointer
    from mcx.track.paths import check_run_id
    from mcx.track.share import configured_remotes, fetch, read_pointers, unknown_run

    root = Path(project).resolve()
    pointers = read_pointers(root, check_run_id(run_id))
    if not pointers:
        raise unknown_run(root, run_id)
    for p in pointers:
        _inside(root, p.target, f"the checkpoint {p.dvc_file.name} points at")
    name, url = _choose(root, run_id, pointers, remote, configured_remotes(root))
    checkpoints = []
    for p in pointers:
        fetched = fetch(root, p.dvc_file, remote=name, url=url)
        checkpoints.append({"stage": p.stage, "path": p.target.relative_to(root).as_posix(), "md5": p.md5,
                            "nfiles": p.nfiles, "size": p.size, "fetched": fetched})
    data = []
    entries = {(e.get("output"), e.get("md5")): e for p in pointers for e in p.data}
    for (output, md5), entry in entries.items():
        row = {"spec": entry.get("spec"), "path": entry.get("path"), "output": output, "md5": md5, "fetched": False}
        if not (root / str(entry.get("path"))).exists():
            target = _inside(root, root / str(output), f"{entry.get('spec')}'s DVC output")
            pointer = _pointer(root, str(md5), target)
            try:
                row["fetched"] = fetch(root, pointer, remote=name, url=url)
            finally:
                pointer.unlink(missing_ok=True)
            if row["fetched"]:  # checkpoints carry their own checksums, checked where they load (mcx.train.checksums)
                out = DvcOut(path=target, hash_name="md5", value=str(md5), size=None, nfiles=None, record=pointer,
                             stage=None)
                check_pulled(root, out, remote=url or name, again=f"`mcx pull {run_id}`")
        data.append(row)
    return {"run_id": run_id, "remote": {"name": name, "url": url or configured_remotes(root).urls.get(name)},
            "checkpoints": checkpoints, "data": data}


def _local(url: str, root: Path) -> str:
    return os.path.normpath(root / os.path.expanduser(url))


def _choose(root: Path, run_id: str, pointers: list[Any], override: str | None, remotes: Any) -> tuple[str, str | None]:
    """(remote name, URL to hold in memory or None for a configured one); see the module docstring."""
    from mcx.track.share import is_local

    recorded = next((p.remote for p in pointers if p.remote), {})
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
