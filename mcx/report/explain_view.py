"""`mcx explain` on a terminal or a pipe: a headline, then one table per component that differs."""

from __future__ import annotations

import json
from typing import Any

from mcx.fingerprint.diff import Explanation
from mcx.report.titled import titled_table


def _show(value: Any, kind: str, side: str) -> str:
    if (kind, side) in (("added", "a"), ("removed", "b")):
        return "(absent)"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a file's sha256: the table says that it changed; --json has it whole
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def render_explanation(expl: Explanation) -> Any:
    """A rich renderable: a headline, then one table per differing component."""
    from rich.console import Group
    from rich.text import Text

    if expl.same:
        return Text(f"{expl.run_a} and {expl.run_b}: same run ID, nothing differs.", style="green")
    names = ", ".join(d.component for d in expl.components)
    parts: list[Any] = [Text(f"{expl.run_a} -> {expl.run_b}: {names} differ", style="bold")]
    for d in expl.components:
        table = titled_table(f"{d.component}  {d.hash_a[:12]} -> {d.hash_b[:12]}")
        table.add_column("key", style="cyan", no_wrap=True)
        table.add_column(expl.run_a, overflow="fold")
        table.add_column(expl.run_b, overflow="fold")
        for c in d.changes:
            table.add_row(c.key, _show(c.a, c.kind, "a"), _show(c.b, c.kind, "b"))
        parts.append(table)
    return Group(*parts)
