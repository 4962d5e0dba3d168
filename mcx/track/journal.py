"""The spool: an append-only journal of tracking operations, written before anything is sent.

Every record mcx makes (open a run, params, tags, an artifact, final metrics, a status) is first
appended to ``track/journal.jsonl`` (one JSON object a line, fsynced) and only then sent; the
sequence number of the last operation MLflow acknowledged is kept in ``track/acked.json``. Sending
therefore never blocks on the server, a crash loses nothing, and ``mcx sync`` replays exactly the
unacknowledged tail. Operations are idempotent (runs are found by identity tags before being
created, params and tags are set to fixed values, artifacts overwrite the same path, metrics carry
fixed timestamps), so replaying one that was applied but not yet acknowledged is harmless.

Per-step metrics are not journaled: a stage's metrics.jsonl is already a durable log, and its
cursor (``<stage>/tracked.json``) plays the role of ``acked.json`` for it (mcx.track.forward).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.track.paths import read_json, write_json_atomic

JOURNAL = "journal.jsonl"
ACKED = "acked.json"


class Journal:
    """The operations of one run directory's ``track/`` folder."""

    def __init__(self, track_dir: Path) -> None:
        self.dir = Path(track_dir)
        self.path = self.dir / JOURNAL
        self._ack_path = self.dir / ACKED
        self._lock = threading.Lock()

    def ops(self) -> list[dict[str, Any]]:
        """Every complete operation, in order (a torn last line from a crash is skipped)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        for line in data.splitlines():
            try:
                op = json.loads(line)
            except ValueError:
                continue
            if isinstance(op, dict) and isinstance(op.get("seq"), int):
                out.append(op)
        return out

    def append(self, op: dict[str, Any]) -> int:
        """Append ``op`` durably; returns its sequence number."""
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            ops = self.ops()
            seq = (ops[-1]["seq"] + 1) if ops else 1
            line = json.dumps({**op, "seq": seq}, sort_keys=True, allow_nan=False) + "\n"
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                if os.fstat(fd).st_size and not _ends_with_newline(fd):
                    line = "\n" + line  # a torn line from a crash stays a line of its own
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            return seq

    def acked(self) -> int:
        data = read_json(self._ack_path, {})
        return int(data.get("seq", 0)) if isinstance(data, dict) else 0

    def ack(self, seq: int) -> None:
        write_json_atomic(self._ack_path, {"seq": seq})

    def reset(self) -> None:
        """Forget what was acknowledged (the run now records to a different store)."""
        write_json_atomic(self._ack_path, {"seq": 0})

    def pending(self) -> list[dict[str, Any]]:
        done = self.acked()
        return [op for op in self.ops() if op["seq"] > done]


def _ends_with_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return os.pread(fd, 1, size - 1) == b"\n"


@frozen
class FlushResult:
    """What one send attempt did: ``sent`` operations, ``pending`` left, and why it stopped early."""

    sent: int
    pending: int
    error: str | None = None
    transient: bool = False  # the error means "unreachable now", not "refused"
    busy: bool = False  # another process was sending this run's records
