"""Terminal view of `mcx gc`: what it removed (or would), the bytes freed, and what stays and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from mcx.report.titled import titled_table


def size_text(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (1536 -> "1.5 KiB")."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _where(path: Path, project: Path) -> str:
    try:
        return str(path.relative_to(project))
    except ValueError:
        return str(path)


def render_gc(result: Any, project: Path) -> Any:
    """``result`` is mcx.ops.gc.GcResult: one row per removal, the kept items grouped by kind and reason."""
    from rich.console import Group

    verb = "would remove" if result.dry_run else "removed"
    gone = titled_table(f"mcx gc: {verb} {len(result.removed)} item{'s' * (len(result.removed) != 1)}"
                        + (" (--dry-run: nothing was removed)" if result.dry_run else ""))
    for col in ("path", "kind", "size", "why"):
        gone.add_column(col, overflow="fold", no_wrap=col in ("kind", "size"),
                        justify="right" if col == "size" else "left")
    for item in result.removed:
        gone.add_row(_where(item.path, project), item.kind, size_text(item.size), item.why)
    groups: dict[tuple[str, str], list[Any]] = {}
    for item in result.kept:
        groups.setdefault((item.kind, item.why), []).append(item)
    kept = titled_table("kept")
    for col in ("kind", "items", "size", "why"):
        kept.add_column(col, overflow="fold", no_wrap=col != "why",
                        justify="right" if col in ("items", "size") else "left")
    for (kind, why), items in groups.items():
        kept.add_row(kind, str(len(items)), size_text(sum(i.size for i in items)), why)
    total = (f"{'would free' if result.dry_run else 'freed'} {size_text(result.freed_bytes)} "
             f"({result.freed_bytes} bytes); .mcx/ {size_text(result.state_bytes_before)} -> "
             f"{size_text(result.state_bytes_after)}")
    return Group(gone, total, kept)
