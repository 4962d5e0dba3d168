"""What `mcx locate` (and `mcx reproduce --locate`) prints on stdout: the first differing operation, its
class and the fix to try (mcx.report.located); ``--json`` prints ``Located.to_dict()``."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mcx.report.located import Located


def render_located(res: Located) -> RenderableType:
    title = Text(f"locate {res.run_a} vs {res.run_b}: ", style="bold")
    title.append(res.first.said() if res.first else "no difference",
                 style="bold red" if res.first else "bold green")
    rows: list[tuple[str, str]] = [("step", str(res.step) if res.step is not None else "- (nothing replayed)")]
    if res.first is not None:
        f = res.first
        rows += [("class", str(res.kind)), ("because", res.cause), ("fix to try", res.fix),
                 ("record", f.key), ("sum", f"{f.sum[0]!r} vs {f.sum[1]!r}"), ("norm", f"{f.norm[0]!r} vs {f.norm[1]!r}")]
    else:
        rows.append(("because", res.cause))
    rows.append(("records compared", str(res.records)))
    rows += [("replay", r) for r in res.replays]
    grid = Table.grid(padding=(0, 2))
    for key, value in rows:
        grid.add_row(key, Text(value))
    return Group(title, grid)
