"""Who holds a run's lock: the record ``mcx.track.runcache`` keeps in the lock file, and what
``RunLocked`` (mcx.track.errors) names."""

from __future__ import annotations

import os
import socket
import time

from attrs import frozen


@frozen
class LockHolder:
    pid: int
    host: str
    started: float  # unix time the lock was taken

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, since {when}"

    @property
    def alive(self) -> bool | None:
        """Whether the holder process exists (None: it is on another host, so we cannot tell)."""
        if self.host != socket.gethostname():
            return None
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has ``pid`` (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
