"""Tracking and lineage: MLflow records, the spool and ``mcx sync``, DVC, the run cache, baselines.

Importing this package is cheap: mlflow (about 4 s) and dvc (about 0.6 s) are imported inside the
functions that talk to them, so ``mcx plan``, ``ls`` and ``compare`` never pay for them.

Modules, by what they hold:

- ``recorder``: RunRecorder, everything recorded about one run directory (journal first, then sent)
- ``forward``: MetricsForwarder, a stage's metrics.jsonl and system*.jsonl tailed into MLflow from a thread
- ``lines``: how a line of those files becomes MLflow metrics (``train/loss``, ``system/gpu_0_...``)
- ``journal``: the spool (append-only operations + acknowledged sequence number)
- ``send``: ``sync_recorder``, one run directory's journal then its metrics (``RunRecorder.close``, ``sync``)
- ``sync``: ``sync(project_root) -> SyncReport`` replays every spool and unsent metrics
- ``mlflow_store``: idempotent MLflow writes and lookups by mcx identity tags
- ``target``: which store (spec, ``$MLFLOW_TRACKING_URI``, embedded SQLite) and its client
- ``records``: spec -> params, fingerprint -> tags, the environment report
- ``redact``: the one redaction function applied to everything that leaves the machine
- ``runcache``: run lock and ``lookup(project_root, run_id) -> RunState``
- ``holder``: ``LockHolder``, who holds a run's lock (``errors.RunLocked`` names it)
- ``dvc_store``: checkpoints added/pushed by hash, datasets and checkpoints restored by hash
- ``share``: a run's committed checkpoint pointers (``.mcx/checkpoints/<id>/``), fetching them in any clone
- ``baseline``: named baselines in the store, ``compare_to_baseline`` verdicts
- ``query``: ``list_runs``, ``show_run``, ``metric_history``
- ``run_entry``: a recorded run as ``query`` returns it, typed (``RunEntry``, ``ShownRun``)

Decisions (the reasons are in each module's docstring):

- Spool = write-ahead journal. Every record is journaled (fsynced) before it is sent, and every
  operation is idempotent, so online, offline and ``mcx sync`` are one code path and a crash at any
  point neither loses nor duplicates a record. Per-step metrics are not journaled: metrics.jsonl is
  the log and ``<stage>/tracked.json`` its acknowledged cursor.
- MLflow layout: experiment = spec name; parent run tagged ``mcx.run_id``/``mcx.record=run``; stage
  and reproduction runs nested under it; runs are found by these tags, never remembered only locally.
- Metric keys are ``<kind>/<field>`` (``train/loss``, ``train/mfu``, ``valid/loss``, ``test/ppl``),
  the names mcx.report uses for curves; the final metrics of the full stage go on the parent run
  under the same names (smoke's under ``smoke/``).
- Baselines are experiment tags of the ``mcx-baselines`` experiment (no placeholder runs).
- DVC: the remote is the project's default (a team's, in ``.dvc/config``), else the embedded one in
  ``.dvc/config.local``; mcx never writes ``.dvc/config``. A run's checkpoints are added through
  pointer files git carries (``.mcx/checkpoints/<id>/<stage>.dvc``, the one committed part of
  ``.mcx/``), and found again by them or by the md5 recorded in MLflow (D38).

Also: ``dvc_check.py`` (whether a remote holds a version); ``runrecord.py`` (a run directory's JSON records
read strictly: one that is there but not a JSON object is named as damaged, D48); ``lineage.py`` (which run
started from which, ``mcx lineage``, as a typed ``Lineage``); ``sweep_record.py`` (a sweep's MLflow parent run adopting its trials'
runs); ``outage.py`` (the stores a command found unreachable, waited on once, D50).
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
from mcx.track.dvc_store import DvcRecord, ensure_remote, restore, track_checkpoint
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
    "list_baselines", "list_runs", "lookup", "metric_history", "redact", "remove_baseline",
    "resolve", "resolve_target", "restore", "set_baseline", "show_run", "sync", "track_checkpoint",
]
