"""A stage's batch hashes (STAGE_DIR/ranks/batches.dp<D>.jsonl, written by mcx.train.batch_hash), and the
first (step, micro-batch, data-parallel rank) where two stages' batches differ.

Two runs trained on the same batches in the same order have the same hashes at every step, whatever their
numbers did; the first hash that differs is where the data order changed (a resume that read on from the
wrong sample, a mixture read differently, micro-batches in another order), and every number after it
compares different inputs. A stage without the files (recorded before D69) has no batch check: None.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.contract.files import RANKS_DIR
from mcx.metrics.curves import parse_records

_BATCH_FILE = re.compile(r"batches\.dp([0-9]+)\.jsonl\Z")

# dp rank -> step -> the step's micro-batch digests, in the order trained
StageBatches = dict[int, dict[int, tuple[str, ...]]]


def read_batches(stage_dir: Path) -> StageBatches:
    """Every data-parallel rank's batch hashes in ``stage_dir``; {} when none were recorded."""
    out: StageBatches = {}
    folder = Path(stage_dir) / RANKS_DIR
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        m = _BATCH_FILE.match(path.name)
        if not m:
            continue
        steps: dict[int, tuple[str, ...]] = {}
        for r in parse_records(path.read_bytes(), str(path))[0]:
            step, digests = r.get("step"), r.get("batches")
            if type(step) is int and isinstance(digests, list):
                steps[step] = tuple(str(d) for d in digests)
        out[int(m.group(1))] = steps
    return out


@frozen
class BatchDifference:
    """The first micro-batch the two stages trained differently: its step, index in the step and DP rank, and
    each side's digest (None: that side trained fewer micro-batches in the step)."""

    step: int
    micro_batch: int
    dp_rank: int
    original: str | None
    other: str | None

    def describe(self) -> str:
        return (f"batches differ first at step {self.step}, micro-batch {self.micro_batch}, data-parallel rank "
                f"{self.dp_rank}: the data order changed; the numbers from there on are not comparable")


@frozen
class BatchCheck:
    """Two stages' batch hashes, step by step over the steps both recorded: the same everywhere
    (``first`` None), or the first difference; ``note`` says why they could not be compared at all."""

    steps: int  # steps compared
    dp_ranks: int
    first: BatchDifference | None = None
    note: str | None = None

    @property
    def same(self) -> bool:
        return self.first is None and self.note is None

    def describe(self) -> str:
        if self.note is not None:
            return f"batches not compared: {self.note}"
        if self.first is not None:
            return self.first.describe()
        ranks = f" on each of {self.dp_ranks} data-parallel ranks" if self.dp_ranks > 1 else ""
        return f"same batches at every step ({self.steps} steps{ranks})"

    def to_dict(self) -> dict[str, Any]:
        f = self.first
        return {"same": self.same, "steps": self.steps, "dp_ranks": self.dp_ranks, "text": self.describe(),
                "note": self.note,
                "first_difference": None if f is None else {
                    "step": f.step, "micro_batch": f.micro_batch, "dp_rank": f.dp_rank, "original": f.original,
                    "other": f.other}}


def compare_batches(original: StageBatches, other: StageBatches) -> BatchCheck | None:
    """Where ``other``'s batches first depart from ``original``'s: the lowest step, then micro-batch, then DP
    rank; None when either side recorded none."""
    if not original or not other:
        return None
    if set(original) != set(other):
        return BatchCheck(steps=0, dp_ranks=len(original),
                          note=f"the runs read their data over {len(original)} and {len(other)} data-parallel ranks")
    common = sorted(set.intersection(*(set(steps) for side in (original, other) for steps in side.values())))
    for step in common:
        found = []
        for rank in sorted(original):
            a, b = original[rank][step], other[rank][step]
            if a == b:
                continue
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            found.append(BatchDifference(step, i, rank, a[i] if i < len(a) else None, b[i] if i < len(b) else None))
        if found:
            first = min(found, key=lambda d: (d.micro_batch, d.dp_rank))
            return BatchCheck(steps=len(common), dp_ranks=len(original), first=first)
    return BatchCheck(steps=len(common), dp_ranks=len(original))
