"""Data identity: the content hash DVC already holds for the spec's dataset, never re-reading it.

Hashed (``id``), for ``data.path`` and, when set, ``data.tokenizer.path`` / ``data.tokenizer.merges``:

- tracked by DVC (see ``dvcfiles``): ``{"source": "dvc", "hash": "md5", "value": "<md5>.dir",
  "subpath": null}``. For a path inside a tracked directory (``data.dvc`` tracks ``data/``, the spec
  says ``data/quickstart``) the identity is the directory's hash plus ``subpath: "quickstart"``; the
  record's ``info`` says so. A change anywhere in ``data/`` then changes the ID: exact, if coarse.
  Before trusting the record, the output's file count and total size are compared with what DVC
  wrote (``stat`` only, no reading); a mismatch is a DataError (``dvc add`` / ``dvc checkout``). An
  in-place edit that keeps every size escapes this check; ``dvc status`` sees it.
- not tracked: ``{"source": "sha256", "value": ...}``, sha256 over the sorted relative paths and the
  sha256 of each file's bytes, streamed, with a warning (track it: `dvc add`).

Missing data is a DataError naming the key and the fix (``mcx data prepare`` or ``dvc pull``),
except that ``require_data=False`` (``mcx plan``, ``mcx explain`` on a fresh clone) takes the hash of
a tracked but not yet pulled path from its DVC record: the ID is the same before and after the pull.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mcx.errors import DataError
from mcx.fingerprint.code import file_sha256
from mcx.fingerprint.dvcfiles import DvcOut, dvc_root, dvcignore_files, find_out, has_patterns, norm
from mcx.hashing import digest
from mcx.spec import ExperimentSpec
from mcx.spec.schema import DataSpec

_DVC_SKIPPED_DIRS = {".git", ".hg", ".dvc"}  # DVC's default ignores inside a tracked directory


def _files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every file under ``path`` (itself, if a file), sorted."""
    if path.is_file():
        return [("", path)]
    found = []
    for d, dirs, files in os.walk(path, followlinks=True):
        for name in files:
            full = Path(d, name)
            found.append((full.relative_to(path).as_posix(), full))
    return sorted(found)


def tree_sha256(path: Path) -> tuple[str, int, int]:
    """(sha256, file count, total bytes) over a file or a directory tree, streamed."""
    files = _files(path)
    size = sum(p.stat().st_size for _, p in files)
    if files == [("", path)]:
        return file_sha256(path), 1, size
    return digest([[rel, file_sha256(p)] for rel, p in files]), len(files), size


def _shape(path: Path) -> tuple[int, int, list[Path]]:
    """(file count, total bytes, .dvcignore files inside) as DVC counts a tracked output."""
    if path.is_file():
        return 1, path.stat().st_size, []
    nfiles = size = 0
    ignores = []
    for d, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = [x for x in dirs if x not in _DVC_SKIPPED_DIRS]
        for name in files:
            if name == ".git":
                continue
            if name == ".dvcignore" and has_patterns(Path(d, name)):
                ignores.append(Path(d, name))
            nfiles += 1
            size += Path(d, name).stat().st_size
    return nfiles, size, ignores


def _patterns(ignores: list[Path]) -> list[str] | None:
    """The plain glob patterns of these .dvcignore files; None when one uses negation or anchors
    (then DVC's own matcher decides, and mcx only warns)."""
    out: list[str] = []
    for f in ignores:
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("!") or "/" in line.rstrip("/"):
                return None
            out.append(line.rstrip("/"))
    return out


