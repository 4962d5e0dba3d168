"""`mcx ls`, `mcx show`, `mcx sync`, `mcx baseline`: reading and maintaining the records."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import Any

from attrs import evolve, frozen

from mcx.contract.status import Status
from mcx.errors import InputError, RunIdError
from mcx.eval.scores import STDERR, read_step_evaluations
from mcx.metrics.summary import METRIC_KEYS
from mcx.metrics.ranks import SlowestRank, slowest_rank
from mcx.track import runrecord
from mcx.track.baseline import Baseline, list_baselines, set_baseline
from mcx.track.errors import TrackingUnavailable
from mcx.track.lineage import Lineage, lineage as chain
from mcx.track.paths import check_run_id, run_dir
from mcx.track.query import list_runs as query
from mcx.track.run_entry import RunEntry, ShownRun
from mcx.track.sync import SyncReport, sync as replay
from mcx.track.target import check_uri, unreachable_hint


def _uri(project: Path) -> str | None:
    import os

    return os.environ.get("MLFLOW_TRACKING_URI") or None


def _store_exists(project: Path) -> bool:
    """A tracking server is named, or the embedded store was created by a run (reads never create it)."""
    return _uri(project) is not None or (project / ".mcx" / "mlflow.db").is_file()


def _require_known(project: Path, run_id: str) -> str:
    check_run_id(run_id)
    if not run_dir(project, run_id).is_dir() and not _store_exists(project):
        raise RunIdError(f"unknown run ID {run_id}: no run directory and no tracking store in this project;",
                         "list runs with `mcx ls`, or set MLFLOW_TRACKING_URI to the server that recorded it.")
    return run_id


def list_runs(*, project: Path, experiment: str | None = None, all_runs: bool = False) -> list[RunEntry]:
    """Runs of this project; ``all_runs`` adds runs only the tracking store knows (slower: imports mlflow)."""
    try:
        rows = query(project, _uri(project), include_tracking=all_runs and _store_exists(project))
    except TrackingUnavailable:
        rows = query(project, _uri(project), include_tracking=False)
    return [_queued(project, r) for r in rows if experiment is None or r.name == experiment]


@frozen
class ColumnCell:
    """One extra `mcx ls --columns` cell: a run's summary value and, for a score, the harness's standard error."""

    value: float | None  # None: the run has no such value
    stderr: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "stderr": self.stderr}


def run_columns(rows: Sequence[RunEntry], asked: Sequence[str]) -> tuple[str, ...]:
    """The columns ``asked`` names (comma-separated items), each a summary metric (docs/metrics.md), an evaluation
    score ``eval/<task>/<metric>`` or a glob over them (``eval/*``), in the order asked, each once. A name no run
    here has (and no summary metric is called) is an InputError naming the columns these runs have."""
    have = sorted({k for r in rows for k, v in r.final.items() if _number(v) is not None and not k.endswith(STDERR)})
    known = [*METRIC_KEYS, *(k for k in have if k not in METRIC_KEYS)]
    out: list[str] = []
    missing = []
    for item in (p.strip() for text in asked for p in text.split(",")):
        if not item:
            continue
        found = [k for k in known if fnmatch.fnmatchcase(k, item)] if _is_glob(item) else \
            [item] if item in known else []
        if not found:
            missing.append(item)
        out += [k for k in found if k not in out]
    if missing:
        listed = ", ".join(have) if have else "none (no run listed has a summary yet)"
        raise InputError(f"--columns {', '.join(missing)}: no such column in these runs; they have: {listed}",
                         "name a summary metric (docs/metrics.md), a score as eval/<task>/<metric>, or a glob such "
                         "as 'eval/*'; separate several with commas.")
    if not out:
        raise InputError("--columns names no column;", "give one or more, e.g. --columns valid_loss,'eval/*'.")
    return tuple(out)


def column_cells(row: RunEntry, columns: Sequence[str]) -> dict[str, ColumnCell]:
    """``row``'s value of each column, with the standard error its summary keeps beside a score."""
    return {c: ColumnCell(_number(row.final.get(c)), _number(row.final.get(c + STDERR))) for c in columns}


def _is_glob(item: str) -> bool:
    return any(ch in item for ch in "*?[")


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _queued(project: Path, row: RunEntry) -> RunEntry:
    """A running run whose current stage's job waits in the cluster's queue is listed "queued" (D64)."""
    if row.state != "running" or row.run_id is None:
        return row
    from attrs import evolve

    from mcx.ops.status import status_of

    return evolve(row, status=Status.QUEUED) if status_of(run_dir(project, row.run_id)).state == Status.QUEUED else row


def show_run(run_id: str, *, project: Path) -> ShownRun:
    from mcx.track.query import show_run as query

    shown = query(project, _require_known(project, run_id), _uri(project), include_tracking=False)
    path = run_dir(project, run_id)
    return evolve(shown, slowest_ranks=slowest_ranks(path, shown.entry.stages), profiles=profiles(path),
                  eval_steps=read_step_evaluations(path))


def profiles(run_path: Path) -> dict[str, str]:
    """Each stage's profile directory (`mcx run --profile`, D73), where it holds a trace."""
    from mcx.contract.files import PROFILE_DIR

    found = {stage: run_path / stage / PROFILE_DIR for stage in ("smoke", "full")}
    return {stage: str(d) for stage, d in found.items() if any(d.glob("trace-rank*"))}


def slowest_ranks(run_path: Path, stages: Iterable[str]) -> dict[str, SlowestRank]:
    """Each stage's slowest rank, where it is an outlier (mcx.metrics.ranks; docs/metrics.md)."""
    found = {stage: slowest_rank(run_path / stage) for stage in stages}
    return {stage: r for stage, r in found.items() if r is not None and r.outlier}


def lineage(run_id: str, *, project: Path) -> Lineage:
    """`mcx lineage`: the runs ``run_id`` started from (up to its first source) and the runs started from it."""
    return chain(project, check_run_id(run_id))


@frozen(kw_only=True)
class Synced:
    """What `mcx sync` did: the replay's report, its summary in a few lines, and why records stay pending
    (None: none do, or only runs busy with their own process)."""

    report: SyncReport
    summary: str
    error: str | None

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_dict(self) -> dict[str, Any]:
        """The object `mcx sync --json` prints."""
        report = self.report
        return {"ok": report.ok, "ops_sent": report.ops_sent, "metrics_sent": report.metrics_sent,
                "runs": [{"run_id": e.run_id, "state": e.state, "target": e.target, "pending": list(e.pending_records),
                          "error": e.error} for e in report.runs],
                "unreachable": [{"target": o.target, "reason": o.reason, "waited_s": o.waited_s} for o in report.outages],
                "summary": self.summary, "error": self.error, "seconds": report.seconds}


def sync(*, project: Path, to: str | None = None) -> Synced:
    """`mcx sync`: send every spooled record to the store its run was recorded for (``to``: that store
    instead). ``ok`` once nothing is pending; ``error``: one paragraph on why some is, and the fix."""
    if to is not None and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", check_uri(to, "--to")):
        raise InputError(f"--to {to!r} is not a tracking URI (MLflow would take it for a directory to create)",
                         "give the server's URI, e.g. --to http://mlflow.example:5000 (or sqlite:///path/mlflow.db).")
    report = replay(project, tracking_uri=None if to is None else check_uri(to, "--to"))
    pending = report.pending()
    lines = [f"sent {report.ops_sent} records and {report.metrics_sent} metrics for {len(report.runs)} runs"
             + (f"; {len(pending)} still pending (run: stages waiting):" if pending else "; nothing pending")]
    lines += [f"  {e.run_id}: {', '.join(e.pending_records) or 'run'} -> {e.target}" for e in pending]
    errors = []
    for outage in report.outages:
        count = sum(e.target == outage.target for e in pending)
        errors.append(f"the tracking server {outage.target} could not be reached ({outage.reason}, after "
                      f"{outage.waited_s:g} s; not tried again for the other runs): the records of {count} runs "
                      "stay spooled; " + unreachable_hint(outage.target))
    down = {o.target for o in report.outages}
    for e in pending:
        if e.target not in down and e.error:
            fix = unreachable_hint(e.target) if e.target == "embedded" else \
                "fix what the store refused, then run `mcx sync` again."
            errors.append(f"run {e.run_id} was not sent to {e.target} ({e.error}); its records stay spooled: {fix}")
    return Synced(report=report, summary="\n".join(lines), error=" ".join(errors) or None)


def baseline_set(name: str, run_id: str, *, project: Path) -> Baseline:
    """``run_id``: a run ID, or ``sweep:NAME`` for that sweep's best complete trial."""
    if run_id.startswith("sweep:"):
        from mcx.ops.sweep import best_run

        run_id = best_run(run_id[len("sweep:"):], project)
    return set_baseline(project, name, _require_known(project, run_id), tracking_uri=_uri(project))


def baseline_list(*, project: Path) -> list[Baseline]:
    if not _store_exists(project):
        return []
    return list_baselines(project, tracking_uri=_uri(project))


def run_dirs(project: Path, run_ids: list[str], experiment: str | None) -> list[Path]:
    """Run directories for explicit IDs, or every finished run of an experiment."""
    if experiment:
        found = [r.run_id for r in query(project, None)
                 if r.name == experiment and r.status == Status.FINISHED and r.run_id is not None]
        if not found:
            raise InputError(f"no finished run of experiment {experiment!r} in this project;", "list runs with `mcx ls`.")
        run_ids = [*run_ids, *reversed(found)]
    if not run_ids:
        raise InputError("no runs to compare;", "give run IDs (see `mcx ls`) or --experiment NAME.")
    out = []
    for rid in dict.fromkeys(run_ids):
        run_path = run_dir(project, check_run_id(rid))
        if not (run_path / "spec.toml").exists():
            raise RunIdError(f"unknown run ID {rid}: no run directory {run_path};", "list runs with `mcx ls`.")
        damaged = runrecord.damaged(run_path)
        if damaged:  # read as empty, it would compare as a run that never finished
            raise runrecord.damaged_error(Path(project).resolve(), run_path, damaged)
        out.append(run_path)
    return out
