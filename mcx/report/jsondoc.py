"""A Comparison as a JSON document (plain dicts, lists, numbers and strings; strict JSON).

Non-finite numbers become the strings "NaN", "Infinity", "-Infinity" so that ``json.dumps(...,
allow_nan=False)`` and strict parsers accept the document. Curves are left out unless asked for:
a 100-run comparison would otherwise carry millions of points.
"""

from __future__ import annotations

import math
from typing import Any

from mcx.report.compare_view import ABSENT, Comparison, DiffRow
from mcx.report.outcome import MEASURE, SEED_SPREAD, definitions, lines
from mcx.report.sweep_report import to_json as sweep_json

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


def _summary(cmp: Comparison) -> dict[str, Any] | None:
    """The summary's facts (``mcx.report.outcome``) and its sentences."""
    s = cmp.summary
    if s is None:
        return None
    g, n = s.margin, s.noise
    noise: dict[str, Any] = {"source": "unknown", "how_to_measure": f"{MEASURE} for a few N, then compare again"}
    if n is not None:
        noise = {"source": "seed spread", "spread": num(n.spread), "of": n.of or None,
                 "seed_runs": [{"run_id": rid, "seed": plain(seed)} for rid, seed in n.seeds],
                 "margin_within": s.within_noise, "definition": SEED_SPREAD}
    return {
        "differs": {"config": list(s.config_keys), "fingerprint": list(s.components)},
        "metric": s.metric.key if s.metric else None,
        "metric_label": s.metric.label if s.metric else None,
        "metric_reason": s.reason,
        "better": s.metric.better if s.metric else None,
        "reference": s.reference,
        "reference_role": s.reference_role,
        "ranking": [{"run_id": r.run_id, "value": num(r.value), "delta": num(r.delta), "delta_rel": num(r.delta_rel)}
                    for r in s.ranking],
        "best": g.best if g else None,
        "margin": ({"best": g.best, "other": g.other, "delta": num(g.delta), "delta_rel": num(g.delta_rel)}
                   if g else None),
        "noise": noise,
        "text": lines(cmp),
    }


def to_json(cmp: Comparison, *, curves: bool = False) -> dict[str, Any]:
    """The comparison as JSON data; ``curves=True`` adds every plotted curve's points."""
    metrics = {}
    for row in cmp.metrics:
        per_run = {}
        for h, cell in zip(cmp.runs, row.cells):
            entry: dict[str, Any] = {"value": num(cell.value)}
            if cmp.baseline is not None and not h.is_baseline:
                entry.update(delta=num(cell.delta), delta_rel=num(cell.delta_rel),
                             regressed=cell.regressed, improved=cell.improved, within_noise=cell.within_noise,
                             noise=num(cell.noise))
            if cell.spread is not None:
                entry["spread"] = num(cell.spread)
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
        "lineage": {run_id: list(steps) for run_id, steps in cmp.lineage.items()},
        "sweep": sweep_json(cmp.sweep) if cmp.sweep is not None else None,
        "mixture": {row.component: {h.run_id: ({"requested": d.requested, "share": d.share, "samples": d.samples}
                                                if d is not None else None) for h, d in zip(cmp.runs, row.cells)}
                    for row in cmp.mixture},
        "eval": {f"{row.task}/{row.metric}": {h.run_id: ({"value": num(c.value), "stderr": num(c.stderr),
                                                           "within_noise_of_first": n} if c is not None else None)
                                              for h, c, n in zip(cmp.runs, row.cells, row.noise)}
                 for row in cmp.evals},
        "notes": list(cmp.notes),
        "summary": _summary(cmp),
        "batches": cmp.batches.to_dict() if cmp.batches is not None else None,
        "definitions": {key: {"term": term, "definition": text} for key, term, text in definitions(cmp)},
    }
    if curves:
        doc["curves"] = {p.curve: {s.run_id: {"steps": list(s.curve.steps), "values": [num(v) for v in s.curve.values]}
                                   for s in p.series} for p in cmp.plots}
    return doc
