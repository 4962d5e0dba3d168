"""Checkpoint directories: atomic commit, checksums, the ``latest`` pointer, retention, resume lookup.

What goes *inside* a checkpoint is the backend's business (cpu.py: torch.save of plain state
dicts; gpu.py: Megatron-Core dist_checkpointing). This module owns the directory protocol that makes
a crash at any moment safe:

1. every rank writes into ``iter_NNNNNNN.tmp/`` (created empty by rank 0), then records the size and
   CRC-32 of the files it wrote (mcx/weights/checksums.py; asynchronous GPU saves: in the writer process);
2. once all ranks are done, rank 0 writes ``meta.json`` (step, consumed samples, layout, ...),
   merges the checksums into ``checksums.json`` (hashing what no rank recorded, ``meta.json`` among
   them), fsyncs both and the directory, and renames it to ``iter_NNNNNNN/``;
3. rank 0 writes ``latest.tmp`` naming it and ``os.replace``-s it onto ``latest``;
4. older complete checkpoints beyond ``checkpoint.keep`` (never a pinned one) are renamed to
   ``iter_NNNNNNN.retired/`` and deleted by a background thread, off the training path.

``latest`` therefore always names a complete checkpoint with checksums; leftover ``*.tmp`` directories
are partial and ``*.retired`` ones half-deleted: both are removed at the next start.

Loading (loop.py) checks the files against ``checksums.json`` first. A damaged checkpoint is renamed
to ``iter_NNNNNNN.damaged/`` (kept, never deleted: the user decides), then ``latest`` is pointed at the
newest intact one; a checkpoint ``latest`` names that is missing (deleted by hand, or set aside by a
resume stopped before it re-pointed ``latest``) is passed over the same way (D47). With none intact the
stage stops with exit 2 and nothing is moved. Checkpoints of format 1 (before checksums, D36) load
unchecked.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from mcx.errors import InputError
from mcx.jsonfile import write_json_atomic
from mcx.weights import checksums
from mcx.contract.checkpoints import DAMAGED, ITER, META, RETIRED, checkpoint_path, checkpoint_steps
from mcx.weights.checkpoint_files import LATEST, iter_name

log = logging.getLogger("mcx.train")

FORMAT = 2  # 2: with checksums.json
UNCHECKED_FORMAT = 1  # written before checkpoints carried checksums (D36): loaded with a warning
MISSING = "the directory is missing"  # check()'s problem for a checkpoint ``latest`` names that is not there


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)  # what is left is removed by clean_partial at the next start


class CheckpointStore:
    """The checkpoint directory of one stage. Methods that write are rank-0 only (the caller
    synchronises ranks around them); reads are safe everywhere."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root = root
        self.keep = keep
        self._deleting: list[threading.Thread] = []  # prune's background deletions

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present, ascending."""
        return checkpoint_steps(self.root)

    def path(self, step: int) -> Path:
        return checkpoint_path(self.root, step)

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names, or None when there is none yet. It may be missing or damaged
        (deleted by hand, set aside by a resume cut short): ``check`` says so, and the resume falls back."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        name = pointer.read_text(encoding="utf-8").strip()
        if not ITER.match(name):
            steps = self.steps()
            fix = (f"write the name of the checkpoint to resume from into it (the newest here: `echo {iter_name(steps[-1])} "
                   f"> {pointer}`), then run again." if steps else
                   f"no checkpoint is in {self.root}: delete {pointer} to train the stage from its first step.")
            raise InputError(f"{pointer} names {name!r}, which is not a checkpoint (iter_NNNNNNN);", fix)
        return self.root / name

    @staticmethod
    def read_meta(path: Path) -> dict[str, Any]:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        if meta.get("format") not in (UNCHECKED_FORMAT, FORMAT):
            raise InputError(f"{path} has checkpoint format {meta.get('format')!r}, this worker reads "
                             f"{UNCHECKED_FORMAT} and {FORMAT};", "resume it with the mcx version that wrote it.")
        return meta

    def candidates(self, latest: Path) -> list[Path]:
        """Where a resume may start, newest first: ``latest``, then the complete checkpoints before it."""
        match = ITER.match(latest.name)
        if match is None:  # latest() refuses a pointer to any other name
            raise ValueError(f"{latest} is not a checkpoint directory (iter_NNNNNNN)")
        step = int(match.group(1))
        return [latest, *(self.path(s) for s in reversed(self.steps()) if s < step)]

    @staticmethod
    def check(path: Path, rank: int = 0, size: int = 1) -> list[str] | None:
        """This rank's share of the problems of a checkpoint's files (checksums.verify); None for a
        checkpoint of format 1, which has no checksums to check."""
        if not path.is_dir():
            return [MISSING]
        if not (path / checksums.FILE).exists():
            try:
                if json.loads((path / META).read_text(encoding="utf-8")).get("format") == UNCHECKED_FORMAT:
                    return None
            except (OSError, ValueError) as exc:
                return [f"{META}: unreadable ({type(exc).__name__}: {exc}), and no {checksums.FILE}"]
            return [f"{checksums.FILE}: missing"]
        return checksums.verify(path, rank, size)[0]

    # -- writing (rank 0) --------------------------------------------------------------------------

    def clean_partial(self) -> None:
        """Remove leftovers of interrupted saves."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.name.endswith((".tmp", RETIRED)):
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def begin(self, step: int) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (iter_name(step) + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, meta: dict[str, Any], pinned: AbstractSet[int] = frozenset()) -> Path:
        step = int(meta["step"])
        write_json_atomic(tmp / META, {**meta, "format": FORMAT, "saved_at": time.time()}, allow_nan=True)
        sums = checksums.seal(tmp)
        _fsync_dir(tmp)
        final = self.path(step)
        log.info("checkpoint %s checksums: %d files, %.1f MiB; %d of them (%.1f MiB) hashed at the commit in %.2f s",
                 final.name, sums["files"], sums["bytes"] / 2**20, sums["hashed"], sums["hashed_bytes"] / 2**20,
                 sums["seconds"])
        if final.exists():  # an abandoned timeline's checkpoint of the same step
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self.point(final.name)
        self.prune(pinned | {step})
        return final

    def point(self, name: str) -> None:
        """Make ``latest`` name ``name`` (atomically)."""
        pointer = self.root / LATEST
        pointer_tmp = self.root / (LATEST + ".tmp")
        with open(pointer_tmp, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer_tmp, pointer)
        _fsync_dir(self.root)

    def set_aside(self, path: Path) -> Path:
        """Rename a damaged checkpoint out of the store (``iter_N.damaged``, then ``.damaged.2``, ...)."""
        target, n = path.with_name(path.name + DAMAGED), 1
        while target.exists():
            n += 1
            target = path.with_name(f"{path.name}{DAMAGED}.{n}")
        os.replace(path, target)
        _fsync_dir(self.root)
        return target

    def no_intact(self, damaged: dict[Path, list[str]]) -> InputError:
        """The error when every checkpoint a resume could start from is damaged (nothing is moved)."""
        said = "; ".join(f"{p.name} ({', '.join(problems)})" for p, problems in damaged.items())
        recorded = sorted(self.root.glob("iter_*.dvc"))  # `dvc add` of a stage's final checkpoint
        dvc = (f"restore {recorded[-1].stem} from DVC, which recorded it (`dvc pull --force {recorded[-1]}` in the "
               "project)" if recorded else
               "restore a copy from DVC, where mcx records each finished stage's final checkpoint "
               "(`dvc pull --force CHECKPOINT.dvc` in the project)")
        return InputError(f"no intact checkpoint to resume from in {self.root}: {said}. Nothing was deleted;",
                          f"{dvc}, then run again; or, to train the stage from its first step, move the directory "
                          f"aside (`mv {self.root} {self.root}.old`), keeping it to look into.")

    def prune(self, pinned: AbstractSet[int] = frozenset()) -> list[int]:
        """Retire complete checkpoints beyond the newest ``keep`` (pinned ones survive).

        Each is renamed out of the store at once (``iter_N.retired``, which ``steps`` never lists and
        ``clean_partial`` removes after a crash), then deleted by a background thread: deleting a
        checkpoint's files in the save's commit paused training (D32), and takes far longer on a parallel
        filesystem. ``settle`` waits for it.
        """
        steps = self.steps()
        keep = set(steps[-self.keep:]) | set(pinned)
        removed = [s for s in steps if s not in keep]
        retired = []
        for s in removed:
            target = self.root / (iter_name(s) + RETIRED)
            shutil.rmtree(target, ignore_errors=True)  # a retired namesake (a discarded timeline's)
            os.replace(self.path(s), target)
            retired.append(target)
        if retired:
            thread = threading.Thread(target=_delete, args=(retired,), name="mcx-checkpoint-prune", daemon=True)
            thread.start()
            self._deleting.append(thread)
        return removed

    def settle(self) -> None:
        """Wait until the retired checkpoints are deleted."""
        while self._deleting:
            self._deleting.pop().join()

    def discard_after(self, step: int) -> None:
        """Remove complete checkpoints newer than ``step`` (not on the surviving timeline)."""
        for s in self.steps():
            if s > step:
                shutil.rmtree(self.path(s))
