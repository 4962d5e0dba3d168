"""Terminal views of recorded runs (`mcx ls`, `mcx show`)."""

from __future__ import annotations

import time
from typing import Any


def _num(v: Any, f: str = ".4f") -> str:
    return format(v, f) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


RUN_COLUMNS = ("run_id", "name", "status", "created", "stages", "train_loss", "valid_loss", "tokens_per_s_per_gpu",
               "tracking")


def render_runs(rows: list[dict[str, Any]], plain: bool = False) -> Any:
    """`mcx ls`: a rich table on a terminal; ``plain``: tab-separated text, a header line (RUN_COLUMNS) then
    one run a line, for `cut -f1`, `awk -F'\t'` and spreadsheets (tabs and newlines in values become spaces)."""
    cells = []
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])) if r.get("created") else "-"
        stages = " ".join(f"{k}:{(v or {}).get('status', '?')}" for k, v in (r.get("stages") or {}).items())
        final = r.get("final") or {}
        tracking = r.get("tracking") or {}
        cells.append([r.get("run_id", "?"), str(r.get("name") or "-"), str(r.get("status") or "-"), created, stages or "-",
                      _num(final.get("train_loss")), _num(final.get("valid_loss")),
                      _num(final.get("tokens_per_s_per_gpu"), ".0f"), str(tracking.get("state", tracking.get("target", "")))])
    if plain:
        return "".join("\t".join(" ".join(c.split()) or "-" for c in line) + "\n" for line in [list(RUN_COLUMNS), *cells])
    from rich.table import Table

    t = Table(title=f"{len(rows)} runs", title_justify="left")
    for col in ("run ID", "name", "status", "created", "stages", "train loss", "valid loss", "tokens/s/GPU", "tracking"):
        # Words are never split ("finish/ed"): the name and the stages wrap at spaces, the rest stays whole.
        t.add_column(col, no_wrap=col not in ("name", "stages"))
    for line in cells:
        t.add_row(*line)
    return t


def render_run(rec: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    for key in ("run_id", "name", "status", "state", "source"):
        if rec.get(key) is not None:
            head.add_row(key, str(rec[key]))
    stages = Table(title="stages", title_justify="left")
    for col in ("stage", "status", "passed", "steps", "train loss", "valid loss", "test ppl", "MFU"):
        stages.add_column(col)
    for name, st in (rec.get("stages") or {}).items():
        st = st or {}
        f = st.get("final") or {}
        mfu = f.get("mfu")
        stages.add_row(name, str(st.get("status")), str(st.get("passed")), str(st.get("steps")), _num(f.get("train_loss")),
                       _num(f.get("valid_loss")), _num(f.get("test_ppl"), ".2f"),
                       f"{mfu:.1%}" if isinstance(mfu, (int, float)) else "unknown")
    tags = Table(title="fingerprint", title_justify="left")
    tags.add_column("tag")
    tags.add_column("value", overflow="fold")
    for k, v in sorted((rec.get("tags") or {}).items()):
        tags.add_row(k, str(v))
    return Group(head, stages, tags)
