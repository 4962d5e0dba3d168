"""Content hashes of data files, kept by ``stat`` so that an unchanged file is not read again.

DVC's rule (its state database): a file's hash is kept under the key (inode, mtime_ns, size). While
the key is unchanged the kept hash is used; a file whose key changed is read and hashed again.
``mcx run --verify-data`` and ``mcx reproduce`` pass ``full=True``: every file is read (the kept
hashes are only written), which is the only way to see a change that kept inode, mtime and size
(a write followed by ``os.utime`` back).

The file: ``<project>/.mcx/file-hashes.json``, ``{"format": FORMAT, "version": 1, "files":
{absolute path: [inode, mtime_ns, size, {"md5" | "sha256": hex, "max:<dtype>": int}]}}``, replaced
atomically. ``max:<dtype>`` is the largest value of the file read as ``<dtype>`` integers: a prepared
dataset's largest token id (``largest``), kept beside the hashes so it too is read once per version. One that
is not exactly that (torn, hand-edited, another program's) is ignored as a whole and rebuilt. It is
written only into an existing ``.mcx/``: a project mcx never ran in gets nothing from ``mcx plan``
or from a refused command (they write nothing), and pays a full hash until its first run.

Racy files (git's rule): a file modified less than ``RACY_NS`` before it was hashed could be
written again within the same timestamp tick (2 s on FAT, 1 s on some network filesystems) without
its key changing, so its hash is used once and not kept. Neither is a file that changed while it
was read. Within one process, a hash computed by that process is reused while the key holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from mcx.jsonfile import write_bytes_atomic
from mcx.track.paths import state_dir

FORMAT = "mcx file hashes"
VERSION = 1
CACHE_FILE = "file-hashes.json"
RACY_NS = 2_000_000_000
_ALGOS = {"md5": lambda: hashlib.md5(usedforsecurity=False), "sha256": hashlib.sha256}
_HEX_LEN = {"md5": 32, "sha256": 64}


def cache_path(project_root: Path) -> Path:
    return state_dir(project_root) / CACHE_FILE


_INT_DTYPES = frozenset({"uint8", "int8", "int16", "uint16", "int32", "int64"})  # what a .idx may name


def _valid_field(name: str, value: Any) -> bool:
    if name.startswith("max:"):
        return name[4:] in _INT_DTYPES and type(value) is int
    return (name in _HEX_LEN and isinstance(value, str) and len(value) == _HEX_LEN[name]
            and value.strip("0123456789abcdef") == "")


def _valid(entry: Any) -> bool:
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[3], dict) and entry[3]):
        return False
    if not all(type(x) is int and x >= 0 for x in entry[:3]):
        return False
    return all(isinstance(name, str) and _valid_field(name, value) for name, value in entry[3].items())


def _largest(path: Path, dtype: str) -> int | None:
    """The largest ``dtype`` integer in the file (None: empty), read in chunks by NumPy."""
    import numpy as np

    chunk = 1 << 24  # 16 MiB: a multiple of every item size
    best: int | None = None
    with open(path, "rb") as f:
        while block := f.read(chunk):
            values = np.frombuffer(block, dtype=dtype, count=len(block) // np.dtype(dtype).itemsize)
            if values.size:
                top = int(values.max())
                best = top if best is None else max(best, top)
    return best


def load(path: Path) -> dict[str, list[Any]]:
    """The kept entries; empty when the file is missing or is not one this module wrote."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("version") == VERSION
            and isinstance(data.get("files"), dict)):
        return {}
    files: dict[str, list[Any]] = data["files"]
    if not all(isinstance(k, str) and os.path.isabs(k) and _valid(v) for k, v in files.items()):
        return {}
    return files


