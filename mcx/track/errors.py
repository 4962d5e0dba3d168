"""The errors mcx.track raises: subclasses of the one root in mcx.errors.

They live here while only mcx.track raises them; each carries what the CLI needs to say what
happened and what to do next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcx.errors import EnvironmentProblem, McxError

if TYPE_CHECKING:
    from mcx.track.runcache import LockHolder


class RunLocked(McxError):
    """Another ``mcx run`` holds this run ID's lock and is training it now."""

    exit_code = 1

    def __init__(self, run_id: str, holder: LockHolder | None) -> None:
        self.run_id = run_id
        self.holder = holder
        who = holder.describe() if holder is not None else "another process"
        super().__init__(
            f"run {run_id} is running elsewhere ({who})",
            "wait for it (mcx run --wait), or watch it with `mcx show " + run_id + "`.",
        )


class TrackingUnavailable(EnvironmentProblem):
    """The tracking server cannot be reached for something that cannot wait (a query, a baseline)."""
