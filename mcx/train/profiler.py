"""torch.profiler over the steps `mcx run --profile` names (the job's ``profile``; D73).

The profiler starts just before the first named step takes its micro-batches and stops after the last
step's metrics line, checkpoint and evaluation, so a step's whole host path is in it: the data, the
backend's forward/backward/optimizer, and mcx's own work around them. Each step is one ``mcx.step N``
range in the trace. Each rank writes its Chrome/Perfetto trace and a table of its ops by self CPU time
(``key_averages``) under STAGE_DIR/profile/. CPU activities always, CUDA's where the stage runs on the
GPU; stacks on (``with_stack``: which Python line launched each op), shapes off (they multiply the
table's rows and the trace's size). The profiler observes only: the losses are bitwise those of an
unprofiled run (tests/test_train.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from mcx.contract.files import PROFILE_DIR, profile_ops_file, profile_trace_file
from mcx.contract.profile import ProfileSteps

log = logging.getLogger("mcx.train")

TABLE_ROWS = 40  # the ops a table lists: the ones that add up to nearly all of a small model's host time


class StepProfiler:
    """``begin(step)`` before a step, ``end(step)`` after it; ``close()`` when the loop ends, however it ends
    (a stage stopped inside the range writes what it profiled). Does nothing when ``steps`` is None."""

    def __init__(self, steps: ProfileSteps | None, stage_dir: Path, *, rank: int, device: str, label: str) -> None:
        self.steps, self.rank, self.device, self.label = steps, rank, device, label
        self.out_dir = stage_dir / PROFILE_DIR
        self._prof: Any = None
        self._range: Any = None  # the current step's record_function
        self._done: list[int] = []
        self._wall = 0.0

    def begin(self, step: int) -> None:
        if self.steps is None or step not in self.steps:
            return
        import torch

        if self._prof is None:
            if self.steps.first != step:  # resumed inside the range: profile what is left of it
                log.info("profiling from step %d (the stage resumed after step %d)", step, self.steps.first)
            self._prof = torch.profiler.profile(activities=self._activities(torch), record_shapes=False,
                                                with_stack=True)
            self._prof.start()
            self._wall = time.perf_counter()
        self._range = torch.profiler.record_function(f"mcx.step {step}")
        self._range.__enter__()

    def end(self, step: int) -> None:
        if self._range is None:
            return
        self._range.__exit__(None, None, None)
        self._range = None
        self._done.append(step)
        if self.steps is not None and step >= self.steps.last:
            self._write()

    def missed(self) -> str | None:
        """What to tell the user when the profile named steps this stage never trained (it resumed past them)."""
        if self.steps is None or self._done:
            return None
        return (f"--profile {self.steps.text()}: no step was profiled, as this attempt of the stage trained none of "
                "them (it resumed from a checkpoint past them); `mcx run --force` trains the run again from step 1")

    def close(self) -> None:
        if self._range is not None:  # the step raised or stopped the stage: its range ends here
            self._range.__exit__(None, None, None)
            self._range = None
        if self._prof is not None:
            self._write()

    def _activities(self, torch: Any) -> list[Any]:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        return acts

    def _write(self) -> None:
        prof, self._prof = self._prof, None
        if self.device == "cuda":  # the kernels of the last step are in the trace only once they ran
            import torch

            torch.cuda.synchronize()
        prof.stop()
        wall = time.perf_counter() - self._wall
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / profile_trace_file(self.rank)
        prof.export_chrome_trace(str(trace))
        steps = f"{self._done[0]}-{self._done[-1]}" if len(self._done) > 1 else str(self._done[0]) if self._done else "none"
        sort = "self_cpu_time_total"
        head = (f"# {self.label}, rank {self.rank}, {self.device}: steps {steps} ({len(self._done)} profiled, "
                f"{wall:.3f} s wall with the profiler on)\n# ops by self CPU time (torch.profiler key_averages, "
                f"sorted by {sort}); the trace: {trace.name}\n")
        table = prof.key_averages().table(sort_by=sort, row_limit=TABLE_ROWS)
        (self.out_dir / profile_ops_file(self.rank)).write_text(head + table + "\n", encoding="utf-8")
        log.info("profile of steps %s written to %s", steps, self.out_dir)
