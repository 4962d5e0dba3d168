"""metrics.jsonl: one JSON object a line, appended and flushed as it happens (rank 0 writes).

Line kinds (docs/stage-directory.md): ``train`` per optimizer step, ``valid`` per evaluation, ``test``
at the end. A resumed worker first truncates lines past its checkpoint's step, so the file is always
the exact history of the surviving timeline; floats are written with ``repr`` precision, so losses
read back bit for bit (the smoke stage's resume check compares against them).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TextIO

from mcx.metrics.curves import parse_records



def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as null (the divergence guard reports them separately)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record, read by the one JSON-lines reader (mcx.metrics.curves): a torn last line
    (a crash mid-write) is skipped, a damaged line elsewhere is an InputError naming it."""
    if not path.is_file():
        return []
    return parse_records(path.read_bytes(), str(path))[0]


class MetricsFile:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self._f: TextIO | None = None

    def truncate_after(self, step: int, *, final: bool) -> None:
        """Keep only records up to ``step`` (atomically rewritten). With ``final`` (the checkpoint is
        the stage's last step), evaluations at that step go too: they ran after the checkpoint."""
        if not self.enabled:
            return

        def keep(r: dict[str, Any]) -> bool:
            s = int(r.get("step", 0))
            return s < step or (s == step and not (final and r.get("kind") != "train"))

        kept = [r for r in read_records(self.path) if keep(r)]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for r in kept:
                f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def history(self, kind: str = "train") -> list[dict[str, Any]]:
        return [r for r in read_records(self.path) if r.get("kind") == kind]

    def append(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
