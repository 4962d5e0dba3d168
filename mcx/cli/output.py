"""Where the CLI prints: results on stdout, progress and logs on stderr (as git and DVC do).

On a terminal the consoles are rich's (colour, tables fitted to the width). Anywhere else (a pipe,
a file, a test) nothing is wrapped, cut or coloured, so `mcx ... | grep` and `> out` see whole lines.
NO_COLOR is honoured by rich itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from mcx.report.plain import plain_console

if TYPE_CHECKING:
    from rich.console import Console

    from mcx.ops.progress import Event


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (results) or stderr (progress); plain and unwrapped off a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if is_terminal(stream):
        return Console(stderr=stderr, highlight=False, soft_wrap=False)
    return plain_console(stream)


@contextlib.contextmanager
def children_to_stderr() -> Iterator[None]:
    """While a command starts processes (workers, torchrun, git, dvc), file descriptor 1 is stderr, so
    only the result the CLI prints afterwards reaches stdout: `mcx run --json > out` holds one object."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptors 1 or 2 (a daemon): nothing to keep apart
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def show_progress(event: Event) -> None:
    """Render an op's progress event (mcx.ops.progress) on the stderr console, as it happens."""
    from mcx.ops.progress import Launched, PlanShown

    if isinstance(event, Launched):  # the stage header said it; `mcx run --detach` and `mcx status` show the job
        return
    if isinstance(event, PlanShown):
        from mcx.report.plan_view import render_plan

        console(stderr=True).print(render_plan(event.planned.shown, event.planned.run_id))
        return
    from mcx.report.notes_view import render_note

    console(stderr=True).print(render_note(event), soft_wrap=event.copyable)  # commands to copy: never wrapped
