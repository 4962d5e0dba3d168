"""Rendering off a terminal: plain text, whole lines (docs/cli.md, "Not a terminal").

The CLI's console on a pipe or a file and `mcx compare --format table -o FILE` render alike: no colour,
no wrapping, no cutting (a table row is one line however long; COLUMNS does not change that).
"""

from __future__ import annotations

import io
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

UNWRAPPED = 1 << 16  # columns of a console that is not a terminal: wide enough never to wrap a line


def plain_console(stream: IO[str]) -> Console:
    """A rich console writing plain, unwrapped text to ``stream``."""
    from rich.console import Console

    return Console(file=stream, width=UNWRAPPED, color_system=None, highlight=False, soft_wrap=False,
                   emoji=False, force_terminal=False)


def plain_text(renderable: RenderableType) -> str:
    """``renderable`` as a plain console prints it to a pipe (trailing spaces of padded cells removed)."""
    buffer = io.StringIO()
    plain_console(buffer).print(renderable)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
