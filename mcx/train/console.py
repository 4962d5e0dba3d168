"""What the worker shows while it trains (job.json "output"), on rank 0 only.

* ``bar``: one live line on stderr (rich): step/total, loss, tokens/s per GPU, MFU, ETA.
* ``json``: every metrics record as one JSON line on stdout (for `mcx run --json` and tooling).
* ``quiet``: nothing.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.progress import TaskID


class Progress(Protocol):
    def start(self, total: int, done: int, label: str) -> None: ...
    def record(self, record: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


class QuietProgress:
    def start(self, total: int, done: int, label: str) -> None:
        pass

    def record(self, record: dict[str, Any]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class JsonProgress(QuietProgress):
    def record(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        sys.stdout.write(json.dumps(clean, sort_keys=True) + "\n")
        sys.stdout.flush()


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


class BarProgress:
    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), transient=False, refresh_per_second=4,
        )
        self._task: TaskID | None = None

    def start(self, total: int, done: int, label: str) -> None:
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=done, stats="")

    def record(self, record: dict[str, Any]) -> None:
        if self._task is None:
            return
        if record.get("kind") == "train":
            mfu = record.get("mfu")
            stats = (f"loss {_fmt(record.get('loss'), '.4f')}  {_fmt(record.get('tokens_per_s_per_gpu'), ',.0f')} tok/s/gpu"
                     f"  MFU {'n/a' if mfu is None else format(100 * mfu, '.1f') + '%'}")
            self._progress.update(self._task, completed=record["step"], stats=stats)
        else:
            self._progress.console.print(f"{record['kind']} step {record['step']}: loss {_fmt(record.get('loss'), '.4f')}"
                                         f"  ppl {_fmt(record.get('ppl'), '.2f')}")

    def note(self, text: str) -> None:
        self._progress.console.print(text)

    def close(self) -> None:
        self._progress.stop()


def make_progress(output: str, enabled: bool) -> Progress:
    if not enabled or output == "quiet":
        return QuietProgress()
    if output == "json":
        return JsonProgress()
    return BarProgress()
