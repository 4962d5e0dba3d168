"""SIGTERM read as Ctrl-C: the user's way to stop a long command (`mcx run`, `reproduce`, `sweep`).

A `kill PID` from a terminal means what Ctrl-C means: stop, keep what was done, exit 130 (docs/cli.md).
Left at its default, SIGTERM would end the process at once, its run lock and run.json left as they were.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def term_interrupts() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread: the command ends as on
    Ctrl-C (its workers, where it has some, save a checkpoint and stop). Installed whatever the process
    inherited (a command started in the background gets SIGINT ignored), as `mcx run` forwards them to its
    workers (mcx.launch.process). Main thread only; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
