"""Each rank's step times (STAGE_DIR/ranks/rank<R>.jsonl) and the slowest rank, when it is an outlier.

A rank's time is the median of its last ``WINDOW`` step times. The slowest rank is an outlier when its time
exceeds the median of the other ranks' times by more than ``OUTLIER_RATIO`` (10 %) and ``OUTLIER_MIN_S``
(a few milliseconds of jitter are no straggler). Only the tail of each file is read, so a long stage on many
ranks costs a few kilobytes a rank. `mcx show` prints the outlier; `mcx status` calls ``slowest_rank``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection
from pathlib import Path

from attrs import frozen

from mcx.contract.files import RANKS_DIR
from mcx.metrics.curves import tail_records

WINDOW = 100  # the last steps a rank's time is the median of
OUTLIER_RATIO = 1.10  # the slowest rank's time over the median of the others'
OUTLIER_MIN_S = 0.005  # ... and at least this much slower
_TAIL_BYTES = 128 * WINDOW  # a step line is about 90 bytes
_RANK_FILE = re.compile(r"rank([0-9]+)\.jsonl\Z")


@frozen
class RankTime:
    """One rank: the median of its last steps' times (seconds), over how many steps, up to which step."""

    rank: int
    median_s: float
    steps: int
    last_step: int


@frozen
class SlowestRank:
    """The slowest rank of a stage against the median of the others (``others_s``); ``outlier`` as defined
    above. ``ranks``: how many ranks recorded step times."""

    rank: int
    median_s: float
    others_s: float
    ranks: int
    last_step: int

    @property
    def ratio(self) -> float:
        return self.median_s / self.others_s if self.others_s > 0 else float("inf")

    @property
    def outlier(self) -> bool:
        return self.ratio > OUTLIER_RATIO and self.median_s - self.others_s > OUTLIER_MIN_S

    def describe(self) -> str:
        """One line, e.g. "rank 3: 1.42 s a step, 31% slower than the median of the other 7 ranks (1.08 s)"."""
        return (f"rank {self.rank}: {self.median_s:.3g} s a step, {self.ratio - 1:.0%} slower than the median of the "
                f"other {self.ranks - 1} ranks ({self.others_s:.3g} s), over the last steps to step {self.last_step}")

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"rank": self.rank, "median_s": self.median_s, "others_s": self.others_s, "ranks": self.ranks,
                "last_step": self.last_step, "ratio": self.ratio, "outlier": self.outlier}


def rank_times(stage_dir: Path, ranks: Collection[int] | None = None) -> list[RankTime]:
    """Every rank's time in ``stage_dir`` (``ranks``: only theirs), rank order; [] before any finished a step."""
    out = []
    folder = Path(stage_dir) / RANKS_DIR
    paths = folder.iterdir() if folder.is_dir() else iter(())
    for path in paths:
        m = _RANK_FILE.match(path.name)
        if not m or (ranks is not None and int(m.group(1)) not in ranks):
            continue
        rows = [r for r in tail_records(path, _TAIL_BYTES) if isinstance(r.get("step_time_s"), (int, float))]
        times = [float(r["step_time_s"]) for r in rows[-WINDOW:]]
        if times:
            last = rows[-1].get("step")
            out.append(RankTime(rank=int(m.group(1)), median_s=statistics.median(times), steps=len(times),
                                last_step=last if isinstance(last, int) else 0))
    return sorted(out, key=lambda r: r.rank)


def slowest_rank(stage_dir: Path) -> SlowestRank | None:
    """The slowest rank of the stage in ``stage_dir`` against the others (None with fewer than two ranks'
    times); ``.outlier`` says whether it is one."""
    times = rank_times(stage_dir)
    if len(times) < 2:
        return None
    slow = max(times, key=lambda r: (r.median_s, -r.rank))
    others = statistics.median(r.median_s for r in times if r is not slow)
    return SlowestRank(rank=slow.rank, median_s=slow.median_s, others_s=others, ranks=len(times),
                       last_step=max(r.last_step for r in times))