def _shape_without(path: Path, patterns: list[str]) -> tuple[int, int]:
    """(file count, total bytes) of a directory, leaving out names that match a pattern."""
    import fnmatch

    def ignored(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    nfiles = size = 0
    for d, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = [x for x in dirs if x not in _DVC_SKIPPED_DIRS and not ignored(x)]
        for name in files:
            if name == ".git" or ignored(name):
                continue
            nfiles += 1
            size += Path(d, name).stat().st_size
    return nfiles, size


def _check_fresh(out: DvcOut, key: str, shown: str, warnings: list[str]) -> str:
    """Compare the output's file count and size with DVC's record; returns what was verified."""
    if out.size is None:
        warnings.append(f"{key}: {out.record} records no size for {out.path}; not verified against the workspace")
        return "not verified (no size recorded)"
    nfiles, size, inside = _shape(out.path)
    want_files = out.nfiles if out.nfiles is not None else 1
    if (nfiles, size) == (want_files, out.size):
        return "file count and total size match the DVC record"
    ignores = [*dvcignore_files(dvc_root(out.path) or out.path, out.path), *inside]
    now = f"{nfiles} files, {size} bytes now; {want_files} files, {out.size} bytes recorded"
    patterns = _patterns(ignores)
    if patterns is not None and out.path.is_dir():
        kept = _shape_without(out.path, patterns)
        if kept == (want_files, out.size):
            return "file count and total size match the DVC record (.dvcignore applied)"
        now = f"{kept[0]} files, {kept[1]} bytes now (.dvcignore applied); {want_files} files, {out.size} bytes recorded"
        ignores = []  # the patterns were understood and do not explain the difference
    if ignores:
        warnings.append(f"{key}: {out.path} differs from {out.record} ({now}), possibly because of "
                        f"{', '.join(map(str, ignores))}; run `dvc status` to be sure")
        return "not verified (.dvcignore)"
    raise DataError(f"{key} = {shown!r}: {out.path} changed since DVC recorded it in {out.record} ({now})",
                    f"record the new version with `dvc add {out.path}` (or `dvc commit`), "
                    f"or restore the recorded one with `dvc checkout {out.record}`.")


def _dvc_identity(out: DvcOut, full: Path) -> dict[str, Any]:
    subpath = full.relative_to(out.path).as_posix() if full != out.path else None
    return {"source": "dvc", "hash": out.hash_name, "value": out.value, "subpath": subpath}


def content_identity(project_root: Path, value: str, key: str, warnings: list[str],
                     require_data: bool = True, allow_absent: bool = False) -> dict[str, Any]:
    """``{"id": ..., "info": ...}`` for one data path of the spec (``key`` names it in messages).

    With ``require_data=False`` a DVC-tracked path that is not in the workspace (not pulled yet)
    gets the hash DVC recorded, which is what ``dvc pull`` will bring, and a warning. With
    ``allow_absent`` (planning away from the data) a missing untracked path gets the identity
    ``{"source": "absent"}``, which no run ID is made from (mcx.ops.plan).
    """
    full = norm(Path(project_root) / value)
    out = find_out(full)
    if not full.exists():
        if out is None and allow_absent:
            warnings.append(f"{key} = {value!r} is not on this machine: the run ID, which hashes its content, is "
                            "known only where it is")
            return {"id": {"source": "absent", "value": None}, "info": {"path": str(full)}}
        if out is not None and not require_data:
            warnings.append(f"{key} = {value!r} is not in the workspace; the ID uses the hash in {out.record}; "
                            f"`dvc pull {out.record}` before training")
            return {"id": _dvc_identity(out, full),
                    "info": {"path": str(full), "record": str(out.record), "stage": out.stage, "size": out.size,
                             "nfiles": out.nfiles, "verified": "not verified (not in the workspace)"}}
        if out is not None:
            raise DataError(f"{key} = {value!r}: {full} is missing; DVC tracks it in {out.record}",
                            f"fetch it with `dvc pull {out.record}`.")
        fix = ("prepare it with `mcx data prepare SPEC` or fetch it with `dvc pull`" if key == "data.path"
               else "fix the path (relative to the project root) or fetch the file with `dvc pull`")
        raise DataError(f"{key} = {value!r}: {full} does not exist", fix + ".")
    if out is not None:
        ident = _dvc_identity(out, full)
        info: dict[str, Any] = {"path": str(full), "record": str(out.record), "stage": out.stage,
                                "size": out.size, "nfiles": out.nfiles,
                                "verified": _check_fresh(out, key, value, warnings)}
        if ident["subpath"] is not None:
            info["note"] = (f"inside the DVC-tracked {out.path}: the identity is that directory's hash "
                            f"plus the relative path {ident['subpath']!r}")
        return {"id": ident, "info": info}
    sha, nfiles, size = tree_sha256(full)
    if nfiles == 0:
        raise DataError(f"{key} = {value!r}: {full} holds no files",
                        "prepare it with `mcx data prepare SPEC` or fetch it with `dvc pull`.")
    warnings.append(f"{key} = {value!r} is not tracked by DVC; hashed its {nfiles} files ({size} bytes) "
                    f"by content; `dvc add {value}` makes this instant and reproducible")
    return {"id": {"source": "sha256", "value": sha},
            "info": {"path": str(full), "record": None, "size": size, "nfiles": nfiles}}


def data_paths(data: DataSpec) -> dict[str, tuple[str, str]]:
    """The spec's data paths by their name in the data component: name -> (key, value); unset ones left out."""
    named = {"dataset": ("data.path", data.path), "tokenizer": ("data.tokenizer.path", data.tokenizer.path),
             "merges": ("data.tokenizer.merges", data.tokenizer.merges)}
    return {name: (key, value) for name, (key, value) in named.items() if value is not None}


def collect_data(spec: ExperimentSpec, project_root: Path, require_data: bool = True,
                 allow_absent: bool = False) -> dict[str, Any]:
    """The data component: ``{"id": ..., "info": ..., "warnings": [...]}`` (see ``content_identity``)."""
    warnings: list[str] = []
    ident: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for name, (key, value) in data_paths(spec.data).items():
        part = content_identity(project_root, value, key, warnings, require_data, allow_absent)
        ident[name], info[name] = part["id"], part["info"]
    return {"id": ident, "info": info, "warnings": warnings}
