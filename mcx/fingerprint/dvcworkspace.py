"""A DVC-tracked output in the workspace compared with its record, by content.

The output is walked as DVC walks it (``.git``, ``.hg`` and ``.dvc`` left out, and what
``.dvcignore`` patterns name), each file's md5 comes from ``FileHashes`` (a ``stat`` when the file
has not changed), and the output's hash is DVC's (``mcx.data.dvc_hash.tree_md5`` for a directory).
A different hash is a DataError that names the files that differ (from the record's ``.dir``
listing in DVC's cache, else the files whose content changed since mcx last hashed them, else the files
written after the record) and the two fixes, ``dvc add`` and ``dvc checkout --force`` (plain ``dvc checkout``
refuses to overwrite modified files).

A warning instead, where a difference may not be real: a ``.dvcignore`` pattern that is not a plain
name glob (negation, a slash inside: DVC's own matcher decides), and DVC 2 records (``md5-dos2unix``:
DVC 2 hashed text files with CRLF turned into LF). Records of other hashes (``etag``, ``checksum``:
outputs outside the workspace) are not checked.
"""

from __future__ import annotations

import configparser
import fnmatch
import hashlib
import json
import os
from pathlib import Path

from mcx.data.dvc_hash import tree_md5
from mcx.errors import DataError
from mcx.fingerprint.dvcfiles import DvcOut, dvc_root, dvcignore_files
from mcx.fingerprint.filehashes import FileHashes

_SKIPPED_DIRS = frozenset({".git", ".hg", ".dvc"})  # DVC's default ignores
Pattern = tuple[str, bool]  # (glob matched against a name, directories only)


def ignore_patterns(dvcignore: Path) -> list[Pattern] | None:
    """The patterns of one ``.dvcignore``; None when one is not a plain name glob."""
    try:
        text = dvcignore.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out: list[Pattern] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        glob = line.rstrip("/")
        if line.startswith("!") or "/" in glob or "\\" in glob or not glob:
            return None
        out.append((glob, line.endswith("/")))
    return out


def workspace_files(top: Path, patterns: list[Pattern]) -> tuple[list[tuple[str, Path]], list[Path]]:
    """(posix path relative to ``top``, path) of the files DVC hashes in directory ``top``, sorted,
    and the ``.dvcignore`` files found inside whose patterns could not be applied."""
    files: list[tuple[str, Path]] = []
    unsure: list[Path] = []

    def walk(d: Path, rel: str, pats: list[Pattern], above: frozenset[tuple[int, int]]) -> None:
        st = os.stat(d)
        if (st.st_dev, st.st_ino) in above:
            return  # a symbolic link back to a directory above: a loop
        above = above | {(st.st_dev, st.st_ino)}
        with os.scandir(d) as it:
            entries = list(it)
        if any(e.name == ".dvcignore" for e in entries):
            more = ignore_patterns(d / ".dvcignore")
            if more is None:
                unsure.append(d / ".dvcignore")
            else:
                pats = [*pats, *more]
        for e in entries:
            is_dir = e.is_dir()  # follows symbolic links, as the fingerprint always did
            if (e.name in _SKIPPED_DIRS) if is_dir else (e.name == ".git"):
                continue
            if any(fnmatch.fnmatchcase(e.name, g) and (is_dir or not dir_only) for g, dir_only in pats):
                continue
            if is_dir:
                walk(Path(e.path), f"{rel}{e.name}/", pats, above)
            else:
                files.append((rel + e.name, Path(e.path)))

    walk(top, "", patterns, frozenset())
    return sorted(files), unsure


