"""Numbers and values as people read them, shared by every renderer (terminal, Markdown, HTML)."""

from __future__ import annotations

import json
import math
from typing import Any

from mcx.report.compare import ABSENT, MetricCell
from mcx.metrics.summary import Unit

DASH = "—"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def value(unit: Unit, x: float | None) -> str:
    """One metric value in its unit; a dash when the run has none."""
    if x is None:
        return DASH
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+inf" if x > 0 else "-inf")
    if unit == "loss":
        return f"{x:.4f}"
    if unit == "ppl":
        return f"{x:,.2f}"
    if unit == "ratio":
        return f"{x:.1%}"
    if unit == "rate":
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    if unit == "tflops":
        return f"{x:,.1f}"
    if unit == "seconds":
        return f"{x * 1000:.1f} ms" if abs(x) < 1 else f"{x:.2f} s"
    if unit == "bytes":
        return f"{x / 2**30:.2f} GiB" if abs(x) >= 2**30 else f"{x / 2**20:.1f} MiB"
    if unit == "duration":
        return duration(x)
    if unit == "gpu_hours":
        return f"{x:,.1f}" if abs(x) >= 100 else (f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}")
    return f"{x:.6g}"


def delta(unit: Unit, cell: MetricCell) -> str:
    """The change against the baseline: relative when the baseline is a non-zero number."""
    if cell.delta_rel is not None:
        return f"{cell.delta_rel:+.2%}"
    if cell.delta is not None:
        d = value(unit, abs(cell.delta))
        return d if d == "NaN" else ("+" if cell.delta >= 0 else "-") + d
    if cell.regressed and cell.value is not None and math.isnan(cell.value):
        return "NaN"
    return ""


def verdict_word(cell: MetricCell) -> str:
    return "regressed" if cell.regressed else ("improved" if cell.improved else "")


def config_value(v: Any) -> str:
    """A spec or fingerprint value as TOML-ish text: true/false, strings bare, lists as JSON."""
    if v is ABSENT:
        return DASH
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"
