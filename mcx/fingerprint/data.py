"""Data identity: the content of the spec's data, read again only where a file changed.

Hashed (``id``), for ``data.path`` (or each component of a mixture, ``mix.NAME``, ``valid.NAME``, ``test.NAME``:
D60) and, when set, ``data.tokenizer.path`` / ``data.tokenizer.merges``:

- tracked by DVC (see ``dvcfiles``): ``{"source": "dvc", "hash": "md5", "value": "<md5>.dir",
  "subpath": null}``. For a path inside a tracked directory (``data.dvc`` tracks ``data/``, the spec
  says ``data/quickstart``) the identity is the directory's hash plus ``subpath: "quickstart"``; the
  record's ``info`` says so. A change anywhere in ``data/`` then changes the ID: exact, if coarse.
  The record is trusted only after the workspace's output hashes to it (``dvcworkspace``): a file whose
  bytes changed since ``dvc add`` makes it a DataError naming the file (``dvc add`` / ``dvc checkout``).
- not tracked: ``{"source": "sha256", "value": ...}``, sha256 over the sorted relative paths and the
  sha256 of each file's bytes, with a warning (track it: `dvc add`).

A prepared dataset's largest token id goes into ``info.dataset.max_token_id`` (not the ``id``: it follows
from the content), kept with the ``.bin``'s hash; the planner checks it against the vocabulary.

Each file's hash comes from ``FileHashes``: a ``stat`` for a file whose (inode, mtime, size) is
unchanged since it was last hashed, a read otherwise; ``rehash=True`` (``mcx run --verify-data``,
``mcx reproduce``) reads every file. ``info.<name>.content`` counts the files and bytes read.

Missing data is a DataError naming the key and the fix (``mcx data prepare`` or ``dvc pull``),
except that ``require_data=False`` (``mcx plan``, ``mcx explain`` on a fresh clone) takes the hash of
a tracked but not yet pulled path from its DVC record: the ID is the same before and after the pull.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from mcx.data.dataset import token_dtype
from mcx.data.vocab import MANIFEST
from mcx.errors import DataError
from mcx.fingerprint.components import NOT_PULLED
from mcx.fingerprint.dvcfiles import DvcOut, find_out, norm
from mcx.fingerprint.dvcworkspace import check_output
from mcx.fingerprint.filehashes import FileHashes
from mcx.hashing import digest
from mcx.spec import ExperimentSpec
from mcx.spec.load import read_regular_bytes
from mcx.spec.schema import DataSpec


def not_pulled_warning(key: str, value: str, record: str) -> str:
    """The plan's warning for such a path (a run that pulls it drops it from its record)."""
    return (f"{key} = {value!r} is not in the workspace; the ID uses the hash in {record}; `dvc pull {record}` "
            "before training")


# Kernel file systems: endless files (/dev/zero), self-referring links (/proc/self/root), never a dataset.
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


def _not_regular(path: Path, why: str) -> OSError:
    return OSError(errno.EINVAL, why, str(path))


