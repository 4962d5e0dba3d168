"""How a line of a stage's files becomes MLflow metrics (mcx.track.forward sends them).

- ``metrics.jsonl`` (``TRAINING``): ``<kind>/<field>`` for every numeric field but ``step`` and
  ``time``; a line's identity is (kind, step).
- ``system.jsonl`` and ``system.<node>.jsonl`` (``SYSTEM``, written by mcx.train.system_metrics):
  ``system/<field>``, or ``system/node_<n>/<field>`` when the stage ran on several nodes, for every
  numeric field but ``time``, ``node``, ``nodes`` and ``step`` (MLflow's own system-metric names:
  ``system/gpu_0_utilization_percentage``, ``system/cpu_utilization_percentage``); a line's identity is
  its time in milliseconds (each file is one node's, appended in time order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from attrs import frozen

_NOT_METRICS = frozenset({"kind", "step", "time"})
_NOT_SYSTEM_METRICS = frozenset({"time", "node", "nodes", "step"})
_SYSTEM_NAME = re.compile(r"[A-Za-z0-9_]+")


def line_metrics(record: dict[str, Any]) -> list[tuple[str, float]]:
    """``(key, value)`` of one metrics.jsonl object: every numeric field but step and time."""
    kind = record.get("kind")
    if type(kind) is not str:
        return []
    out = []
    for name, value in record.items():
        if name in _NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out.append((f"{kind}/{name}", float(value)))
    out.sort()
    return out


def system_metrics(record: dict[str, Any]) -> list[tuple[str, float]]:
    """``(key, value)`` of one system.jsonl object: ``system/[node_<n>/]<field>`` for every numeric field
    but time, node, nodes and step."""
    node, nodes = record.get("node"), record.get("nodes")
    several = type(node) is int and type(nodes) is int and nodes > 1
    prefix = f"system/node_{node}/" if several else "system/"
    out = []
    for name, value in record.items():
        if (name in _NOT_SYSTEM_METRICS or isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not _SYSTEM_NAME.fullmatch(name)):
            continue
        out.append((prefix + name, float(value)))
    out.sort()
    return out


@frozen
class LineRule:
    """How one file's lines become metrics: ``identity(record, step, time_ms)`` is (name, order) or None (not
    a metrics line); a line is sent when its order is above its name's last sent order."""

    identity: Callable[[dict[str, Any], int, int], tuple[str, int] | None]
    metrics: Callable[[dict[str, Any]], list[tuple[str, float]]]


def _training_identity(record: dict[str, Any], step: int, time_ms: int) -> tuple[str, int] | None:
    kind, own = record.get("kind"), record.get("step")
    return (kind, own) if type(kind) is str and type(own) is int else None


def _system_identity(record: dict[str, Any], step: int, time_ms: int) -> tuple[str, int] | None:
    t = record.get("time")
    return ("time_ms", time_ms) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


TRAINING = LineRule(_training_identity, line_metrics)  # metrics.jsonl: (kind, step)
SYSTEM = LineRule(_system_identity, system_metrics)  # system*.jsonl: (file, time)
