"""What `mcx locate` (and `mcx reproduce --locate`) prints on stdout: the first differing operation, its
class and the fix to try (mcx.report.located); across layouts, the layer-by-layer verdict and the tensors
compared (mcx.report.parted). ``--json`` prints the result's ``to_dict()``."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mcx.report.located import Located
from mcx.report.parted import LayoutsLocated


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


def render_any(res: Located | LayoutsLocated) -> RenderableType:
    return render_layouts(res) if isinstance(res, LayoutsLocated) else render_located(res)


def render_layouts(res: LayoutsLocated) -> RenderableType:
    title = Text(f"locate {res.run_a} vs {res.run_b} across layouts: ", style="bold")
    title.append(res.summary(), style="bold red" if res.differs else "bold green")
    grid = Table.grid(padding=(0, 2))
    for key, value in [("layouts", f"{res.layouts[0]}  vs  {res.layouts[1]}"), ("step", str(res.step)),
                       ("start", res.start), ("band", res.band), *[("replay", r) for r in res.replays]]:
        grid.add_row(key, Text(value))
    table = Table(show_edge=False, pad_edge=False)
    for col in ("tensor", "layer", "max abs", "band", "noise", ""):
        table.add_column(col, justify="right" if col in ("layer", "max abs", "band", "noise") else "left")
    for c in res.checks:
        mark = Text("ok", style="green") if c.within else Text("OUT", style="bold red")
        name = c.name + ("" if c.what == "output" else " (after the step)")
        layer = "-" if c.layer is None else str(c.layer)
        table.add_row(name, layer, f"{c.max_abs:.3g}", f"{c.band:.3g}", f"{c.noise:.3g}", mark)
    return Group(title, grid, table)
