"""Notes (mcx.ops.progress.Note: progress, and a run's notes) as Rich markup: the CLI prints them on stderr."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

STYLES = {"info": "", "warning": "yellow", "error": "red"}


def render_note(note: Any) -> str:
    """``[bold]lead[/] text`` in the note's colour; every word of it escaped (messages hold "[...]")."""
    text = (f"[bold]{escape(note.lead)}[/]" if note.lead else "") + escape(note.text)
    style = STYLES[note.level]
    return f"[{style}]{text}[/]" if style else text
