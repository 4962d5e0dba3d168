"""Reading the hashes DVC already wrote (``.dvc`` files, ``dvc.lock``) without importing dvc.

Where a path's record can be:

- ``<p>.dvc`` next to the path itself or next to any ancestor ``p`` up to the DVC repository root
  (``data.dvc`` at the root tracks ``data/``, so it covers ``data/quickstart``);
- the ``outs`` of a stage in a ``dvc.lock`` in the path's directory or any directory above it up to the
  repository root (paths relative to the ``dvc.yaml`` directory and the stage's ``wdir``).

Not found here: ``.dvc`` files named differently from their output (``dvc add --file``) and stages
whose ``wdir`` is templated; those datasets are hashed by content instead (with a warning).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import DataError, EnvironmentProblem


@frozen
class DvcOut:
    """One output as DVC recorded it."""

    path: Path  # absolute, normalised path of the tracked output
    hash_name: str  # "md5"; "md5-dos2unix" for DVC 2.x records; "etag"/"checksum" for external outs
    value: str  # the hash; "<md5>.dir" for a directory
    size: int | None
    nfiles: int | None
    record: Path  # the .dvc or dvc.lock file it came from
    stage: str | None  # the dvc.lock stage, None for a .dvc file


def norm(path: Path) -> Path:
    """Absolute and lexically normalised (no symlink resolution: DVC records paths as written)."""
    return Path(os.path.normpath(os.path.abspath(path)))


def dvc_root(path: Path) -> Path | None:
    """The innermost directory at or above ``path`` that holds a ``.dvc/`` directory."""
    for d in (path, *path.parents):
        if (d / ".dvc").is_dir():
            return d
    return None


def _load_yaml(path: Path) -> Any:
    try:
        import yaml  # PyYAML (a dvc dependency); imported only when a DVC record exists
    except ImportError:
        raise EnvironmentProblem(f"reading the DVC record {path} needs PyYAML, which is not installed",
                                 "install it: pip install 'pyyaml>=6' (it comes with mcx[track]).") from None

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (safe loader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot parse DVC record {path}: {exc.__class__.__name__}",
                        "fix or regenerate it (`dvc add` / `dvc repro`).") from None


def _out(raw: Any, base: Path, record: Path, stage: str | None) -> DvcOut | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        return None
    if "md5" in raw:
        # DVC 3 writes `hash: md5`; a record without it is DVC 2.x, whose md5 is md5-dos2unix.
        hash_name, value = str(raw.get("hash", "md5-dos2unix")), raw["md5"]
    else:
        key = next((k for k in ("etag", "checksum") if k in raw), None)
        if key is None:
            return None
        hash_name, value = key, raw[key]
    size, nfiles = raw.get("size"), raw.get("nfiles")
    return DvcOut(path=norm(base / raw["path"]), hash_name=hash_name, value=str(value),
                  size=size if isinstance(size, int) else None,
                  nfiles=nfiles if isinstance(nfiles, int) else None, record=record, stage=stage)


def _dvc_file_outs(dvc_file: Path) -> Iterator[DvcOut]:
    data = _load_yaml(dvc_file)
    if not isinstance(data, dict):
        return
    base = dvc_file.parent / str(data.get("wdir", "."))
    for raw in data.get("outs") or ():
        if (out := _out(raw, base, dvc_file, None)) is not None:
            yield out


def _stage_wdirs(dvc_yaml: Path) -> dict[str, str]:
    if not dvc_yaml.is_file():
        return {}
    stages = (_load_yaml(dvc_yaml) or {}).get("stages") or {}
    return {name: s["wdir"] for name, s in stages.items()
            if isinstance(s, dict) and isinstance(s.get("wdir"), str) and "${" not in s["wdir"]}


def _lock_outs(lock: Path) -> Iterator[DvcOut]:
    data = _load_yaml(lock)
    if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
        return
    wdirs = _stage_wdirs(lock.with_name("dvc.yaml"))
    for name, stage in data["stages"].items():
        if not isinstance(stage, dict):
            continue
        base = lock.parent / wdirs.get(name.split("@")[0], ".")
        for raw in stage.get("outs") or ():
            if (out := _out(raw, base, lock, name)) is not None:
                yield out


def find_out(path: Path) -> DvcOut | None:
    """The DVC output that is ``path`` or contains it; None when DVC does not track it.

    The innermost record wins (a ``.dvc`` file for ``data/quickstart`` over ``data.dvc``).
    """
    path = norm(path)
    root = dvc_root(path)
    if root is None:
        return None
    chain = [d for d in (path, *path.parents) if d.is_relative_to(root)]  # path .. root
    for anc in chain:
        if anc == root:
            break
        dvc_file = anc.with_name(anc.name + ".dvc")
        if dvc_file.is_file():
            for out in _dvc_file_outs(dvc_file):
                if out.path == anc:
                    return out
    for d in chain[1:]:
        lock = d / "dvc.lock"
        if lock.is_file():
            matches = [o for o in _lock_outs(lock) if path == o.path or path.is_relative_to(o.path)]
            if matches:
                return max(matches, key=lambda o: len(o.path.parts))
    return None


def has_patterns(dvcignore: Path) -> bool:
    """Does a ``.dvcignore`` hold any pattern? (``dvc init`` writes one with comments only.)"""
    try:
        lines = dvcignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return any(ln.strip() and not ln.lstrip().startswith("#") for ln in lines)


def dvcignore_files(root: Path, out_path: Path) -> list[Path]:
    """``.dvcignore`` files with patterns in ``out_path``'s ancestors up to ``root`` (inclusive).

    The ones inside the output are found by the walk that checks the output's size.
    """
    dirs = [d for d in out_path.parents if d.is_relative_to(root)]
    return [d / ".dvcignore" for d in dirs if (d / ".dvcignore").is_file() and has_patterns(d / ".dvcignore")]
