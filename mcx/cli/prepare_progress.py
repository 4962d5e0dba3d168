"""`mcx data prepare`'s progress on stderr: documents, tokens/s and the time left.

On a terminal one live rich line (as `mcx run`'s bar); elsewhere (a log, CI) one plain line each time a shard
finishes, so a long prepare leaves a readable trail.
"""

from __future__ import annotations

import sys
from typing import Any

from mcx.cli.output import is_terminal
from mcx.data.shard_work import PrepareProgress
from mcx.report.fmt import duration


def describe(event: PrepareProgress) -> str:
    rate = event.tokens_per_s
    resumed = f" ({event.shards_resumed} from before)" if event.shards_resumed else ""
    return (f"{event.shards_done}/{event.shards} shards{resumed}, {event.documents:,} documents, {event.tokens:,} tokens, "
            f"{'-' if rate is None else f'{rate:,.0f}'} tokens/s, ETA {'-' if event.eta_s is None else duration(event.eta_s)}")


class PrepareBar:
    """A ``progress`` for mcx.ops.data.prepare; ``close`` when it returns or fails."""

    def __init__(self) -> None:
        self._live: Any = None
        self._task: Any = None
        self._shards_done = -1
        if is_terminal(sys.stderr):
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._live = Progress(TextColumn("[bold]prepare"), BarColumn(bar_width=24), TextColumn("{task.fields[stats]}"),
                                  console=Console(stderr=True), transient=False, refresh_per_second=4)

    def __call__(self, event: PrepareProgress) -> None:
        if self._live is not None:
            if self._task is None:
                self._live.start()
                self._task = self._live.add_task("prepare", total=max(event.bytes_total, 1), stats="")
            self._live.update(self._task, completed=event.bytes_done, stats=describe(event))
        elif event.shards_done != self._shards_done:
            self._shards_done = event.shards_done
            sys.stderr.write(f"prepare: {describe(event)}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self._live is not None and self._task is not None:
            self._live.stop()
