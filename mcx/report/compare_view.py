"""Comparing runs: what differs in config and fingerprint, how the metrics moved, the curves.

``compare`` is pure: RunData in, a ``Comparison`` (plain data) out. Renderers in ``table``,
``markdown``, ``jsondoc`` and ``htmlpage`` turn one Comparison into a terminal table, Markdown, a
JSON document and a self-contained HTML page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import field, frozen

from mcx.errors import InputError
from mcx.metrics.batches import BatchCheck
from mcx.metrics.curves import Curve
from mcx.metrics.summary import BY_KEY, METRIC_KEYS, METRICS, Metric
from mcx.report.cells import ABSENT, MetricCell
from mcx.report.eval_view import EvalRow
from mcx.report.fmt import value
from mcx.report.heldout import Summary, summarize_comparison
from mcx.report.rundata import Drawn, RunData, flatten, run_spreads, summarize_run
from mcx.report.sweep_report import SweepSection

PlotView = Literal["plain", "smoothed", "spread"]

# Relative slack below which a change is float noise, neither a regression nor an improvement.
EPS = 1e-9
# What "within noise" in the metric table means (``judge``), for the reports' definitions.
STEP_NOISE = ("half the width of the central 80% (p10..p90) of a run's steady per-step values, relative to its "
              "value; a change no larger than the larger of the two runs' is within noise: neither improved "
              "nor regressed")
# Fingerprint components in the order a reader checks them; "config" is the config diff itself.
COMPONENT_ORDER = ("code", "environment", "data", "hardware")


@frozen
class RunHeader:
    run_id: str
    name: str
    status: str
    is_baseline: bool

    @property
    def label(self) -> str:
        return f"{self.run_id} {self.name}" if self.name and self.name != self.run_id else self.run_id


@frozen
class DiffRow:
    """One key whose value is not the same in every run; ``values`` follow ``Comparison.runs``."""

    key: str
    values: tuple[Any, ...]  # ABSENT where a run lacks the key


@frozen
class MetricRow:
    metric: Metric
    tolerance: float  # allowed relative change in the worse direction before it is a regression
    cells: tuple[MetricCell, ...]  # one per run, in ``Comparison.runs`` order


@frozen
class Regression:
    run_id: str
    metric: str
    baseline: float
    value: float
    delta_rel: float | None
    tolerance: float

    def describe(self) -> str:
        """One line for people: what moved, by how much, against which tolerance."""
        m = BY_KEY[self.metric]
        rel = f"{self.delta_rel:+.2%}, " if self.delta_rel is not None else ""
        tol = f", tolerance {self.tolerance:.1%}" if self.tolerance else ""
        return (f"{self.run_id}: {m.label} {value(m.unit, self.value)} vs {value(m.unit, self.baseline)} "
                f"in the baseline ({rel}{m.better} is better{tol})")


@frozen
class Series:
    run_id: str
    label: str
    curve: Curve


@frozen
class Plot:
    key: str
    title: str
    y_label: str
    curve: str  # the metric plotted, e.g. "train/loss"
    series: tuple[Series, ...]  # runs that have the curve, in ``Comparison.runs`` order
    zero_based: bool = False  # y axis from 0 (rates)
    view: PlotView = "plain"  # "smoothed": raw and smoothed curves with a toggle; "spread": the step-to-step band


@frozen
class MixtureRow:
    """One data-mixture component across the runs: what each run's main stage drew from it (None where the run
    did not read it, or read one dataset)."""

    component: str  # "mix.web", "valid.books"
    cells: tuple[Drawn | None, ...]  # in ``Comparison.runs`` order


@frozen
class Comparison:
    runs: tuple[RunHeader, ...]
    baseline: str | None  # run ID of the baseline (the first run), or None
    config_diff: tuple[DiffRow, ...]
    fingerprint_diff: dict[str, tuple[DiffRow, ...]]  # component -> differing fields (only components that differ)
    fingerprint_same: tuple[str, ...]  # components identical in every run
    metrics: tuple[MetricRow, ...]  # metrics at least one run has
    regressions: tuple[Regression, ...]
    plots: tuple[Plot, ...]
    notes: tuple[str, ...] = ()  # what loading skipped, per run
    summary: Summary | None = None  # what differs, which run is better on the held-out metric, against noise
    # run ID -> where its weights came from, oldest first ("random weights", "run X step N", "hf:DIR ..."):
    # only for runs that started from another run or a model ([init] from); empty when none did
    lineage: Mapping[str, tuple[str, ...]] = field(factory=dict)
    sweep: SweepSection | None = None  # `mcx compare --sweep`: the sweep the runs are the best trials of
    mixture: tuple[MixtureRow, ...] = ()  # the realised data mixtures, when any run read one (D60)
    evals: tuple[EvalRow, ...] = ()  # downstream scores with standard errors, when any run was evaluated (D68)
    batches: BatchCheck | None = None  # two runs: their batch hashes compared, step by step (D69); None: not recorded


# key, title, y label, curve, y axis from zero, view
PLOTS: tuple[tuple[str, str, str, str, bool, PlotView], ...] = (
    ("train_loss", "Train loss", "loss", "train/loss", False, "smoothed"),
    ("valid_loss", "Validation loss", "loss", "valid/loss", False, "plain"),
    ("throughput", "Throughput", "tokens/s/GPU", "train/tokens_per_s_per_gpu", True, "spread"),
    ("lr", "Learning rate", "learning rate", "train/lr", True, "plain"),
    ("grad_norm", "Gradient norm", "grad norm", "train/grad_norm", False, "plain"),
    ("expert_load", "Expert load", "busiest expert / mean", "train/moe_expert_load", False, "plain"),  # MoE (D82)
)


def same_key(value: Any) -> str:
    """Equality that tells 1 from 1.0 from true (all equal in Python)."""
    if value is ABSENT:
        return "\0absent"
    return type(value).__name__ + ":" + json.dumps(value, sort_keys=True, default=repr)


def diff_rows(tables: Sequence[Mapping[str, Any]]) -> tuple[DiffRow, ...]:
    """Rows for the keys (in first-seen order) whose values are not all the same."""
    keys: dict[str, None] = {}
    for t in tables:
        keys.update(dict.fromkeys(t))
    rows = []
    for key in keys:
        values = tuple(t.get(key, ABSENT) for t in tables)
        if len({same_key(v) for v in values}) > 1:
            rows.append(DiffRow(key, values))
    return tuple(rows)


def check_tolerances(tolerances: Mapping[str, float] | None) -> dict[str, float]:
    """Validated ``[baseline.tolerances]``: known metric keys, finite values >= 0."""
    out: dict[str, float] = {}
    for key, tol in (tolerances or {}).items():
        if key not in BY_KEY:
            raise InputError(f"baseline.tolerances.{key}: unknown metric;", f"use one of {', '.join(METRIC_KEYS)}.")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise InputError(f"baseline.tolerances.{key} = {tol!r} is not a relative tolerance;",
                             "give a number >= 0, e.g. 0.02 for 2%.")
        out[key] = float(tol)
    return out


def judge(metric: Metric, base: float | None, value: float | None, tolerance: float,
          spreads: tuple[float | None, float | None] = (None, None)) -> MetricCell:
    """One run's value against the baseline's: deltas, and whether it regressed or improved.

    ``spreads``: the baseline's and this run's step-to-step spread (steady metrics only). A relative
    change no larger than the larger of them is within noise: neither a regression nor an improvement.
    """
    spread = spreads[1]
    if value is None or base is None:
        return MetricCell(value, spread=spread)
    if math.isnan(base):
        return MetricCell(value, spread=spread)
    if math.isnan(value):  # a NaN (a diverged run) is worse than any number
        return MetricCell(value, regressed=True, spread=spread)
    delta = value - base
    finite = math.isfinite(base) and base != 0
    delta_rel = delta / abs(base) if finite else None
    worse = delta if metric.better == "lower" else -delta  # > 0: moved the wrong way
    if math.isinf(worse):
        return MetricCell(value, delta, delta_rel, regressed=worse > 0, improved=worse < 0, spread=spread)
    noise = max((s for s in spreads if s is not None), default=None)
    if delta_rel is not None and noise is not None and abs(delta_rel) <= noise:  # delta_rel: None unless finite
        return MetricCell(value, delta, delta_rel, spread=spread, within_noise=True, noise=noise)
    if finite:
        rel_worse = worse / abs(base)
        return MetricCell(value, delta, delta_rel, regressed=rel_worse > tolerance + EPS, improved=rel_worse < -EPS,
                          spread=spread, noise=noise)
    return MetricCell(value, delta, delta_rel, regressed=worse > EPS, improved=worse < -EPS, spread=spread,
                      noise=noise)


def _fingerprint_diff(runs: Sequence[RunData]) -> tuple[dict[str, tuple[DiffRow, ...]], tuple[str, ...]]:
    names = {n for r in runs for n in r.fingerprint.names() if n != "config"}
    ordered = [n for n in COMPONENT_ORDER if n in names] + sorted(names - set(COMPONENT_ORDER))
    diff: dict[str, tuple[DiffRow, ...]] = {}
    same: list[str] = []
    for name in ordered:
        tables = [flatten(dict(t)) if (t := r.fingerprint.table(name)) is not None else {} for r in runs]
        rows = diff_rows(tables)
        if rows:
            diff[name] = rows
        else:
            same.append(name)
    return diff, tuple(same)


def drawn_text(d: Drawn | None) -> str:
    """One run's cell of the mixture table: ``70.0% -> 69.8% (1,117 samples)``, or ``-``."""
    return "-" if d is None else f"{d.requested:.1%} -> {d.share:.1%} ({d.samples:,} samples)"


