"""DVC's content hash of a directory, computed without running DVC.

DVC 3 (dvc-data ``Tree.digest``) hashes a directory as the md5 of the JSON list
``[{"md5": <md5 of file>, "relpath": "<posix path>"}, ...]`` sorted by ``relpath`` and serialized by
``json.dumps(..., sort_keys=True)``, plus the suffix ``.dir``; file md5s are over the raw bytes.
Empty directories do not count. tests/test_data.py checks this against ``dvc add`` itself.

Not followed: ``.dvcignore`` rules other than the project's own (``.mcx-tmp-*``, the temporary
directories of :mod:`mcx.data.prepare`) and the directories DVC always skips (``.git``, ``.hg``,
``.dvc``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from attrs import frozen

from mcx.errors import DataError

# The temporary directories mcx.data.prepare writes beside a dataset (and removes); keep in sync
# with the project's .dvcignore, which hides them from DVC.
TMP_PREFIX = ".mcx-tmp-"
_SKIPPED_DIRS = frozenset({".git", ".hg", ".dvc"})


@frozen
class DirHash:
    md5: str  # e.g. "3a1f...e9.dir", as in a .dvc file's outs[0].md5
    nfiles: int
    size: int


@frozen
class DvcCheck:
    """A directory compared with the hash its ``.dvc`` file records."""

    path: Path
    dvc_file: Path
    expected: DirHash
    actual: DirHash

    @property
    def matches(self) -> bool:
        return self.expected.md5 == self.actual.md5


def file_md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def directory_md5(directory: Path) -> DirHash:
    """DVC's ``md5`` of ``directory`` (see the module docstring)."""
    entries = []
    size = 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith(TMP_PREFIX)]
        for name in files:
            if name.startswith(TMP_PREFIX):
                continue
            path = Path(root) / name
            entries.append({"md5": file_md5(path), "relpath": path.relative_to(directory).as_posix()})
            size += path.stat().st_size
    return DirHash(md5=tree_md5([(e["relpath"], e["md5"]) for e in entries]), nfiles=len(entries), size=size)


def tree_md5(files: list[tuple[str, str]]) -> str:
    """DVC's ``md5`` of a directory from its files' (posix relative path, md5) pairs."""
    entries = sorted(({"md5": md5, "relpath": rel} for rel, md5 in files), key=lambda e: e["relpath"])
    blob = json.dumps(entries, sort_keys=True).encode("utf-8")
    return hashlib.md5(blob, usedforsecurity=False).hexdigest() + ".dir"


def read_dvc_file(dvc_file: Path) -> tuple[Path, DirHash]:
    """The tracked directory (absolute) and the hash a single-output ``.dvc`` file records."""
    from dvc.utils.serialize import load_yaml  # lazily: dvc is the track extra

    if not dvc_file.is_file():
        raise DataError(f"{dvc_file} does not exist.", "restore it from git (`git checkout -- data.dvc`).")
    try:
        data = load_yaml(str(dvc_file))
        (out,) = data["outs"]
        expected = DirHash(md5=out["md5"], nfiles=out["nfiles"], size=out["size"])
        tracked = dvc_file.parent / out["path"]
    except Exception as exc:  # a hand-edited .dvc file can fail in any of these lookups
        raise DataError(f"{dvc_file} is not a .dvc file of one tracked directory ({exc!r}).", "restore it from git.") from None
    return tracked, expected


def verify_against_dvc(project_root: Path, dvc_file: str = "data.dvc") -> DvcCheck:
    """Compare the directory ``dvc_file`` tracks (``data/``) with the hash it records."""
    root = Path(project_root)
    tracked, expected = read_dvc_file(root / dvc_file)
    if not tracked.is_dir():
        raise DataError(
            f"{tracked} does not exist.", "rebuild it with `mcx data prepare` (no source: the quickstart) or fetch it with `dvc pull`."
        )
    return DvcCheck(path=tracked, dvc_file=root / dvc_file, expected=expected, actual=directory_md5(tracked))
