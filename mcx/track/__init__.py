"""Tracking and lineage: MLflow records, the spool and ``mcx sync``, DVC, the run cache, baselines.

Importing this package is cheap: mlflow (about 4 s) and dvc (about 0.6 s) are imported inside the
functions that talk to them, so ``mcx plan``, ``ls`` and ``compare`` never pay for them.

Modules, by what they hold:

- ``recorder``: RunRecorder, everything recorded about one run directory (journal first, then sent)
- ``forward``: MetricsForwarder, a stage's metrics.jsonl tailed into MLflow from a thread
- ``journal``: the spool (append-only operations + acknowledged sequence number)
- ``sync``: ``sync(project_root) -> SyncReport`` replays every spool and unsent metrics
- ``mlflow_store``: idempotent MLflow writes and lookups by mcx identity tags
- ``target``: which store (spec, ``$MLFLOW_TRACKING_URI``, embedded SQLite) and its client
- ``records``: spec -> params, fingerprint -> tags, the environment report
- ``redact``: the one redaction function applied to everything that leaves the machine
- ``runcache``: run lock and ``lookup(project_root, run_id) -> RunState``
- ``dvc_store``: checkpoints added/pushed by hash, datasets and checkpoints restored by hash
- ``baseline``: named baselines in the store, ``compare_to_baseline`` verdicts
- ``query``: ``list_runs``, ``show_run``, ``metric_history``
"""

from mcx.track.baseline import (
    Baseline,
    baseline_metrics,
    compare_to_baseline,
    list_baselines,
    remove_baseline,
    resolve,
    set_baseline,
)
from mcx.track.dvc_store import DvcRecord, ensure_remote, pull_data, restore, track_checkpoint
from mcx.track.errors import RunLocked, TrackingUnavailable
from mcx.track.forward import ForwardResult, MetricsForwarder
from mcx.track.query import list_runs, metric_history, show_run
from mcx.track.recorder import FlushResult, RunRecorder
from mcx.track.redact import redact
from mcx.track.runcache import LockHolder, RunLock, RunState, acquire, holder_of, lookup
from mcx.track.sync import SyncEntry, SyncReport, sync
from mcx.track.target import Target, resolve_target

__all__ = [
    "Baseline", "DvcRecord", "FlushResult", "ForwardResult", "LockHolder", "MetricsForwarder", "RunLock",
    "RunLocked", "RunRecorder", "RunState", "SyncEntry", "SyncReport", "Target",
    "TrackingUnavailable", "acquire", "baseline_metrics", "compare_to_baseline", "ensure_remote", "holder_of",
    "list_baselines", "list_runs", "lookup", "metric_history", "pull_data", "redact", "remove_baseline",
    "resolve", "resolve_target", "restore", "set_baseline", "show_run", "sync", "track_checkpoint",
]
