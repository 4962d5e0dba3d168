"""RunRecorder: everything mcx records about one run directory, spooled first, then sent.

The control plane calls, in order::

    recorder = RunRecorder.for_run(project_root, run_dir)      # reads spec.toml / fingerprint.json
    recorder.start(launcher="local")                          # parent run: params, tags, artifacts
    recorder.start_stage("smoke")                             # child run; then, while the worker runs:
    with recorder.forwarder("smoke"):                         #   metrics.jsonl -> MLflow, in a thread
        launcher.run(...)
    recorder.finish_stage("smoke", checkpoint=record)          # result.json: status, finals, smoke report
    ...
    recorder.finish("finished")
    report = recorder.close()                                 # final send; what is still pending

Every method returns at once: it appends to the journal (mcx.track.journal) and the sending happens
in the forwarder's thread, in ``flush()``/``close()``, or later in ``mcx sync``. Nothing here raises
because the tracking store is down; ``close()`` says what waits for ``mcx sync``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import threading
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mcx.contract.status import Status
from mcx.errors import InputError, SpecError
from mcx.spec.load import loads_spec, spec_to_dict
from mcx.track import paths
from mcx.track.artifacts import Stager, end_artifacts, run_artifacts
from mcx.track.forward import POLL_S, MetricsForwarder
from mcx.track.journal import FlushResult, Journal
from mcx.track.mlflow_records import TAG_VALUE_LIMIT, clip, fingerprint_tags, scalar_text, spec_params
from mcx.track.outage import Outage, Outages
from mcx.track.redact import redact_text
from mcx.track.send import SyncEntry, sync_recorder
from mcx.track.target import Target, describe_error, is_transient, outage_reason, resolve_target, target_from_name

if TYPE_CHECKING:
    from mcx.track.mlflow_store import MlflowStore

log = logging.getLogger(__name__)

TARGET_FILE = "target.json"
IDS_FILE = "ids.json"
LOCK_FILE = "lock"
RUN = "run"
# How long the end of `mcx run` (close()) sends before it leaves the rest to `mcx sync`: a store that
# answers, slowly, would otherwise hold the finished run and its lock for as long as it likes (D50).
CLOSE_SEND_S = 30.0
# The step-time model's check (mcx.plan.steptime.PredictionCheck) as MLflow metrics: not summary metrics (the
# median step it is compared with leaves out the stalls that docs/metrics.md's step_time_s counts).
PREDICTION_METRICS = {"predicted_s": "step_time_model_s", "measured_s": "step_time_median_s",
                      "error": "step_time_model_error", "host_layer_s": "step_time_host_layer_s"}
# result.json / run status -> MLflow run status
MLFLOW_STATUS = {Status.RUNNING: "RUNNING", Status.FINISHED: "FINISHED", Status.FAILED: "FAILED",
                 Status.DIVERGED: "FAILED", Status.PREEMPTED: "KILLED", Status.INTERRUPTED: "KILLED", "killed": "KILLED",
                 Status.PRUNED: "KILLED"}
_LABEL = re.compile(r"^[A-Za-z0-9._:\-]{1,64}$")


def now_ms() -> int:
    return int(time.time() * 1000)


def stage_record(stage: str) -> str:
    return f"stage:{stage}"


class RunRecorder:
    """The MLflow record of one run directory (a run, or a reproduction of one)."""

    def __init__(
        self, project_root: Path, run_dir: Path, *, target: Target, experiment: str, run_id: str,
        reproduces: str | None = None, reproduction: str | None = None, attempt: int = 1,
        outages: Outages | None = None,
    ) -> None:
        if (reproduces is None) != (reproduction is None):
            raise ValueError("a reproduction needs both reproduces= and reproduction=")
        if reproduction is not None and not _LABEL.fullmatch(reproduction):
            raise InputError(f"reproduction label {reproduction!r} is not a plain name",
                             "use letters, digits, '.', '_', '-' or ':' (at most 64).")
        self.project_root = Path(project_root).resolve()
        self.run_dir = Path(run_dir).resolve()
        self.track_dir = self.run_dir / paths.TRACK_DIR
        self.target = target
        self.experiment = experiment
        self.run_id = self._checked(run_id)
        self.reproduces = paths.check_run_id(reproduces) if reproduces is not None else None
        self.reproduction = reproduction
        self.attempt = attempt  # > 1 for `mcx run --force`: a new MLflow parent run beside the archived one's
        self.journal = Journal(self.track_dir)
        self.stager = Stager(self.run_dir)
        self._send_lock = threading.RLock()
        self._last_send_error: str | None = None  # a failure is logged once at warning level, not per flush
        self._store: MlflowStore | None = None
        self.outages = outages if outages is not None else Outages()  # shared by every recorder of an `mcx sync`
        self._bind_target()

    def _checked(self, run_id: str) -> str:
        """The record's name, checked: a run ID here; a sweep's name for mcx.track.sweep_record."""
        return paths.check_run_id(run_id)

    # construction ------------------------------------------------------------------------------
    @classmethod
    def for_run(
        cls, project_root: Path, run_dir: Path, *, tracking_uri: str | None = None,
        reproduces: str | None = None, reproduction: str | None = None,
    ) -> RunRecorder:
        """A recorder for a run directory holding spec.toml (and fingerprint.json)."""
        run_dir = Path(run_dir)
        spec = _read_spec_table(run_dir)
        tracking = spec.get("tracking") or {}
        experiment = tracking.get("experiment") or spec.get("name")
        if not experiment:
            raise InputError(f"{run_dir / 'spec.toml'} has no name",
                             "the run directory is damaged; run the spec again.")
        target = resolve_target(project_root, tracking_uri if tracking_uri is not None else tracking.get("uri"))
        fp = paths.read_json(run_dir / "fingerprint.json", {}) or {}
        run_id = fp.get("run_id") or run_dir.name
        attempt = (paths.read_json(run_dir / "run.json", {}) or {}).get("attempt", 1)
        return cls(project_root, run_dir, target=target, experiment=experiment, run_id=run_id,
                   reproduces=reproduces, reproduction=reproduction, attempt=attempt if isinstance(attempt, int) else 1)

    @classmethod
    def load(cls, project_root: Path, run_dir: Path, tracking_uri: str | None = None,
             outages: Outages | None = None) -> RunRecorder:
        """The recorder a previous process set up in ``run_dir`` (for ``mcx sync``).

        ``tracking_uri`` sends the run to another store instead (everything is replayed there);
        ``outages``: the stores this command found down (shared by every run it syncs).
        """
        state = paths.read_json(Path(run_dir) / paths.TRACK_DIR / TARGET_FILE)
        if not isinstance(state, dict) or "target" not in state:
            raise InputError(f"{run_dir} has no tracking state", "it was never recorded; nothing to sync.")
        target = (resolve_target(project_root, tracking_uri) if tracking_uri is not None
                  else target_from_name(project_root, state["target"]))
        return cls(project_root, run_dir, target=target, experiment=state["experiment"], run_id=state["run_id"],
                   reproduces=state.get("reproduces"), reproduction=state.get("reproduction"),
                   attempt=state.get("attempt", 1), outages=outages)

    def _bind_target(self) -> None:
        state: dict[str, object] = {"target": self.target.name, "experiment": self.experiment, "run_id": self.run_id,
                 "reproduces": self.reproduces, "reproduction": self.reproduction}
        if self.attempt > 1:
            state["attempt"] = self.attempt
        old = paths.read_json(self.track_dir / TARGET_FILE)
        if old == state:
            return
        where = ("target", "experiment")
        if isinstance(old, dict) and [old.get(k) for k in where] != [state[k] for k in where]:
            # A different store or experiment: everything journaled is sent there again from the start.
            self.journal.reset()
            paths.write_json_atomic(self.track_dir / IDS_FILE, {})
        paths.write_json_atomic(self.track_dir / TARGET_FILE, state)

    # identities --------------------------------------------------------------------------------
    def _anchor_identity(self) -> dict[str, str]:
        reproduces, reproduction = self.reproduces, self.reproduction
        if reproduces is None or reproduction is None:  # set together (__init__)
            ident = {"mcx.run_id": self.run_id, "mcx.record": RUN}
            return ident if self.attempt == 1 else {**ident, "mcx.attempt": str(self.attempt)}
        return {"mcx.record": "reproduction", "mcx.reproduces": reproduces, "mcx.reproduction": reproduction}

    def record_uuid(self, record: str) -> str | None:
        """The MLflow run ID of ``record`` ("run" or "stage:<name>") once it exists there."""
        ids = self._ids()
        return ids.get("records", {}).get(record)

    def _ids(self) -> dict[str, Any]:
        ids = paths.read_json(self.track_dir / IDS_FILE, {}) or {}
        return ids if ids.get("target") == self.target.name else {"target": self.target.name, "records": {}}

    def _save_ids(self, ids: dict[str, Any]) -> None:
        paths.write_json_atomic(self.track_dir / IDS_FILE, ids)

    # journaling --------------------------------------------------------------------------------
    def _op(self, op: str, **fields: Any) -> None:
        self.journal.append({"op": op, "time_ms": now_ms(), **fields})

    def _artifact(self, record: str, rel_file: str, dest: str | None) -> None:
        self._op("artifact", record=record, file=rel_file, dest=dest)

    def start(self, *, launcher: str | None = None, slurm_job_id: str | None = None,
              tags: dict[str, str] | None = None) -> None:
        """Journal the parent record: experiment, run, params, tags, and the run's artifacts."""
        spec = _resolved_spec(self.run_dir)
        fp = paths.read_json(self.run_dir / "fingerprint.json")
        anchor_tags = {
            "mcx.run_id": self.run_id,
            "mcx.spec_name": str(spec.get("name", "")),
            "mcx.seed": scalar_text((spec.get("train") or {}).get("seed")),
            "mcx.launcher": launcher or str((spec.get("launch") or {}).get("kind", "local")),
            "mcx.host": socket.gethostname(),
            "mcx.status": "running",
        }
        job_id = slurm_job_id or os.environ.get("SLURM_JOB_ID")
        if job_id:
            anchor_tags["mcx.slurm.job_id"] = job_id
        if isinstance(fp, dict):
            anchor_tags.update(fingerprint_tags(fp))
        anchor_tags.update(tags or {})
        name = (self.run_id if self.reproduces is None
                else f"{self.run_id} reproduces {self.reproduces} ({self.reproduction})")
        parent_identity = {"mcx.run_id": self.reproduces, "mcx.record": RUN} if self.reproduces else None
        self._op("experiment", name=self.experiment)
        self._op("open", record=RUN, identity=self._anchor_identity(), parent=None, parent_identity=parent_identity,
                 tags={k: clip(redact_text(v), TAG_VALUE_LIMIT) for k, v in anchor_tags.items()},
                 name=name, start_ms=now_ms())
        self._op("params", record=RUN, params=spec_params(spec))
        for rel_file, dest in run_artifacts(self.stager, self.project_root):
            self._artifact(RUN, rel_file, dest)

    def start_stage(self, stage: str, *, tags: dict[str, str] | None = None) -> None:
        """Journal the stage's child run (params: the stage's own spec from job.json, if written)."""
        record = stage_record(stage)
        stage_dir = self.run_dir / stage
        stage_tags = {"mcx.record": "stage", "mcx.run_id": self.run_id, "mcx.status": "running", **(tags or {})}
        self._op("open", record=record, identity={"mcx.stage": stage}, parent=RUN, parent_identity=None,
                 tags={k: clip(redact_text(v), TAG_VALUE_LIMIT) for k, v in stage_tags.items()},
                 name=f"{self.run_id}/{stage}", start_ms=now_ms())
        job = paths.read_json(stage_dir / "job.json")
        if isinstance(job, dict):
            if isinstance(job.get("spec"), dict):
                self._op("params", record=record, params=spec_params(job["spec"]))
            layout = {f"mcx.layout.{k}": scalar_text(v) for k, v in (job.get("layout") or {}).items()}
            if layout:
                self._op("tags", record=record, tags=layout)
            self._artifact(record, self.stager.json(f"{stage}/job.json", job), None)

    def forwarder(self, stage: str, *, poll_s: float | None = None) -> MetricsForwarder:
        """A MetricsForwarder for the stage (use as a context manager around the worker)."""
        return MetricsForwarder(self, stage, poll_s=POLL_S if poll_s is None else poll_s)

    def finish_stage(self, stage: str, *, checkpoint: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Journal the stage's outcome from its result.json; returns the result (None if absent).

        ``checkpoint`` is what mcx.track.dvc_store.track_checkpoint returned for the stage.
        """
        record = stage_record(stage)
        result = paths.read_json(self.run_dir / stage / paths.RESULT_FILE)
        if isinstance(result, dict):
            status = str(result.get("status", Status.FAILED))
            tags = {"mcx.status": status, "mcx.passed": scalar_text(result.get("passed")),
                    "mcx.steps": scalar_text(result.get("steps")),
                    "mcx.layer_spec": scalar_text(result.get("layer_spec"))}
            if result.get("error"):
                tags["mcx.error"] = clip(redact_text(str(result["error"])), TAG_VALUE_LIMIT)
            for name, check in (result.get("checks") or {}).items():
                if isinstance(check, dict) and "passed" in check:
                    tags[f"mcx.check.{name}"] = "pass" if check["passed"] else "fail"
            self._op("tags", record=record, tags=tags)
            copy = self.stager.json(f"{stage}/result.json", result)
            self._artifact(record, copy, None)
            if stage == "smoke":
                self._artifact(RUN, copy, "smoke")  # the smoke report, on the parent run too
            finals = {k: float(v) for k, v in (result.get("final") or {}).items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
            prefix = "" if stage == "full" else f"{stage}/"
            finals.update(_drawn_metrics(result))
            if finals:
                self._op("metrics", record=RUN, metrics={prefix + k: v for k, v in finals.items()},
                         step=int(result.get("steps") or 0))
            end_status = MLFLOW_STATUS.get(status, "FAILED")
        else:
            result = None
            end_status = "KILLED"
            self._op("tags", record=record, tags={"mcx.status": Status.INTERRUPTED})
        if checkpoint:
            ck = {f"mcx.checkpoint.{stage}.{k}": scalar_text(v) for k, v in checkpoint.items()
                  if k in ("md5", "nfiles", "size", "path", "remote")}
            self._op("tags", record=RUN, tags=ck)
            dvc_file = checkpoint.get("dvc_file")
            if dvc_file and Path(dvc_file).is_file():
                self._artifact(RUN, self.stager.file(f"run/checkpoints/{stage}.dvc", Path(dvc_file)), "checkpoints")
        self._op("status", record=record, status=end_status, end_ms=now_ms())
        return result

    def record_prediction(self, check: dict[str, Any], *, step: int) -> None:
        """The step-time model's prediction beside the measured median step (mcx.plan.steptime.PredictionCheck)."""
        self._op("metrics", record=RUN, step=step,
                 metrics={name: float(check[k]) for k, name in PREDICTION_METRICS.items() if k in check})
        self._op("tags", record=RUN, tags={"mcx.step_time.gpu": str(check["gpu"])})

    def record_eval(self, metrics: dict[str, float], *, step: int, key: str) -> None:
        """A downstream evaluation's scores (``eval/<task>/<metric>`` and their ``_stderr``, mcx.eval.scores) at
        the step of the weights it judged, and its key (D68)."""
        self._op("metrics", record=RUN, step=step, metrics=dict(metrics))
        self._op("tags", record=RUN, tags={"mcx.eval.key": key})

    def finish(self, status: str, *, tags: dict[str, str] | None = None) -> None:
        """Journal the run's end: status tag, run.json and plots/ as artifacts, MLflow status."""
        if status not in MLFLOW_STATUS:
            raise ValueError(f"unknown run status {status!r}; one of {sorted(MLFLOW_STATUS)}")
        self._op("tags", record=RUN, tags={"mcx.status": status, **(tags or {})})
        for rel_file, dest in end_artifacts(self.stager):
            self._artifact(RUN, rel_file, dest)
        self._op("status", record=RUN, status=MLFLOW_STATUS[status], end_ms=now_ms())

    # sending -----------------------------------------------------------------------------------
    def store(self) -> MlflowStore:
        if self._store is None:
            from mcx.track.mlflow_store import MlflowStore

            self._store = MlflowStore(self.target)
        return self._store

    @contextmanager
    def sending(self) -> Iterator[bool]:
        """Hold this run's send lock (threads and processes); yields False if another process has it."""
        with self._send_lock:
            self.track_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.track_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)

    def down(self) -> Outage | None:
        """The outage this command found for the store, if any (its sends are skipped until it clears)."""
        return self.outages.get(self.target.name)

    def flush(self, *, probe: bool = False, until: float | None = None) -> FlushResult:
        """Send every journaled operation not yet acknowledged, in order; stop at the first failure, or
        before an operation once ``time.monotonic()`` is past ``until``.

        A store this command found down is not tried again (the records stay spooled), unless ``probe``:
        the forwarder's polls during training ask whether it came back."""
        outage = None if probe else self.down()
        if outage is not None:
            return FlushResult(0, len(self.journal.pending()), outage.reason, transient=True)
        with self.sending() as mine:
            if not mine:
                return FlushResult(0, len(self.journal.pending()), busy=True)
            return self._flush_locked(until)

    def _flush_locked(self, until: float | None = None) -> FlushResult:
        pending = self.journal.pending()
        sent = 0
        started = time.monotonic()
        for op in pending:
            if until is not None and time.monotonic() > until:
                return FlushResult(sent, len(pending) - sent, f"the store answered too slowly: {sent} of "
                                   f"{len(pending)} records sent in {time.monotonic() - started:.0f} s",
                                   transient=True)
            t0 = time.monotonic()
            try:
                store = self.store()
                t0 = time.monotonic()  # the request's wait, not mlflow's import
                ids = self._ids()
                if store.apply(op, ids, run_dir=self.run_dir, experiment=self.experiment):
                    self._save_ids(ids)
            except Exception as exc:  # noqa: BLE001 - every failure leaves the op spooled
                return self._failed(exc, time.monotonic() - t0, f"tracking operation {op['seq']}",
                                    FlushResult(sent, len(pending) - sent))
            self.outages.clear(self.target.name)
            self.journal.ack(op["seq"])
            sent += 1
        return FlushResult(sent, 0)

    def _failed(self, exc: Exception, waited_s: float, what: str, left: FlushResult) -> FlushResult:
        """``left`` with the failure's reason; a store that cannot be reached is marked down for this command."""
        transient = is_transient(exc)
        msg = outage_reason(exc) if transient else describe_error(exc)
        if transient:
            self.outages.mark(self.target, msg, waited_s)
        level = logging.DEBUG if transient or msg == self._last_send_error else logging.WARNING
        self._last_send_error = msg
        log.log(level, "%s of run %s stays spooled: %s", what, self.run_id, describe_error(exc))
        return FlushResult(left.sent, left.pending, msg, transient)

    def stages(self) -> list[str]:
        """Stages this run opened, in order."""
        seen: list[str] = []
        for op in self.journal.ops():
            recorder = op.get("record", "")
            if op.get("op") == "open" and recorder.startswith("stage:") and recorder[6:] not in seen:
                seen.append(recorder[6:])
        return seen

    def close(self) -> SyncEntry:
        """Send everything still pending (journal and every stage's metrics) for at most CLOSE_SEND_S, so
        that a slow store cannot hold the run (and its lock) after its last stage; say what is left."""
        return sync_recorder(self, until=time.monotonic() + CLOSE_SEND_S)


def _drawn_metrics(result: dict[str, Any]) -> dict[str, float]:
    """A mixture's realised shares as metrics: ``data/mix.web/samples`` and ``data/mix.web/share`` per component
    (result.json's ``details.mixture``, D60); none for one dataset."""
    details = result.get("details")
    mixture = details.get("mixture") if isinstance(details, dict) else None
    out: dict[str, float] = {}
    for name, part in (mixture or {}).items() if isinstance(mixture, dict) else ():
        for key in ("samples", "share"):
            value = part.get(key) if isinstance(part, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"data/{name}/{key}"] = float(value)
    return out


def _read_spec_table(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "spec.toml"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"no spec.toml in {run_dir}",
                         "write the run directory (mcx run does) before recording it.") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML ({exc})",
                         "the run directory is damaged; run the spec again.") from None


def _resolved_spec(run_dir: Path) -> dict[str, Any]:
    """The run's spec with every default filled in (as the run ID hashed it), else the raw table."""
    path = Path(run_dir) / "spec.toml"
    try:
        return spec_to_dict(loads_spec(path.read_text(encoding="utf-8"), str(path)))
    except (SpecError, FileNotFoundError):
        return _read_spec_table(run_dir)
