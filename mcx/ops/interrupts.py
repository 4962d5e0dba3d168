"""SIGTERM read as Ctrl-C: the user's way to stop a long command (`mcx run`, `reproduce`, `sweep`).

A `kill PID` from a terminal means what Ctrl-C means: stop, keep what was done, exit 130 (docs/cli.md).
Left at its default, SIGTERM would end the process at once, its run lock and run.json left as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mcx.launch.process import on_stop_signals


@contextmanager
def term_interrupts() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread: the command ends as on
    Ctrl-C (its workers, where it has some, save a checkpoint and stop). Installed whatever the process
    inherited (a command started in the background gets SIGINT ignored), as `mcx run` forwards them to its
    workers (mcx.launch.process). Main thread only; elsewhere this does nothing."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with on_stop_signals(interrupt):
        yield