def _files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every file under ``path`` (itself, if a file), sorted.

    Only regular files, each directory once: a device, FIFO or socket, a path under /proc, /sys or /dev,
    or a directory reached twice through symbolic links (a loop) is an OSError naming it.
    """
    resolved = path.resolve()
    if any(resolved == root or root in resolved.parents for root in PSEUDO_ROOTS):
        raise _not_regular(path, "a kernel file system, not data")
    if path.is_file():
        return [("", path)]
    if not path.is_dir():
        raise _not_regular(path, "not a regular file")
    found, seen = [], set()
    for d, dirs, files in os.walk(path, followlinks=True):
        st = os.stat(d)
        if (st.st_dev, st.st_ino) in seen:
            raise _not_regular(Path(d), "a directory reached twice through symbolic links")
        seen.add((st.st_dev, st.st_ino))
        for name in files:
            full = Path(d, name)
            if not full.is_file():
                raise _not_regular(full, "not a regular file")
            found.append((full.relative_to(path).as_posix(), full))
    return sorted(found)


def tree_sha256(path: Path, hashes: FileHashes) -> tuple[str, int, int]:
    """(sha256, file count, total bytes) over a file or a directory tree."""
    files = _files(path)
    size = sum(p.stat().st_size for _, p in files)
    if files == [("", path)]:
        return hashes.hash(path, "sha256"), 1, size
    found = [[rel, hashes.hash(p, "sha256")] for rel, p in files]
    hashes.forget_under(path, {str(p) for _, p in files})
    return digest(found), len(files), size


def _dvc_identity(out: DvcOut, full: Path) -> dict[str, Any]:
    subpath = full.relative_to(out.path).as_posix() if full != out.path else None
    return {"source": "dvc", "hash": out.hash_name, "value": out.value, "subpath": subpath}


def content_identity(project_root: Path, value: str, key: str, warnings: list[str],
                     require_data: bool = True, allow_absent: bool = False,
                     hashes: FileHashes | None = None, rehash: bool = False) -> dict[str, Any]:
    """``{"id": ..., "info": ...}`` for one data path of the spec (``key`` names it in messages).

    With ``require_data=False`` a DVC-tracked path that is not in the workspace (not pulled yet)
    gets the hash DVC recorded, which is what ``dvc pull`` will bring, and a warning. With
    ``allow_absent`` (planning away from the data) a missing untracked path gets the identity
    ``{"source": "absent"}``, which no run ID is made from (mcx.ops.plan). ``hashes``: the file
    hashes to use (``collect_data`` shares one among the paths); without it the project's are
    opened here (``rehash``: read every file) and saved.
    """
    if hashes is None:
        hashes = FileHashes.for_project(project_root, full=rehash)
        try:
            return content_identity(project_root, value, key, warnings, require_data, allow_absent, hashes)
        finally:
            hashes.save()
    full = norm(Path(project_root) / value)
    out = find_out(full)
    if not full.exists():
        if out is None and allow_absent:
            warnings.append(f"{key} = {value!r} is not on this machine: the run ID, which hashes its content, is "
                            "known only where it is")
            return {"id": {"source": "absent", "value": None}, "info": {"path": str(full)}}
        if out is not None and not require_data:
            warnings.append(not_pulled_warning(key, value, str(out.record)))
            return {"id": _dvc_identity(out, full),
                    "info": {"path": str(full), "record": str(out.record), "stage": out.stage, "size": out.size,
                             "nfiles": out.nfiles, "verified": NOT_PULLED}}
        if out is not None:
            raise DataError(f"{key} = {value!r}: {full} is missing; DVC tracks it in {out.record}",
                            f"fetch it with `dvc pull {out.record}`.")
        fix = ("prepare it with `mcx data prepare SPEC` or fetch it with `dvc pull`" if key == "data.path"
               else "fix the path (relative to the project root) or fetch the file with `dvc pull`")
        raise DataError(f"{key} = {value!r}: {full} does not exist", fix + ".")
    before = hashes.stats()
    if out is not None:
        ident = _dvc_identity(out, full)
        verified = check_output(out, hashes, key=key, shown=value, project_root=norm(project_root),
                                warnings=warnings)
        info: dict[str, Any] = {"path": str(full), "record": str(out.record), "stage": out.stage,
                                "size": out.size, "nfiles": out.nfiles, "verified": verified,
                                "content": _cost(hashes, before)}
        if ident["subpath"] is not None:
            info["note"] = (f"inside the DVC-tracked {out.path}: the identity is that directory's hash "
                            f"plus the relative path {ident['subpath']!r}")
        return {"id": ident, "info": info}
    try:
        sha, nfiles, size = tree_sha256(full, hashes)
    except OSError as exc:
        fix = ("fix the file's permissions." if exc.errno == errno.EACCES
               else "give regular files (or directories of them).")
        raise DataError(f"{key} = {value!r}: cannot read {exc.filename} ({exc.strerror})", fix) from None
    if nfiles == 0:
        raise DataError(f"{key} = {value!r}: {full} holds no files",
                        "prepare it with `mcx data prepare SPEC` or fetch it with `dvc pull`.")
    warnings.append(f"{key} = {value!r} is not tracked by DVC; hashed its {nfiles} files ({size} bytes) "
                    f"by content; `dvc add {value}` makes it restorable by hash")
    return {"id": {"source": "sha256", "value": sha},
            "info": {"path": str(full), "record": None, "size": size, "nfiles": nfiles,
                     "content": _cost(hashes, before)}}


def _cost(hashes: FileHashes, before: dict[str, int]) -> dict[str, Any]:
    """What checking one path cost: files looked at, files and bytes read, whether kept hashes were used."""
    now = hashes.stats()
    return {**{k: now[k] - before[k] for k in now}, "kept_hashes": "not used (full re-hash)" if hashes.full else "used"}


def largest_token_id(data: DataSpec, project_root: Path, hashes: FileHashes, name: str = "dataset") -> int | None:
    """The largest token id in the prepared dataset ``name`` (of ``data.datasets()``: its ``<prefix>.bin``, dtype
    from its ``.idx`` header), kept with the file's hash (read once per version); None where there is no readable
    dataset of integer tokens."""
    _, path, prefix = data.datasets()[name]
    directory = norm(Path(project_root) / path)
    bin_path = directory / f"{prefix}.bin"
    dtype = token_dtype(directory / f"{prefix}.idx")
    try:
        return hashes.largest(bin_path, dtype) if dtype is not None and bin_path.is_file() else None
    except OSError:  # unreadable: the dataset checks at launch name it
        return None


def data_paths(data: DataSpec) -> dict[str, tuple[str, str]]:
    """The spec's data paths by their name in the data component: name -> (key, value); unset ones left out.
    A mixture's components are named ``mix.NAME``, ``valid.NAME``, ``test.NAME`` (D60)."""
    named: dict[str, tuple[str, str | None]] = {name: (key, path) for name, (key, path, _) in data.datasets().items()}
    named |= {"tokenizer": ("data.tokenizer.path", data.tokenizer.path),
              "merges": ("data.tokenizer.merges", data.tokenizer.merges)}
    return {name: (key, value) for name, (key, value) in named.items() if value is not None}


