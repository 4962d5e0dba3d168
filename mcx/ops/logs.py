"""`mcx logs RUN_ID [-f] [--rank N] [--stage S]`: a run's worker log (every rank's lines, ``worker.log`` in each
stage directory), stage after stage; ``follow`` reads on as the workers write until the run is no longer active
(its supervisor gone and its job ended).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from attrs import frozen

from mcx.contract.files import LOG_FILE
from mcx.errors import InputError
from mcx.ops.status import STAGE_ORDER, run_status, status_of

FOLLOW_POLL_S = 1.0
_RANK = re.compile(r"\[rank (\d+)\]")


@frozen(kw_only=True)
class LogLine:
    stage: str
    rank: int | None  # the rank whose line it is (continuation lines, a traceback's, belong to the line before)
    text: str

    def to_dict(self) -> dict[str, object]:
        return {"stage": self.stage, "rank": self.rank, "line": self.text}


def run_logs(project: Path, run_id: str, *, stage: str | None = None, rank: int | None = None, follow: bool = False,
             poll_s: float = FOLLOW_POLL_S) -> Iterator[LogLine]:
    """The lines of ``run_id``'s worker logs (``stage``: that stage's only; ``rank``: that rank's only).
    RunIdError for an unknown run, InputError for a stage the run does not have, before any line."""
    (now,) = run_status(project, run_id)
    names = [s.stage for s in now.stages]
    if stage is not None and stage not in names:
        have = ", ".join(names) or "none"
        raise InputError(f"--stage {stage}: run {run_id} has no such stage (its stages: {have});",
                         f"use one of {', '.join(STAGE_ORDER)} that it planned.")
    if rank is not None and rank < 0:
        raise InputError(f"--rank {rank} is not a rank;", "ranks count from 0.")
    rdir = Path(now.run_dir)
    stages = [stage] if stage is not None else names
    for i, name in enumerate(stages):
        later = stages[i + 1:]
        yield from _lines(rdir / name, rank, follow=follow, poll_s=poll_s,
                          until=lambda: _stage_over(rdir, name, later))


def _stage_over(rdir: Path, stage: str, later: list[str]) -> bool:
    """Following ``stage`` ends once the run is no longer active, or a later stage was started."""
    now = status_of(rdir)
    if not now.active:
        return True
    if any(s.kind is not None for s in now.stages if s.stage in later):
        return True
    this = next((s for s in now.stages if s.stage == stage), None)
    return now.state == "stalled" and (this is None or this.queue not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                            "COMPLETING", "REQUEUED"))


def _lines(stage_path: Path, rank: int | None, *, follow: bool, poll_s: float,
           until: Callable[[], bool]) -> Iterator[LogLine]:
    path = stage_path / LOG_FILE
    offset, partial, current = 0, b"", None
    while True:
        over = follow and until()  # asked before the last read: lines written before the end are all shown
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        *whole, partial = (partial + data).split(b"\n")
        for raw in whole:
            text = raw.decode("utf-8", errors="replace")
            m = _RANK.search(text)
            if m:
                current = int(m.group(1))
            if rank is None or current == rank:
                yield LogLine(stage=stage_path.name, rank=current, text=text)
        if not follow or over:
            if partial:
                text = partial.decode("utf-8", errors="replace")
                if rank is None or current == rank:
                    yield LogLine(stage=stage_path.name, rank=current, text=text)
            return
        time.sleep(poll_s)
