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

from attrs import frozen


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

    def mark(self, target: str, reason: str, waited_s: float) -> Outage:
        with self._lock:
            outage = self._down.get(target) or Outage(target, reason, round(waited_s, 1), time.time())
            self._down[target] = outage
            return outage

    def clear(self, target: str) -> None:
        with self._lock:
            self._down.pop(target, None)
