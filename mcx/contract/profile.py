"""`mcx run --profile STEPS`: the full-stage steps the worker runs under torch.profiler (D73).

Profiling changes how a run is observed, not what it computes, so it rides in the job file beside the
progress display (``Job.output``) and never reaches the spec, the config hash or the run ID. The
worker writes each rank's trace and host-side op table under STAGE_DIR/profile/ (mcx.contract.files).
"""

from __future__ import annotations

import re

from attrs import frozen

from mcx.errors import InputError

_STEPS = re.compile(r"^\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?$")


@frozen
class ProfileSteps:
    """Steps ``first`` to ``last`` of the full stage, both included, counted from 1 as metrics.jsonl counts them."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def text(self) -> str:
        """As `--profile` takes it: ``5`` or ``5:8``."""
        return str(self.first) if self.first == self.last else f"{self.first}:{self.last}"


def parse_profile_steps(text: str) -> ProfileSteps:
    """``N`` (step N alone) or ``A:B`` (steps A to B, both included); anything else is an InputError."""
    found = _STEPS.match(text)
    first, last = (int(found.group(1)), int(found.group(2) or found.group(1))) if found else (0, 0)
    if not found or first < 1 or last < first:
        raise InputError(f"--profile {text!r} is not a step range;",
                         "give a step (--profile 3) or an inclusive range of steps counted from 1 "
                         "(--profile 5:8 profiles steps 5, 6, 7 and 8).")
    return ProfileSteps(first, last)


def check_profile_steps(steps: ProfileSteps, train_iters: int, *, full_stage: bool) -> None:
    """The range against the full stage it profiles: every step must be one the stage trains."""
    if not full_stage:
        raise InputError(f"--profile {steps.text()} profiles steps of the full stage, which this command does not run;",
                         "drop --stage smoke, or drop --profile.")
    if steps.last > train_iters:
        raise InputError(f"--profile {steps.text()} reaches past the full stage's last step (train.train_iters = "
                         f"{train_iters});", f"profile steps between 1 and {train_iters}, e.g. --profile "
                                             f"{min(3, train_iters)}:{min(5, train_iters)}.")