class FileHashes:
    """One command's view of the kept hashes: ``hash`` a file, then ``save`` once."""

    def __init__(self, path: Path | None, *, full: bool = False) -> None:
        self.path = path  # None: nothing is kept (no project)
        self.full = full
        self._kept = load(path) if path is not None else {}
        self._fresh: dict[str, list[Any]] = {}  # hashed by this process
        self._dirty = False
        self.files = self.read = self.bytes_read = 0
        self.changed: list[Path] = []  # files whose content differs from the hash kept for their path

    @classmethod
    def for_project(cls, project_root: Path, *, full: bool = False) -> FileHashes:
        return cls(cache_path(project_root), full=full)

    def stats(self) -> dict[str, int]:
        return {"files": self.files, "read": self.read, "bytes_read": self.bytes_read}

    def _known(self, name: str, key: list[int], field: str) -> Any:
        for entries in (self._fresh, {} if self.full else self._kept):
            entry = entries.get(name)
            if entry is not None and entry[:3] == key and field in entry[3]:
                return entry[3][field]
        return None

    def _keep(self, name: str, key: list[int], field: str, value: Any, started: int, after: os.stat_result) -> None:
        """Keep ``field`` of the file's version ``key``, beside what is kept of that same version."""
        old = self._fresh.get(name) or self._kept.get(name)
        same = old[3] if old is not None and old[:3] == key and old[3].get(field) in (None, value) else {}
        entry = [*key, {**same, field: value}]
        if [after.st_ino, after.st_mtime_ns, after.st_size] != key:
            return  # written to while read: neither kept nor reused
        self._fresh[name] = entry
        if started - key[1] > RACY_NS:
            self._kept[name] = entry
            self._dirty = True

    def hash(self, path: Path, algo: str) -> str:
        """``algo`` ("md5" or "sha256") of the file's bytes, read only when its key is not known."""
        name = str(path)
        st = os.stat(path)
        key = [st.st_ino, st.st_mtime_ns, st.st_size]
        self.files += 1
        known = self._known(name, key, algo)
        if known is not None:
            return str(known)
        started = time.time_ns()
        with open(path, "rb") as f:
            value = hashlib.file_digest(f, _ALGOS[algo]).hexdigest()
            after = os.fstat(f.fileno())
        self.read += 1
        self.bytes_read += st.st_size
        old = self._fresh.get(name) or self._kept.get(name)
        if old is not None and old[3].get(algo) not in (None, value):
            self.changed.append(path)
        self._keep(name, key, algo, value, started, after)
        return value

    def largest(self, path: Path, dtype: str) -> int | None:
        """The largest value of the file read as ``dtype`` integers (a dataset's largest token id; None:
        empty), read only when not kept for the file's version."""
        if dtype not in _INT_DTYPES:
            raise ValueError(f"{dtype} is not an integer dtype of a Megatron index")
        name, field = str(path), f"max:{dtype}"
        st = os.stat(path)
        key = [st.st_ino, st.st_mtime_ns, st.st_size]
        known = self._known(name, key, field)
        if known is not None:
            return int(known)
        started = time.time_ns()
        value = _largest(path, dtype)
        self.read += 1
        self.bytes_read += st.st_size
        if value is not None:
            self._keep(name, key, field, value, started, os.stat(path))
        return value

    def forget_under(self, top: Path, seen: set[str]) -> None:
        """Drop kept entries for files under ``top`` that a walk of it no longer found."""
        prefix = str(top).rstrip(os.sep) + os.sep
        gone = [k for k in self._kept if k.startswith(prefix) and k not in seen]
        for k in gone:
            del self._kept[k]
        self._dirty |= bool(gone)

    def save(self) -> None:
        """Replace the file atomically, if anything changed and ``.mcx/`` exists; a failure only costs speed."""
        if not self._dirty or self.path is None or not self.path.parent.is_dir():
            return
        body = {"format": FORMAT, "version": VERSION, "files": self._kept}
        try:  # concurrent runs each replace it whole; the last one's entries stay (a lost one costs a read)
            write_bytes_atomic(self.path, json.dumps(body, separators=(",", ":")).encode("utf-8"))
        except OSError:
            return
        self._dirty = False
