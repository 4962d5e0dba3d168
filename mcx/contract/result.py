"""The stage result: the worker's result.json as one typed record, and the exit code of each status.

The worker writes the file (``mcx.train.result_writer.make_result``; docs/stage-directory.md);
``StageResult.from_json`` reads it and ``to_json`` gives the same object back, keys mcx does not read
(``versions``...) kept verbatim in ``extra``. ``control_checks`` is the control plane's own addition
(the smoke stage's memory prediction): never in the worker's file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from mcx.contract.files import RESULT_FILE
from mcx.contract.status import Status, parse_status

# Status -> exit code of ``python -m mcx.train`` (also recorded as ``exit_code``; mcx.train.result_writer says why).
EXIT_CODES = {Status.FINISHED: 0, Status.PREEMPTED: 0, Status.FAILED: 1, Status.DIVERGED: 1}

# result.json's keys, in the order the worker writes them; the rest go to ``extra``.
KEYS = ("status", "passed", "checks", "final", "error", "steps", "layer_spec", "exit_code", "details",
        "out_of_memory", "warnings", "control_checks")


@frozen(kw_only=True)
class StageResult:
    """How a stage ended. ``passed`` and ``status`` are None where the file does not say (a worker
    that wrote another shape); a missing ``passed`` is not a failure, a false one is."""

    status: Status | None = None  # the worker's (WORKER_STATUSES), or interrupted | pruned as run_stage ends it
    passed: bool | None = None
    checks: dict[str, Any] = field(factory=dict)  # name -> {"passed": bool, "detail": str, ...}
    final: dict[str, Any] = field(factory=dict)  # summary metrics (mcx.metrics.summary)
    error: str | None = None
    steps: int | None = None
    layer_spec: str | None = None
    exit_code: int | None = None  # the worker's: 2 is bad input where it ran
    details: dict[str, Any] = field(factory=dict)
    out_of_memory: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    control_checks: dict[str, Any] = field(factory=dict)
    extra: dict[str, Any] = field(factory=dict)

    @property
    def ok(self) -> bool:
        """Finished and not failed by a check: the stage need not run again."""
        return self.status == Status.FINISHED and self.passed is not False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageResult:
        get = data.get
        status = parse_status(get("status"))
        # a status mcx does not know stays in extra, so that to_json gives the file back as written
        unknown = {"status": get("status")} if status is None and get("status") is not None else {}
        return cls(status=status, passed=bool(get("passed")) if "passed" in data else None,
                   checks=dict(get("checks") or {}), final=dict(get("final") or {}), error=get("error"),
                   steps=get("steps"), layer_spec=get("layer_spec"), exit_code=get("exit_code"),
                   details=dict(get("details") or {}), out_of_memory=get("out_of_memory"),
                   warnings=tuple(get("warnings") or ()), control_checks=dict(get("control_checks") or {}),
                   extra={**{k: v for k, v in data.items() if k not in KEYS}, **unknown})

    def to_json(self) -> dict[str, Any]:
        """result.json's object: what from_json read (a worker's file comes back key for key)."""
        out = {key: getattr(self, key) for key in KEYS if key != "control_checks" or self.control_checks}
        return {**out, "warnings": list(self.warnings), **self.extra}


def read_stage_result(stage_dir: Path) -> StageResult | None:
    """The stage's result.json, or None when the worker wrote none (or none that parses)."""
    data = read_result(stage_dir)
    return None if data is None else StageResult.from_json(data)


def read_result(stage_dir: Path) -> dict[str, Any] | None:
    """The worker's ``result.json`` as written, or None when it wrote none (or none that parses)."""
    try:
        data = json.loads((stage_dir / RESULT_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def clear_result(stage_dir: Path) -> None:
    """Remove a ``result.json`` left by an earlier attempt, so it is never taken for this one's."""
    (stage_dir / RESULT_FILE).unlink(missing_ok=True)
