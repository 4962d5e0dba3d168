"""Named baselines, kept in the tracking store, and the regression verdict against one.

Storage: the experiment ``mcx-baselines`` carries one experiment tag per name,
``mcx.baseline.<name>`` = ``{"run_id": ..., "set_at": unix time, "host": ..., "note": ...}``. Experiment
tags are plain key/values every MLflow backend (SQLite, a server, Databricks) stores and returns with
the experiment in one call; no placeholder runs or registered models are made up. Setting a name
again moves it; the name history is not kept.

Verdict: for each metric in ``tolerances`` (``[baseline] tolerances``: metric -> allowed relative
worsening, 0.02 = 2 %), the run regresses when it is worse than the baseline by more than that.
"Worse" is higher for losses, perplexity, memory and time, lower for MFU and throughput
(``direction``). Without tolerances, every metric named ``.../loss`` or ``.../ppl`` is gated at
``DEFAULT_TOLERANCE``; other metrics are reported, not gated.
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from mcx.errors import InputError, RunIdError
from mcx.eval.scores import run_eval_metrics
from mcx.metrics.summary import BY_KEY
from mcx.track import paths
from mcx.track.errors import TrackingUnavailable
from mcx.track.mlflow_store import MlflowStore
from mcx.track.target import describe_error, is_transient, resolve_target

BASELINE_EXPERIMENT = "mcx-baselines"
TAG_PREFIX = "mcx.baseline."
DEFAULT_TOLERANCE = 0.01
DEFAULT_GATED = ("loss", "ppl")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,99}$")
# Last part of a metric name -> which way is better. Checked in order; first match wins.
_HIGHER = ("mfu", "tokens_per_s", "throughput", "tflops", "samples_per_s", "accuracy", "acc")
_LOWER = ("loss", "ppl", "perplexity", "mem", "memory", "bytes", "time", "latency")


@frozen
class Baseline:
    name: str
    run_id: str
    set_at: float
    host: str | None = None
    note: str | None = None


def direction(metric: str) -> Literal["lower", "higher"] | None:
    """Which way ``metric`` improves: its definition's (mcx.metrics.summary), else guessed from its name
    (None: mcx cannot tell)."""
    last = metric.rsplit("/", 1)[-1].lower()
    if last in BY_KEY:
        return BY_KEY[last].better
    if any(word in last for word in _HIGHER):
        return "higher"
    if any(word in last for word in _LOWER) or last.endswith("_s"):
        return "lower"
    return None


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(f"baseline name {name!r} is not valid",
                         "use letters, digits, '.', '_' or '-' (up to 100), starting with a letter or digit.")
    return name


def _store(project_root: Path, tracking_uri: str | None):
    target = resolve_target(project_root, tracking_uri)
    try:
        store = MlflowStore(target)
        return store, store.experiment_id(BASELINE_EXPERIMENT)
    except Exception as exc:
        if is_transient(exc):
            raise TrackingUnavailable(f"cannot reach the tracking store {target.name}: {describe_error(exc)}",
                                      "baselines live there; start it or point MLFLOW_TRACKING_URI at it.") from None
        raise


def set_baseline(project_root: Path, name: str, run_id: str, *, tracking_uri: str | None = None,
                 note: str | None = None) -> Baseline:
    """Name ``run_id`` as baseline ``name`` (the run must be recorded in the store)."""
    _check_name(name)
    paths.check_run_id(run_id)
    store, exp_id = _store(project_root, tracking_uri)
    if store.find_parent_run(run_id) is None:
        raise RunIdError(f"run {run_id} is not recorded in the tracking store {store.target.name}",
                         "run `mcx sync` if it was recorded offline, or check the run ID with `mcx ls`.")
    base = Baseline(name, run_id, time.time(), socket.gethostname(), note)
    value = json.dumps({"run_id": run_id, "set_at": base.set_at, "host": base.host, "note": note}, sort_keys=True)
    store.client.set_experiment_tag(exp_id, TAG_PREFIX + name, value)
    return base


def remove_baseline(project_root: Path, name: str, *, tracking_uri: str | None = None) -> None:
    _check_name(name)
    store, exp_id = _store(project_root, tracking_uri)
    if TAG_PREFIX + name not in store.client.get_experiment(exp_id).tags:
        raise InputError(f"no baseline named {name!r}", "list them with `mcx baseline ls`.")
    store.client.delete_experiment_tag(exp_id, TAG_PREFIX + name)


def list_baselines(project_root: Path, *, tracking_uri: str | None = None) -> list[Baseline]:
    store, exp_id = _store(project_root, tracking_uri)
    out = []
    for key, value in store.client.get_experiment(exp_id).tags.items():
        if not key.startswith(TAG_PREFIX):
            continue
        try:
            data = json.loads(value)
            out.append(Baseline(key[len(TAG_PREFIX):], data["run_id"], float(data["set_at"]), data.get("host"),
                                data.get("note")))
        except (ValueError, KeyError, TypeError):
            continue  # a tag someone else wrote by hand
    return sorted(out, key=lambda b: b.name)


def resolve(project_root: Path, name_or_run_id: str, *, tracking_uri: str | None = None) -> str:
    """The run ID a baseline name stands for; a run ID is returned as is if this project or the
    store knows it. Raises RunIdError naming the nearest known baselines otherwise."""
    if paths.RUN_ID_PATTERN.fullmatch(name_or_run_id or ""):
        if paths.run_dir(project_root, name_or_run_id).is_dir():
            return name_or_run_id
    baselines = list_baselines(project_root, tracking_uri=tracking_uri)
    for b in baselines:
        if b.name == name_or_run_id:
            return b.run_id
    if paths.RUN_ID_PATTERN.fullmatch(name_or_run_id or ""):
        store, _ = _store(project_root, tracking_uri)
        if store.find_parent_run(name_or_run_id) is not None:
            return name_or_run_id
    import difflib

    near = difflib.get_close_matches(str(name_or_run_id), [b.name for b in baselines], n=3)
    hint = f"did you mean {', '.join(near)}?" if near else "list baselines with `mcx baseline ls`, runs with `mcx ls`."
    raise RunIdError(f"{name_or_run_id!r} is neither a baseline name nor a known run ID", hint)


def baseline_metrics(project_root: Path, run_id: str, *, tracking_uri: str | None = None) -> dict[str, float]:
    """A run's final metrics: its full stage's result.json here, else its parent run in the store."""
    run_path = paths.run_dir(project_root, run_id)
    for stage in ("full", "smoke"):
        result = paths.read_json(run_path / stage / paths.RESULT_FILE)
        if isinstance(result, dict) and isinstance(result.get("final"), dict):
            return {**{k: float(v) for k, v in result["final"].items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}, **run_eval_metrics(run_path)}
    store, _ = _store(project_root, tracking_uri)
    run = store.find_parent_run(run_id)
    if run is None:
        raise RunIdError(f"run {run_id} has no results here nor in the tracking store {store.target.name}",
                         "choose a finished run as the baseline.")
    return {k: v for k, v in run.data.metrics.items() if not k.startswith("smoke/")}


def compare_to_baseline(final: dict[str, float], baseline: dict[str, float],
                        tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """``{"verdict": "pass"|"regress", "regressed": [...], "metrics": {name: {...}}}``.

    Each metric entry: value, baseline, delta (value - baseline), rel_delta (delta / |baseline|,
    None at 0), direction, tolerance (None: not gated) and status: "pass", "improved", "regress",
    "missing" (gated but absent from the run: a regression) or "info" (not gated or no baseline).
    """
    tolerances = dict(tolerances or {})
    for name, given in tolerances.items():
        if not isinstance(given, (int, float)) or isinstance(given, bool) or given < 0 or not math.isfinite(given):
            raise InputError(f"baseline.tolerances.{name} = {given!r} is not a relative tolerance",
                             "give a number >= 0, e.g. 0.02 for 2 %.")
        if direction(name) is None:
            raise InputError(f"baseline.tolerances.{name}: mcx cannot tell whether {name} should go up or down",
                             "gate losses, ppl, memory, time, mfu or throughput metrics.")
    gated = tolerances or {m: DEFAULT_TOLERANCE for m in set(final) | set(baseline) if _held_out(m)}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(final) | set(baseline) | set(gated)):
        value, base = final.get(name), baseline.get(name)
        tol = gated.get(name)
        way = direction(name)
        entry: dict[str, Any] = {"value": value, "baseline": base, "delta": None, "rel_delta": None,
                                 "direction": way, "tolerance": tol}
        if base is None:
            entry["status"] = "info"
        elif value is None:
            entry["status"] = "missing" if tol is not None else "info"
        else:
            delta = value - base
            rel = delta / abs(base) if base != 0 else None
            entry["delta"], entry["rel_delta"] = delta, rel
            entry["status"] = _status(value, base, way, tol)
        out[name] = entry
    regressed = [m for m, e in out.items() if e["status"] in ("regress", "missing")]
    return {"verdict": "regress" if regressed else "pass", "regressed": regressed, "metrics": out}


def _held_out(metric: str) -> bool:
    """Gated by default: held-out losses and perplexities (valid/loss, test_ppl, ...), and bare loss/ppl."""
    last = metric.rsplit("/", 1)[-1]
    if last in DEFAULT_GATED:
        return True
    kind, _, what = last.partition("_")
    return kind in ("valid", "test") and what in DEFAULT_GATED


def _status(value: float, base: float, way: str | None, tol: float | None) -> str:
    if not math.isfinite(value):
        return "regress" if tol is not None else "info"
    if way is None:
        return "info"
    worse = (value - base) if way == "lower" else (base - value)  # > 0: worse than the baseline
    relative = worse / abs(base) if base != 0 else worse
    if tol is not None and relative > tol:
        return "regress"
    if worse < 0:
        return "improved"
    return "pass" if tol is not None else "info"
