"""Each rank's own files under STAGE_DIR/ranks/: its step times, its pid and host, its stacks on demand.

Every rank (not only rank 0) appends one line a step to ``rank<R>.jsonl``: the step and the wall seconds
this rank spent in it, as the loop measures them (no collective, no device sync beyond the loop's own).
A resumed rank cuts its file back to the checkpoint's step, as metrics.jsonl is. The node's watchdog
(mcx.launch.watchdog) reads these files as heartbeats, and ``mcx show`` names the slowest rank from them
(mcx.metrics.ranks). ``rank<R>.json`` holds the rank's pid and host; SIGUSR2 makes faulthandler write every
thread's Python stack to ``stacks.rank<R>.txt`` (the watchdog's fallback where py-spy cannot attach).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import time
from pathlib import Path
from typing import IO

from mcx.contract.files import RANKS_DIR, rank_info_file, rank_stacks_file, rank_steps_file
from mcx.jsonfile import write_json_atomic
from mcx.train.metrics import MetricsFile

STACKS_SIGNAL = signal.SIGUSR2


class RankFiles:
    """One rank's step-time file and stack dump, open while the rank trains."""

    def __init__(self, stage_dir: Path, rank: int, local_rank: int) -> None:
        self.dir = stage_dir / RANKS_DIR
        self.dir.mkdir(exist_ok=True)
        self.steps = MetricsFile(self.dir / rank_steps_file(rank), enabled=True)
        write_json_atomic(self.dir / rank_info_file(rank), {"rank": rank, "local_rank": local_rank, "pid": os.getpid(),
                                                            "host": socket.gethostname()})
        self._stacks: IO[str] | None = open(self.dir / rank_stacks_file(rank), "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(STACKS_SIGNAL, file=self._stacks, all_threads=True)

    def truncate_after(self, step: int) -> None:
        self.steps.truncate_after(step, final=False)

    def step(self, step: int, step_time: float) -> None:
        self.steps.append({"kind": "train", "step": step, "step_time_s": step_time, "time": time.time()})

    def close(self) -> None:
        self.steps.close()
        if self._stacks is not None:
            faulthandler.unregister(STACKS_SIGNAL)
            self._stacks.close()
            self._stacks = None

