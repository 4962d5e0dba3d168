"""Numbers and values as people read them, shared by every renderer (terminal, Markdown, HTML)."""

from __future__ import annotations

import json
import math
from typing import Any

from mcx.metrics.summary import BY_KEY, Unit
from mcx.report.cells import ABSENT, MetricCell

DASH = "—"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def significant(x: float, digits: int = 3) -> str:
    """A small number with ``digits`` significant digits (0.0624, not 0.1 or 0.0), never exponent form."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


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
        return f"{x:.1%}" if abs(x) >= 0.01 or x == 0 else f"{significant(x * 100, 2)}%"
    if unit == "factor":
        return f"{x:.2f}x"
    if unit == "rate":
        return f"{x:,.0f}" if abs(x) >= 100 else significant(x)
    if unit == "tflops":
        return f"{x:,.1f}" if abs(x) >= 10 else significant(x)
    if unit == "seconds":
        if abs(x) >= 1:
            return f"{x:.2f} s"
        return f"{x * 1000:.1f} ms" if abs(x) >= 0.01 else f"{significant(x * 1000)} ms"
    if unit == "bytes":
        return f"{x / 2**30:.2f} GiB" if abs(x) >= 2**30 else f"{x / 2**20:.1f} MiB"
    if unit == "duration":
        return duration(x)
    if unit == "gpu_hours":
        return f"{x:,.1f}" if abs(x) >= 100 else (f"{x:.2f}" if abs(x) >= 1 else significant(x))
    return f"{x:.6g}"


def metric(key: str, x: Any) -> str:
    """A summary metric (mcx.metrics.summary's key, or an evaluation score: a plain number) as every surface prints
    it; a dash when absent."""
    number = float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
    return value(BY_KEY[key].unit if key in BY_KEY else "loss", number)  # a score: four decimals, as a loss


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


def noise(cell: MetricCell) -> str:
    """For a change within the step-to-step spread: what it was held to; else (and for no change) empty."""
    if not cell.within_noise or cell.noise is None or not cell.delta:
        return ""
    return f"within ±{significant(cell.noise * 100, 2)}% step noise"


def delta_text(unit: Unit, cell: MetricCell) -> str:
    """The change and, within noise, that it is: "+6.80% (within ±14% step noise)"."""
    d, n = delta(unit, cell), noise(cell)
    return f"{d} ({n})" if d and n else d


def verdict_word(cell: MetricCell) -> str:
    if cell.within_noise:
        return "within the step-to-step spread: neither improved nor regressed"
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
