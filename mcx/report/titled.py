"""Rich tables whose title stays one line.

Rich wraps a table's title to the table's width, so a title wider than a narrow table (``mcx gc: would
remove 3 items (--dry-run: ...)`` over a two-column table) broke into a column of words, on a terminal and
in a pipe alike, against docs/cli.md ("nothing is wrapped"). A title here is never wrapped: on a terminal
narrower than the title the terminal folds it, as it does any long line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text


def titled_table(title: str | Text, *, style: str = "", **table: Any) -> Table:
    """``rich.table.Table`` with ``title`` left-justified on one line (``style``: the title's style)."""
    from rich.table import Table
    from rich.text import Text

    text = title.copy() if isinstance(title, Text) else Text(title)
    if style:
        text.stylize(style)
    text.no_wrap, text.overflow = True, "ignore"
    return Table(title=text, title_justify="left", **table)
