"""The errors mcx.track raises: subclasses of the one root in mcx.errors.

They live here while only mcx.track raises them; each carries what the CLI needs to say what
happened and what to do next.
"""

from __future__ import annotations

from mcx.errors import EnvironmentProblem, McxError
from mcx.track.holder import LockHolder


class RunLocked(McxError):
    """Another ``mcx run`` holds this run ID's lock and is training it now: the one error for a busy
    run ID, whether the lock refused it (``runcache.acquire``) or the run cache found it held
    (``runcache.lookup``'s "running"), so ``mcx run`` raises it as it is."""

    exit_code = 1

    def __init__(self, run_id: str, holder: LockHolder | None) -> None:
        self.run_id = run_id
        self.holder = holder
        who = holder.describe() if holder is not None else "another process"
        super().__init__(
            f"run {run_id} is training in {who}: it is running elsewhere, not in this process;",
            "wait for it (mcx run --wait), or look at it with `mcx show " + run_id + "`.",
        )


class TrackingUnavailable(EnvironmentProblem):
    """The tracking server cannot be reached for something that cannot wait (a query, a baseline)."""
