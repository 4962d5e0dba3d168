"""Checkpoint checksums: every file of a checkpoint with its size and CRC-32, recorded before the commit.

Each rank records the files it wrote right after writing them, in ``checksums.rank<N>.json`` of the
staging directory: the GPU backend's writer process does it after an asynchronous write, off the training
path (mcx/train/writer.py); synchronous saves do it on the training path. At the commit, rank 0 hashes what
no rank recorded (the small files written at finalization: Megatron-Core's metadata, ``meta.json``), merges
all into ``checksums.json`` and removes the part files; only then is the directory renamed into place
(mcx/train/checkpoint.py), so ``latest`` never names a checkpoint without checksums::

    {"algorithm": "crc32", "files": {"meta.json": {"size": 412, "crc32": "1c291ca3"}, "state.pt": {...}}}

CRC-32 (zlib) is there to detect damage (a truncated file, a flipped byte, a torn write), not tampering;
it was chosen over sha256 and blake2b for its speed on multi-GB files (measured: D36). Torch-free, so the
control plane checks a checkpoint where it uses one too (D48): ``mcx pull`` after fetching, ``export-hf``
and ``mcx run`` of an ``init.from = "run:..."`` child before reading it, and a child's plan by sizes alone.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FILE = "checksums.json"
ALGORITHM = "crc32"
CHUNK = 8 << 20  # bytes read per call: large enough that the per-call cost vanishes
_PART = re.compile(r"^checksums\.rank\d+\.json$")


def part_name(rank: int) -> str:
    return f"checksums.rank{rank}.json"


def file_sum(path: Path) -> dict[str, Any]:
    """Size and CRC-32 of one file (zlib releases the GIL, so other threads keep running)."""
    crc, size = 0, 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return {"size": size, ALGORITHM: f"{crc:08x}"}


def _write(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def record(directory: Path, rank: int, paths: Iterable[str | Path]) -> dict[str, float]:
    """Checksums of the files this rank wrote (paths inside ``directory``) into its part file."""
    t0 = time.perf_counter()
    files = {Path(p).resolve().relative_to(directory.resolve()).as_posix(): file_sum(Path(p)) for p in paths}
    _write(directory / part_name(rank), {"algorithm": ALGORITHM, "files": files})
    return {"files": len(files), "bytes": sum(f["size"] for f in files.values()), "seconds": time.perf_counter() - t0}


def seal(directory: Path) -> dict[str, float]:
    """Rank 0 at the commit: merge the ranks' part files, hash every file none of them recorded, write
    ``checksums.json`` and remove the part files. Returns what was recorded and what it hashed itself."""
    t0 = time.perf_counter()
    files: dict[str, dict[str, Any]] = {}
    parts = sorted(p for p in directory.iterdir() if _PART.match(p.name))
    for part in parts:
        files.update(json.loads(part.read_text(encoding="utf-8"))["files"])
    hashed = hashed_bytes = 0
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if not path.is_file() or path in parts or name == FILE:
            continue
        if name not in files or files[name]["size"] != path.stat().st_size:  # unrecorded (or recorded too early)
            files[name] = file_sum(path)
            hashed += 1
            hashed_bytes += files[name]["size"]
    _write(directory / FILE, {"algorithm": ALGORITHM, "files": files})
    for part in parts:
        part.unlink()
    return {"files": len(files), "bytes": sum(f["size"] for f in files.values()), "hashed": hashed,
            "hashed_bytes": hashed_bytes, "seconds": time.perf_counter() - t0}


def verify(directory: Path, rank: int = 0, size: int = 1, *, read: bool = True,
           missing: bool = True) -> tuple[list[str], int]:
    """What is wrong with this rank's share of the files ``checksums.json`` lists (every ``size``-th file,
    from the ``rank``-th; all of them for one rank), each problem naming the file, what was recorded and
    what is there; and the bytes read. Files the checkpoint gained after its commit are not its damage.
    ``read=False`` checks only that each file is there at its recorded size (a stat each, no weights read);
    ``missing=False`` leaves out files that are not there (a pull about to fetch them)."""
    try:
        manifest = json.loads((directory / FILE).read_text(encoding="utf-8"))
        files = sorted((str(n), {"size": int(w["size"]), ALGORITHM: str(w[ALGORITHM])})
                       for n, w in manifest["files"].items())
        if manifest.get("algorithm") != ALGORITHM:
            return [f"{FILE}: algorithm {manifest.get('algorithm')!r}, mcx checks {ALGORITHM}"], 0
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{FILE}: unreadable ({type(exc).__name__}: {exc})"], 0
    problems, bytes_read = [], 0
    for name, want in files[rank::size]:
        path = directory / name
        try:
            found = path.stat().st_size
        except FileNotFoundError:
            if missing:
                problems.append(f"{name}: missing, expected {want['size']} B")
            continue
        if found != want["size"]:
            problems.append(f"{name}: {found} B, expected {want['size']} B")
            continue
        if not read:
            continue
        got = file_sum(path)
        bytes_read += got["size"]
        if got[ALGORITHM] != want[ALGORITHM]:
            problems.append(f"{name}: {ALGORITHM} {got[ALGORITHM]}, expected {want[ALGORITHM]} at the recorded size "
                            f"of {found} B")
    return problems, bytes_read
