"""Which tracking stores one command found unreachable, so that it waits on a down server once (D50).

A send that fails because the store cannot be reached (mcx.track.target.is_transient) marks the store
down in the command's ``Outages``; every later send of that command to the same store is skipped and
its records stay spooled for ``mcx sync``, instead of each record waiting out its own timeout. Only the
forwarder's polls during training probe a store marked down (it may come back while the worker
trains); a success clears the mark.
"""

from __future__ import annotations

import threading
import time

from typing import TYPE_CHECKING

from attrs import frozen

if TYPE_CHECKING:
    from mcx.track.target import Target


@frozen
class Outage:
    """A store found unreachable: what failed, when, and how long the failed request waited."""

    target: str  # Target.name: "embedded" or the server URI
    reason: str  # one line, mcx.track.target.outage_reason
    waited_s: float
    since: float


class Outages:
    """The stores one command (an ``mcx sync``, one run's recorder) found down; shared by its threads."""

    def __init__(self) -> None:
        self._down: dict[str, Outage] = {}
        self._lock = threading.Lock()

    def get(self, target: str) -> Outage | None:
        with self._lock:
            return self._down.get(target)

    def mark(self, target: Target, reason: str, waited_s: float) -> Outage | None:
        """Mark a server down. The embedded store is never marked: its failures are a moment's lock by
        another process writing (a sweep's parallel trials), over as soon as that write is."""
        if target.embedded:
            return None
        with self._lock:
            outage = self._down.get(target.name) or Outage(target.name, reason, round(waited_s, 1), time.time())
            self._down[target.name] = outage
            return outage

    def clear(self, target: str) -> None:
        with self._lock:
            self._down.pop(target, None)