def _mixture(runs: Sequence[RunData]) -> tuple[MixtureRow, ...]:
    """Each component any run drew from, with every run's requested and drawn share (its main stage's)."""
    drawn = [(r.stages.get("full") or r.stages.get("smoke")) for r in runs]
    mixes = [st.mixture if st is not None else {} for st in drawn]
    names = sorted({n for m in mixes for n in m})
    return tuple(MixtureRow(n, tuple(m.get(n) for m in mixes)) for n in names)


def compare(runs: Sequence[RunData], baseline: RunData | None = None, *,
            tolerances: Mapping[str, float] | None = None,
            seeds: Mapping[str, Sequence[RunData]] | None = None) -> Comparison:
    """Compare runs; with a baseline, it comes first and every other run gets deltas against it.

    ``tolerances``: metric key -> allowed relative change in the worse direction (default 0, so any
    change beyond float noise is flagged). A run given twice (or also as the baseline) appears once.
    ``seeds``: run ID -> the recorded runs that differ from it only in ``train.seed`` (itself
    included, ``mcx.report.seeds.seed_runs``); their spread is the summary's run-to-run noise.
    """
    tols = check_tolerances(tolerances)
    ordered: list[RunData] = []
    seen: set[str] = set()
    for r in ([baseline] if baseline is not None else []) + list(runs):
        if r.run_id not in seen:
            seen.add(r.run_id)
            ordered.append(r)
    if not ordered:
        raise InputError("nothing to compare;", "give at least one run ID (or an experiment with runs).")
    base_id = baseline.run_id if baseline is not None else None
    headers = tuple(RunHeader(r.run_id, r.name, r.status, r.run_id == base_id) for r in ordered)

    summaries = [summarize_run(r) for r in ordered]
    noise = [run_spreads(r) for r in ordered]
    rows: list[MetricRow] = []
    regressions: list[Regression] = []
    for m in METRICS:
        values = [s[m.key] for s in summaries]
        if all(v is None for v in values):
            continue
        tol = tols.get(m.key, 0.0)
        base = values[0] if base_id is not None else None
        cells = []
        for h, v, n in zip(headers, values, noise):
            spreads = (noise[0].get(m.key), n.get(m.key))
            cell = (MetricCell(v, spread=spreads[1]) if base_id is None or h.is_baseline
                    else judge(m, base, v, tol, spreads))
            cells.append(cell)
            if cell.regressed and base is not None and v is not None:  # judged: both known
                regressions.append(Regression(h.run_id, m.key, base, v, cell.delta_rel, tol))
        rows.append(MetricRow(m, tol, tuple(cells)))

    plots = []
    for key, title, y_label, name, zero_based, view in PLOTS:
        series = tuple(Series(h.run_id, h.label, r.curves[name])
                       for h, r in zip(headers, ordered) if name in r.curves and r.curves[name].values)
        if series:
            plots.append(Plot(key, title, y_label, name, series, zero_based, view))

    fp_diff, fp_same = _fingerprint_diff(ordered)
    config_diff = diff_rows([r.spec for r in ordered])
    notes = tuple(f"{r.run_id}: {note}" for r in ordered for s in r.stages.values() for note in s.notes)
    summary = summarize_comparison([h.run_id for h in headers], summaries, base_id,
                                   config_keys=tuple(r.key for r in config_diff), components=tuple(fp_diff),
                                   seeds={**(seeds or {})}, runs=ordered)
    return Comparison(
        runs=headers,
        baseline=base_id,
        config_diff=config_diff,
        fingerprint_diff=fp_diff,
        fingerprint_same=fp_same,
        metrics=tuple(rows),
        regressions=tuple(regressions),
        plots=tuple(plots),
        notes=notes,
        summary=summary,
        mixture=_mixture(ordered),
    )
