"""A Comparison as a JSON document (plain dicts, lists, numbers and strings; strict JSON).

Non-finite numbers become the strings "NaN", "Infinity", "-Infinity" so that ``json.dumps(...,
allow_nan=False)`` and strict parsers accept the document. Curves are left out unless asked for:
a 100-run comparison would otherwise carry millions of points.
"""

from __future__ import annotations

import math
from typing import Any

from mcx.report.compare import ABSENT, Comparison, DiffRow

SCHEMA = "mcx.compare/1"


def num(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def plain(v: Any) -> Any:
    """A spec or fingerprint value as strict JSON data."""
    if isinstance(v, float):
        return num(v)
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or isinstance(v, (str, int, bool)):
        return v
    return str(v)


def _diff(cmp: Comparison, rows: tuple[DiffRow, ...]) -> list[dict[str, Any]]:
    """Each differing key with its value per run ID; a run that lacks the key is left out."""
    return [{"key": r.key, "values": {h.run_id: plain(v) for h, v in zip(cmp.runs, r.values) if v is not ABSENT}}
            for r in rows]


def to_json(cmp: Comparison, *, curves: bool = False) -> dict[str, Any]:
    """The comparison as JSON data; ``curves=True`` adds every plotted curve's points."""
    metrics = {}
    for row in cmp.metrics:
        per_run = {}
        for h, cell in zip(cmp.runs, row.cells):
            entry: dict[str, Any] = {"value": num(cell.value)}
            if cmp.baseline is not None and not h.is_baseline:
                entry.update(delta=num(cell.delta), delta_rel=num(cell.delta_rel),
                             regressed=cell.regressed, improved=cell.improved)
            per_run[h.run_id] = entry
        metrics[row.metric.key] = {"label": row.metric.label, "better": row.metric.better, "unit": row.metric.unit,
                                   "tolerance": row.tolerance, "runs": per_run}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "runs": [{"run_id": h.run_id, "name": h.name, "status": h.status, "baseline": h.is_baseline} for h in cmp.runs],
        "baseline": cmp.baseline,
        "metrics": metrics,
        "regressions": [{"run_id": r.run_id, "metric": r.metric, "baseline": num(r.baseline), "value": num(r.value),
                         "delta_rel": num(r.delta_rel), "tolerance": r.tolerance} for r in cmp.regressions],
        "config_diff": _diff(cmp, cmp.config_diff),
        "fingerprint_diff": {name: _diff(cmp, rows) for name, rows in cmp.fingerprint_diff.items()},
        "fingerprint_same": list(cmp.fingerprint_same),
        "notes": list(cmp.notes),
    }
    if curves:
        doc["curves"] = {p.curve: {s.run_id: {"steps": list(s.curve.steps), "values": [num(v) for v in s.curve.values]}
                                   for s in p.series} for p in cmp.plots}
    return doc