def _cache_dirs(root: Path) -> list[Path]:
    """DVC's cache directories for the repository at ``root``: ``cache.dir`` if configured, the default."""
    dirs = []
    for name in ("config.local", "config"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(root / ".dvc" / name, encoding="utf-8")
            configured = parser.get("cache", "dir", fallback=None)
        except (configparser.Error, UnicodeDecodeError):
            configured = None
        if configured:
            dirs.append(root / ".dvc" / configured.strip().strip("'\""))
    return [*dirs, root / ".dvc" / "cache"]


def recorded_listing(out: DvcOut) -> dict[str, str] | None:
    """relpath -> md5 as DVC recorded the directory ``out``: its ``.dir`` object in DVC's cache, if there
    and intact (it must hash to its name); None otherwise."""
    root = dvc_root(out.path)
    if root is None or not out.value.endswith(".dir"):
        return None
    h = out.value
    for obj in _cache_paths(root, h):
        try:
            blob = obj.read_bytes()
            listing = json.loads(blob)
        except (OSError, ValueError):
            continue
        if hashlib.md5(blob, usedforsecurity=False).hexdigest() + ".dir" != h or not isinstance(listing, list):
            continue
        if all(isinstance(e, dict) and isinstance(e.get("relpath"), str) and isinstance(e.get("md5"), str)
               for e in listing):
            return {e["relpath"]: e["md5"] for e in listing}
    return None


def _cache_paths(root: Path, md5: str) -> list[Path]:
    """Where DVC's caches of the repository at ``root`` keep the object ``md5`` (DVC 3's layout, then DVC 2's)."""
    return [obj for cache in _cache_dirs(root) for obj in (cache / "files" / "md5" / md5[:2] / md5[2:],
                                                           cache / md5[:2] / md5[2:])]


def cache_object(out: DvcOut, md5: str) -> Path | None:
    """The file in DVC's cache that holds object ``md5`` of ``out``'s repository, if one does."""
    root = dvc_root(out.path)
    return next((p for p in _cache_paths(root, md5) if p.is_file()), None) if root is not None else None


def shown_path(path: Path, project_root: Path) -> str:
    """``path`` relative to the project where it lies inside, else as it is."""
    return path.relative_to(project_root).as_posix() if path.is_relative_to(project_root) else str(path)


def shown_paths(paths: list[Path], project_root: Path, limit: int = 5) -> str:
    """The first ``limit`` of ``paths`` as shown_path gives them, and how many more."""
    shown = [shown_path(p, project_root) for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


def _differences(out: DvcOut, now: dict[str, str], value: str, hashes: FileHashes, project_root: Path) -> str:
    """Which files differ from the record, as precisely as can be known here."""
    if not out.value.endswith(".dir"):
        return f"its content hashes to {value}, DVC recorded {out.value}"
    recorded = recorded_listing(out)
    if recorded is not None:
        groups = {"changed": sorted(r for r in now if r in recorded and recorded[r] != now[r]),
                  "added": sorted(set(now) - set(recorded)), "removed": sorted(set(recorded) - set(now))}
        return "; ".join(f"{label}: {shown_paths([out.path / r for r in rels], project_root)}"
                         for label, rels in groups.items() if rels)
    known = sorted(p for p in hashes.changed if out.path in p.parents)
    if known:
        return f"changed since mcx last hashed them: {shown_paths(known, project_root)}"
    # No listing to compare with: name the files written after the record was (what an edit leaves behind).
    since = out.record.stat().st_mtime_ns
    newer = sorted(out.path / r for r in now if (out.path / r).stat().st_mtime_ns > since)
    if newer:
        return (f"it hashes to {value}, DVC recorded {out.value}; modified after {shown_path(out.record, project_root)} "
                f"was written: {shown_paths(newer, project_root)}")
    return (f"it hashes to {value}, DVC recorded {out.value}; which files differ is unknown here, as DVC's cache "
            f"holds no listing of {out.value} (`dvc fetch {shown_path(out.record, project_root)}` brings it)")


def check_output(out: DvcOut, hashes: FileHashes, *, key: str, shown: str, project_root: Path,
                 warnings: list[str]) -> str:
    """Compare the workspace's ``out`` with its record by content: what ``info.verified`` says.

    Raises DataError, naming the files that differ and the fix, when they differ.
    """
    if out.hash_name not in ("md5", "md5-dos2unix"):
        warnings.append(f"{key}: {out.record} records a {out.hash_name} for {out.path}; not verified against the "
                        "workspace")
        return f"not verified ({out.hash_name})"
    unsure: list[Path] = []
    patterns: list[Pattern] = []
    for f in dvcignore_files(dvc_root(out.path) or out.path, out.path):
        found = ignore_patterns(f)
        if found is None:
            unsure.append(f)
        else:
            patterns += found
    try:
        if out.path.is_dir():
            files, inside = workspace_files(out.path, patterns)
            unsure += inside
            now = {rel: hashes.hash(p, "md5") for rel, p in files}
            hashes.forget_under(out.path, {str(p) for _, p in files})
            value = tree_md5(list(now.items()))
        else:
            now = {}
            value = hashes.hash(out.path, "md5")
    except OSError as exc:
        raise DataError(f"{key} = {shown!r}: cannot read {exc.filename} ({exc.strerror})",
                        "fix the file's permissions or restore it with `dvc checkout`.") from None
    if value == out.value:
        return "content matches the DVC record"
    where, record = shown_path(out.path, project_root), shown_path(out.record, project_root)
    if out.hash_name != "md5" or unsure:
        why = (f"{', '.join(map(str, unsure))} (patterns mcx does not apply)" if unsure
               else "DVC 2's md5-dos2unix (text files hashed with CRLF as LF)")
        warnings.append(f"{key}: {where} hashes to {value}, not the {out.value} of {record}, possibly because of "
                        f"{why}; run `dvc status` to be sure")
        return "not verified (" + (".dvcignore" if unsure else out.hash_name) + ")"
    raise DataError(f"{key} = {shown!r}: {where} changed since DVC recorded it in {record} "
                    f"({_differences(out, now, value, hashes, project_root)});",
                    f"record the new version with `dvc add {where}` (or `dvc commit {record}`), "
                    f"or restore the recorded one, discarding these edits, with `dvc checkout --force {record}`.")
