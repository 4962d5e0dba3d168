"""Reading runs back: ``mcx ls``, ``mcx show``, and metric curves for ``mcx compare``.

Local first: a run directory holds everything ``ls`` and ``show`` print (run.json, spec.toml,
fingerprint.json, each stage's result.json and metrics.jsonl), and reading it takes milliseconds,
while asking MLflow costs its import (about 4 s) before the first answer. So the store is asked only
when told (``include_tracking=True``: runs recorded elsewhere on a shared server) or when the run
directory is gone. A stage's curve is read from its metrics.jsonl when present (the exact surviving
timeline, 10,000 steps in ~20 ms) and from ``MlflowClient.get_metric_history`` otherwise.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from attrs import evolve

from mcx.contract.status import Status
from mcx.errors import McxError, RunIdError, SpecError
from mcx.eval.scores import RUN_FILE as EVAL_FILE, read_evaluation, run_eval_metrics
from mcx.spec.load import loads_spec, spec_to_dict
from mcx.track import paths, runrecord
from mcx.track.errors import TrackingUnavailable
from mcx.track.journal import Journal
from mcx.track.mlflow_records import fingerprint_tags, spec_params
from mcx.track.mlflow_store import MlflowStore, RECORD_TAG, STAGE_TAG
from mcx.track.recorder import PREDICTION_METRICS
from mcx.track.run_entry import (
    CheckpointEntry, CodeProvenance, Metrics, RunEntry, ShownRun, StageEntry, StepTimeCheck, TrackingState,
)
from mcx.track.runcache import lookup
from mcx.track.share import read_pointers
from mcx.track.target import Target, describe_error, is_transient, resolve_target

if TYPE_CHECKING:
    from mlflow.entities import Run

    from mcx.track.mlflow_store import MlflowStore

try:  # same results, about twice as fast on large files
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = json.loads

_stores: dict[Target, MlflowStore] = {}
_stores_lock = threading.Lock()


def _store(project_root: Path, tracking_uri: str | None) -> MlflowStore:
    target = resolve_target(project_root, tracking_uri)
    with _stores_lock:
        if target not in _stores:
            _stores[target] = MlflowStore(target)
        return _stores[target]


@contextmanager
def _asking(target_name: str) -> Iterator[None]:
    """Turn "store unreachable" into TrackingUnavailable: a query cannot be spooled for later."""
    try:
        yield
    except (RunIdError, TrackingUnavailable):
        raise
    except Exception as exc:
        if is_transient(exc):
            raise TrackingUnavailable(
                f"cannot reach the tracking store {target_name}: {describe_error(exc)}",
                "start it, point MLFLOW_TRACKING_URI elsewhere, or query local runs only.",
            ) from None
        raise


# local run directories ----------------------------------------------------------------------------
def _stage_summary(stage_dir: Path) -> StageEntry:
    result = paths.read_json(stage_dir / paths.RESULT_FILE)
    if not isinstance(result, dict):
        return StageEntry(origin="no-result", status=Status.INCOMPLETE if (stage_dir / paths.METRICS_FILE).exists()
                          else Status.PENDING)
    return StageEntry.from_result(result)


def _final(stages: dict[str, StageEntry]) -> Metrics:
    for stage in ("full", "smoke"):
        entry = stages.get(stage)
        final = entry.final if entry is not None else None
        if isinstance(final, dict) and final:
            return final
    return {}


def _tracking_state(run_path: Path) -> TrackingState:
    journal = Journal(run_path / paths.TRACK_DIR)
    target = paths.read_json(run_path / paths.TRACK_DIR / "target.json", {}) or {}
    ids = paths.read_json(run_path / paths.TRACK_DIR / "ids.json", {}) or {}
    mlflow_run = (ids.get("records") or {}).get("run")
    return TrackingState(target=target.get("target"), experiment=target.get("experiment"),
                         experiment_id=ids.get("experiment_id"), mlflow_run=mlflow_run,
                         mlflow_url=mlflow_url(target.get("target"), ids.get("experiment_id"), mlflow_run),
                         pending_ops=len(journal.pending()))


def _created(run_path: Path, run_json: dict[str, Any]) -> float:
    """When the run first started (run.json's ``started``), else when its fingerprint was written; never
    the directory's mtime, which a reproduction or a lock file moves."""
    started = run_json.get("started")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        return float(started)
    for name in ("fingerprint.json", "spec.toml"):
        try:
            return os.stat(run_path / name).st_mtime
        except OSError:
            continue
    return os.stat(run_path).st_mtime


def _checkpoints(project_root: Path, run_path: Path) -> tuple[dict[str, CheckpointEntry], str | None]:
    """Each stage's final checkpoint (where it is, whether it is here, its DVC hash when recorded), and why
    the DVC pointers could not be read (None: they could)."""
    out: dict[str, CheckpointEntry] = {}
    error = None
    try:
        pointers = read_pointers(project_root, run_path.name)
    except McxError as exc:
        pointers = []
        error = str(exc)
    for p in pointers:
        out[p.stage] = CheckpointEntry(path=str(p.target), present=p.target.is_dir(), md5=p.md5,
                                       pointer=str(p.dvc_file), remote=p.remote.get("name"),
                                       remote_url=p.remote.get("url"))
    for stage in paths.STAGES:
        ckpts = sorted((run_path / stage / "checkpoints").glob("iter_*[0-9]")) if stage not in out else []
        if ckpts:
            out[stage] = CheckpointEntry(path=str(ckpts[-1]), present=True)
    return out, error


def mlflow_url(target: str | None, experiment_id: str | None, mlflow_run: str | None) -> str | None:
    """The run's page in the MLflow UI when it was recorded on a server (the embedded store has none)."""
    if not target or not experiment_id or not mlflow_run or not target.startswith(("http://", "https://")):
        return None
    return f"{target.rstrip('/')}/#/experiments/{experiment_id}/runs/{mlflow_run}"


def _local_summary(project_root: Path, run_path: Path) -> RunEntry:
    damaged = runrecord.damaged(run_path)
    run_json = paths.read_json(run_path / "run.json", {}) if not damaged else {}
    stages = {s: _stage_summary(run_path / s) for s in paths.STAGES if (run_path / s).is_dir()}
    spec_name = None
    try:
        import tomllib

        spec_name = tomllib.loads((run_path / "spec.toml").read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError):
        pass
    state = lookup(project_root, run_path.name)
    return RunEntry(
        run_id=run_path.name, name=spec_name, status=Status.DAMAGED if damaged else run_json.get("status"),
        state="damaged" if damaged else state.state, damaged=tuple(damaged),
        holder=state.holder.describe() if state.holder else None,
        created=_created(run_path, run_json), stages=stages,
        final={**_final(stages), **run_eval_metrics(run_path)},  # the evaluation's scores beside the stage's (D68)
        step_time=StepTimeCheck.from_dict((run_json.get("summary") or {}).get("step_time")),
        source="local", tracking=_tracking_state(run_path),
    )


def _step_time(run: Run) -> StepTimeCheck | None:
    """The step-time model's check as the recorder logged it (mcx.track.recorder.record_prediction)."""
    values = {k: run.data.metrics.get(name) for k, name in PREDICTION_METRICS.items()}
    return StepTimeCheck.from_dict({"gpu": run.data.tags.get("mcx.step_time.gpu"), **values})


def _tracking_summary(run: Run, stages: dict[str, StageEntry] | None = None) -> RunEntry:
    tags = run.data.tags
    return RunEntry(
        run_id=tags.get("mcx.run_id"), name=tags.get("mcx.spec_name"), status=tags.get("mcx.status"),
        state="finished" if tags.get("mcx.status") == Status.FINISHED else "recorded",
        created=(run.info.start_time or 0) / 1000.0, stages=stages or {},
        final={k: v for k, v in run.data.metrics.items() if not k.startswith("smoke/")},
        step_time=_step_time(run), source="tracking",
        tracking=TrackingState(experiment_id=run.info.experiment_id, mlflow_run=run.info.run_id,
                               mlflow_status=run.info.status),
    )


def _run_paths(root: Path) -> Iterator[Path]:
    """The project's run directories (``.mcx/runs/<run ID>``)."""
    runs_root = paths.runs_dir(root)
    if runs_root.is_dir():
        for run_path in runs_root.iterdir():
            if run_path.is_dir() and paths.RUN_ID_PATTERN.fullmatch(run_path.name):
                yield run_path


def step_time_checks(project_root: Path) -> list[tuple[str, float, StepTimeCheck]]:
    """(run ID, when it started, its step-time check) of each local run whose run.json holds one; only run.json is
    read, and the other records only of a run that has one, to leave out a run whose records are damaged."""
    out = []
    for run_path in _run_paths(Path(project_root).resolve()):
        run_json = paths.read_json(run_path / "run.json", {})
        summary = run_json.get("summary") if isinstance(run_json, dict) else None
        check = StepTimeCheck.from_dict(summary.get("step_time") if isinstance(summary, dict) else None)
        if check is not None and not runrecord.damaged(run_path):
            out.append((run_path.name, _created(run_path, run_json), check))
    return out


def list_runs(
    project_root: Path, tracking_uri: str | None = None, *, include_tracking: bool = False,
) -> list[RunEntry]:
    """Every run of the project (newest first); with ``include_tracking`` also those only in the store.

    status is run.json's, or the record's mcx.status; status and state are "damaged" for a run whose records
    are, each named in ``damaged`` (mcx.track.runrecord).
    """
    root = Path(project_root).resolve()
    local = {run_path.name: _local_summary(root, run_path) for run_path in _run_paths(root)}
    elsewhere: list[RunEntry] = []  # runs only the store knows
    if include_tracking:
        store = _store(root, tracking_uri)
        with _asking(store.target.name):
            for run in store.find_runs(store.all_experiment_ids(), {RECORD_TAG: "run"}):
                entry = _tracking_summary(run)
                if entry.run_id in local:
                    here = local[entry.run_id]
                    local[entry.run_id] = evolve(here, tracking=here.tracking.merged(entry.tracking))
                elif entry.run_id:
                    elsewhere.append(entry)
    out = [*local.values(), *elsewhere]
    return sorted(out, key=lambda e: e.created or 0, reverse=True)


def show_run(project_root: Path, run_id: str, tracking_uri: str | None = None, *,
             include_tracking: bool = False) -> ShownRun:
    """One run in full: the entry ``list_runs`` lists plus params, tags and run.json.

    Read from the run directory; from the store when the directory is gone (or also, with
    ``include_tracking``, to add the MLflow record's IDs and status). RunIdError if neither has it.
    """
    root = Path(project_root).resolve()
    run_path = paths.run_dir(root, run_id)
    if run_path.is_dir():
        entry = _local_summary(root, run_path)
        if entry.damaged:
            raise runrecord.damaged_error(root, run_path, list(entry.damaged))
        spec = _spec_tree(run_path)
        fp = paths.read_json(run_path / "fingerprint.json")
        checkpoints, checkpoints_error = _checkpoints(root, run_path)
        out = ShownRun(entry=entry, params=spec_params(spec) if spec else {},
                       tags=fingerprint_tags(fp) if isinstance(fp, dict) else {}, code=code_provenance(fp),
                       run=paths.read_json(run_path / "run.json", {}), spec_path=str(run_path / "spec.toml"),
                       checkpoints=checkpoints, checkpoints_error=checkpoints_error,
                       evaluation=read_evaluation(run_path / EVAL_FILE))
        if not include_tracking:
            return out
    else:
        out = None
    store = _store(root, tracking_uri)
    with _asking(store.target.name):
        parent = store.find_parent_run(run_id)
        if parent is None:
            if out is not None:
                return out
            raise RunIdError(f"unknown run ID {run_id}: no {run_path} and no record in {store.target.name}",
                             "list runs with `mcx ls` (add --all for the tracking store's).")
        stages = {}
        for child in store.children(parent):
            stage = child.data.tags.get(STAGE_TAG)
            if stage:
                stages[stage] = StageEntry(origin="tracking", status=child.data.tags.get("mcx.status"),
                                           passed=child.data.tags.get("mcx.passed"),
                                           steps=child.data.tags.get("mcx.steps"), mlflow_run=child.info.run_id)
        remote = _tracking_summary(parent, stages)
    if out is None:
        return ShownRun(entry=remote, params=dict(parent.data.params), tags=dict(parent.data.tags))
    return evolve(out, entry=evolve(out.entry, tracking=out.entry.tracking.merged(remote.tracking)))


def code_provenance(fp: object) -> CodeProvenance | None:
    """Where a run's code came from, from a fingerprint.json record; None for one without a code component."""
    return CodeProvenance.of(fp.get("code") if isinstance(fp, dict) else None)


def _spec_tree(run_path: Path) -> dict[str, Any] | None:
    path = run_path / "spec.toml"
    try:
        return spec_to_dict(loads_spec(path.read_text(encoding="utf-8"), str(path)))
    except (OSError, SpecError):
        return None


# curves -----------------------------------------------------------------------------------------
def read_history(metrics_file: Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of metric ``key`` ("<kind>/<field>") from one metrics.jsonl, in file order."""
    kind, _, field = key.partition("/")
    data = Path(metrics_file).read_bytes()
    body = data[: data.rfind(b"\n") + 1].strip()  # complete lines only
    if not body:
        return []
    try:
        records = _fast_loads(b"[" + body.replace(b"\n", b",") + b"]")
    except ValueError:  # blank or damaged lines, or NaN tokens orjson refuses: line by line
        records = []
        for line in body.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for record in records:
        if type(record) is dict and record.get("kind") == kind and type(step := record.get("step")) is int:
            value = record.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append((step, float(value)))
    return out


def metric_history(project_root: Path, run_id: str, stage: str, key: str, *,
                   tracking_uri: str | None = None) -> list[tuple[int, float]]:
    """The curve of ``key`` in one stage of a run: from its metrics.jsonl, else from MLflow."""
    root = Path(project_root).resolve()
    local = paths.run_dir(root, run_id) / stage / paths.METRICS_FILE
    if local.is_file():
        return read_history(local, key)
    store = _store(root, tracking_uri)
    with _asking(store.target.name):
        parent = store.find_parent_run(run_id)
        if parent is None:
            raise RunIdError(f"unknown run ID {run_id}: no {local} and no record in {store.target.name}",
                             "list runs with `mcx ls`.")
        child = next((c for c in store.children(parent) if c.data.tags.get(STAGE_TAG) == stage), None)
        if child is None:
            return []
        history = store.client.get_metric_history(child.info.run_id, key)
    return sorted(((m.step, m.value) for m in history), key=lambda sv: sv[0])