def _manifest_tokenizer(directory: Path) -> dict[str, Any] | None:
    try:
        entry = json.loads(read_regular_bytes(directory / MANIFEST, None))["tokenizer"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no readable manifest: the dataset checks at launch name it
    return entry if isinstance(entry, dict) else None


def check_one_tokenizer(data: DataSpec, project_root: Path) -> None:
    """A mixture's components were prepared with one tokenizer (their manifests' tokenizer entries, files by
    sha256, are equal): token ids mean the same in each. A DataError naming the first that differs."""
    datasets = data.datasets()
    if len(datasets) < 2:
        return
    first: tuple[str, dict[str, Any]] | None = None
    for key, path, _ in datasets.values():
        entry = _manifest_tokenizer(norm(Path(project_root) / path))
        if entry is None:
            continue
        if first is None:
            first = (key, entry)
        elif entry != first[1]:
            def said(e: dict[str, Any]) -> str:
                files = ", ".join(f"{n} {str(h)[:12]}" for n, h in sorted((e.get("files") or {}).items()))
                return f"{e.get('kind')}, {e.get('vocab_size')} ids, {files}"
            raise DataError(f"{key.removesuffix('.path')} = {path!r} was prepared with another tokenizer ({said(entry)}) "
                            f"than {first[0].removesuffix('.path')} ({said(first[1])}): a token id would mean different "
                            "text in each component;",
                            "prepare every component with the same tokenizer (`mcx data prepare SOURCE --out DIR` with "
                            "data.tokenizer naming one tokenizer file), then `dvc add` them again.")


def collect_data(spec: ExperimentSpec, project_root: Path, require_data: bool = True,
                 allow_absent: bool = False, rehash: bool = False) -> dict[str, Any]:
    """The data component: ``{"id": ..., "info": ..., "warnings": [...]}`` (see ``content_identity``).

    ``rehash``: read every file instead of trusting the hashes kept for unchanged ones.
    """
    warnings: list[str] = []
    ident: dict[str, Any] = {}
    info: dict[str, Any] = {}
    hashes = FileHashes.for_project(project_root, full=rehash)
    try:
        for name, (key, value) in data_paths(spec.data).items():
            part = content_identity(project_root, value, key, warnings, require_data, allow_absent, hashes)
            ident[name], info[name] = part["id"], part["info"]
        # the largest token id, for the planner's vocabulary check: info, not id (the content fixes it)
        for name in spec.data.datasets():
            if name in info and info[name].get("verified") != NOT_PULLED and ident[name].get("source") != "absent":
                top = largest_token_id(spec.data, project_root, hashes, name)
                if top is not None:
                    info[name]["max_token_id"] = top
        check_one_tokenizer(spec.data, project_root)
    finally:
        hashes.save()  # what was read is worth keeping, whether or not the data passed
    return {"id": ident, "info": info, "warnings": warnings}
