"""Bytes on disk as `mcx gc` counts them: regular files, each inode once, and what removing them frees.

A file with hard links elsewhere frees nothing until its last link goes (a DVC cache of type
``hardlink`` shares its inodes with the workspace), so each file is kept with its number of links.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

Inodes = dict[tuple[int, int], tuple[int, int, int]]  # (dev, ino) -> (size, hard links, links seen here)


def inodes(path: Path, skip: Path | None = None) -> Inodes:
    """The regular files at or under ``path`` (not under ``skip``), each inode once with its size, its
    number of hard links and how many of them are here."""
    out: Inodes = {}

    def add(p: str) -> None:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            out[key] = (st.st_size, st.st_nlink, out[key][2] + 1 if key in out else 1)

    if not path.is_dir() or path.is_symlink():
        if path.is_symlink() or path.exists():
            add(str(path))
        return out
    for dirpath, dirnames, filenames in os.walk(path):
        if skip is not None:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in filenames:
            try:
                add(os.path.join(dirpath, name))
            except FileNotFoundError:  # gone meanwhile (a pruned checkpoint)
                pass
    return out


def total(files: Inodes) -> int:
    return sum(size for size, _, _ in files.values())


def freed_bytes(groups: Iterable[Inodes]) -> int:
    """Bytes freed by removing every file of ``groups``: an inode counts once all its links go."""
    links: dict[tuple[int, int], list[int]] = {}
    for files in groups:
        for key, (size, nlink, here) in files.items():
            links.setdefault(key, [size, nlink, 0])[2] += here
    return sum(size for size, nlink, seen in links.values() if seen >= nlink)
