"""The MLflow side: idempotent writes and lookups by mcx identity tags.

Layout in MLflow:

- one experiment per spec name (``[tracking] experiment`` overrides); the embedded store gives each
  experiment its own artifact folder under ``.mcx/mlartifacts``;
- one parent run per mcx run ID: tags ``mcx.run_id=<id>``, ``mcx.record=run``;
- nested child runs (``mlflow.parentRunId``) for the stages (``mcx.stage=smoke|full``) and for each
  reproduction (``mcx.record=reproduction``, ``mcx.reproduces=<run_id>``,
  ``mcx.reproduction=<label>``), whose own stages nest under it.

Runs are found by those tags before one is created, so recording twice (a replay from the spool,
a resumed run, two machines racing) never makes a second run: if a race does create two, both
writers keep the oldest and the other is deleted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from mcx.track.target import Target, open_client

if TYPE_CHECKING:
    from mlflow.entities import Run

PARAMS_PER_BATCH = 100
TAGS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
PARENT_TAG = "mlflow.parentRunId"
RUN_ID_TAG = "mcx.run_id"
RECORD_TAG = "mcx.record"
STAGE_TAG = "mcx.stage"
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")
_FILTER_VALUE = re.compile(r"^[A-Za-z0-9._:\-]+$")
_SEARCH_PAGE = 1000


def _chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def tag_filter(tags: dict[str, str]) -> str:
    """An MLflow search filter matching every tag exactly (values are checked to need no quoting)."""
    clauses = []
    for key, value in sorted(tags.items()):
        if not _FILTER_VALUE.fullmatch(value):
            raise ValueError(f"identity tag {key}={value!r} has characters a search filter cannot hold")
        clauses.append(f"tags.`{key}` = '{value}'")
    return " and ".join(clauses)


class MlflowStore:
    """One tracking store, through MlflowClient; every method is safe to repeat."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.client = open_client(target)

    # experiments -------------------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        """The experiment called ``name``, created (with its artifact location) if absent."""
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=self.target.artifact_location(name))
        except MlflowException:
            exp = self.client.get_experiment_by_name(name)  # created by a racing writer
            if exp is None:
                raise
            return exp.experiment_id

    def all_experiment_ids(self) -> list[str]:
        return [e.experiment_id for e in self.client.search_experiments(max_results=50000)]

    # runs --------------------------------------------------------------------------------------
    def find_runs(self, experiment_ids: list[str], tags: dict[str, str], max_results: int | None = None) -> list[Run]:
        """Active runs carrying every tag in ``tags``, oldest first."""
        if not experiment_ids:
            return []
        out: list[Run] = []
        token = None
        while True:
            page = self.client.search_runs(
                experiment_ids, filter_string=tag_filter(tags), max_results=_SEARCH_PAGE,
                order_by=["attributes.start_time ASC"], page_token=token,
            )
            out.extend(page)
            token = page.token
            if not token or (max_results is not None and len(out) >= max_results):
                break
        out.sort(key=lambda r: (r.info.start_time or 0, r.info.run_id))
        return out if max_results is None else out[:max_results]

    def find_or_create_run(
        self, experiment_id: str, identity: dict[str, str], *, tags: dict[str, str], name: str,
        start_ms: int, parent_uuid: str | None, reopen: bool,
    ) -> str:
        """The run with ``identity`` (plus the parent link), created if there is none."""
        key = dict(identity)
        if parent_uuid is not None:
            key[PARENT_TAG] = parent_uuid
        found = self.find_runs([experiment_id], key)
        if found:
            run = found[0]
            if reopen and run.info.status != "RUNNING":
                self.client.update_run(run.info.run_id, status="RUNNING")
            return run.info.run_id
        created = self.client.create_run(experiment_id, start_time=start_ms, tags={**tags, **key}, run_name=name)
        mine = created.info.run_id
        found = self.find_runs([experiment_id], key)
        keeper = found[0].info.run_id if found else mine
        if keeper != mine:  # a racing writer created the same record first: keep theirs
            self.client.delete_run(mine)
        return keeper

    def find_parent_run(self, run_id: str, experiment_ids: list[str] | None = None) -> Run | None:
        """The parent run recorded for an mcx run ID (its latest attempt), searching every experiment unless told."""
        ids = experiment_ids if experiment_ids is not None else self.all_experiment_ids()
        found = self.find_runs(ids, {RUN_ID_TAG: run_id, RECORD_TAG: "run"})
        return found[-1] if found else None  # the latest attempt (`mcx run --force` adds one)

    def adopt(self, experiment_id: str, parent_uuid: str, child_identity: dict[str, str], tags: dict[str, str]) -> None:
        """Tag the run with ``child_identity`` (its latest attempt) and nest it under ``parent_uuid``, unless it
        is nested elsewhere already (a trial two sweeps share stays under the first). LookupError while that
        run is not in the store yet: the operation stays spooled until it is."""
        found = self.find_runs([experiment_id], child_identity)
        if not found:
            raise LookupError(f"the run {child_identity} is not in the tracking store yet")
        child = found[-1]
        extra = {} if PARENT_TAG in child.data.tags else {PARENT_TAG: parent_uuid}
        self.set_tags(child.info.run_id, {**tags, **extra})

    def children(self, parent: Run) -> list[Run]:
        return self.find_runs([parent.info.experiment_id], {PARENT_TAG: parent.info.run_id})

    # writes ------------------------------------------------------------------------------------
    def log_params(self, run_uuid: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for chunk in _chunks(items, PARAMS_PER_BATCH):
            self.client.log_batch(run_uuid, params=chunk)

    def set_tags(self, run_uuid: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in sorted(tags.items())]
        for chunk in _chunks(items, TAGS_PER_BATCH):
            self.client.log_batch(run_uuid, tags=chunk)

    def log_metrics(self, run_uuid: str, metrics: list[tuple[str, float, int, int]]) -> None:
        """``(key, value, timestamp_ms, step)`` tuples, in batches MLflow accepts."""
        from mlflow.entities import Metric

        items = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in metrics]
        for chunk in _chunks(items, METRICS_PER_BATCH):
            self.client.log_batch(run_uuid, metrics=chunk)

    def log_artifact(self, run_uuid: str, local_path: str, artifact_path: str | None) -> None:
        self.client.log_artifact(run_uuid, local_path, artifact_path)

    def set_status(self, run_uuid: str, status: str, end_ms: int | None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown MLflow run status {status!r}")
        if status == "RUNNING":
            self.client.update_run(run_uuid, status="RUNNING")
        else:
            self.client.set_terminated(run_uuid, status=status, end_time=end_ms)

    # journal operations ------------------------------------------------------------------------
    def apply(self, op: dict[str, Any], ids: dict[str, Any], *, run_dir: Path, experiment: str) -> bool:
        """Carry out one journal operation (mcx.track.journal). ``ids`` maps the journal's record
        names ("run", "stage:<name>") to MLflow run IDs; returns True when it learnt a new one."""
        kind = op["op"]
        records = ids.setdefault("records", {})
        if kind == "experiment":
            ids["experiment_id"] = self.experiment_id(op["name"])
            return True
        learnt = "experiment_id" not in ids
        if learnt:
            ids["experiment_id"] = self.experiment_id(experiment)
        exp_id = ids["experiment_id"]
        if kind == "open":
            parent_uuid = None
            if op.get("parent"):
                parent_uuid = records[op["parent"]]
            elif op.get("parent_identity"):
                found = self.find_runs([exp_id], op["parent_identity"], max_results=1)
                parent_uuid = found[0].info.run_id if found else None
            uuid = self.find_or_create_run(exp_id, op["identity"], tags=op["tags"], name=op["name"],
                                           start_ms=op["start_ms"], parent_uuid=parent_uuid, reopen=True)
            self.set_tags(uuid, op["tags"])
            records[op["record"]] = uuid
            return True
        uuid = records[op["record"]]
        if kind == "params":
            self.log_params(uuid, op["params"])
        elif kind == "tags":
            self.set_tags(uuid, op["tags"])
        elif kind == "artifact":
            self.log_artifact(uuid, str(Path(run_dir) / op["file"]), op.get("dest"))
        elif kind == "metrics":
            self.log_metrics(uuid, [(k, v, op["time_ms"], op["step"]) for k, v in sorted(op["metrics"].items())])
        elif kind == "status":
            self.set_status(uuid, op["status"], op.get("end_ms"))
        elif kind == "adopt":  # another recorder's run becomes this record's child (a sweep's trial)
            self.adopt(exp_id, uuid, op["child_identity"], op["tags"])
        else:
            raise ValueError(f"unknown journal operation {kind!r}")
        return learnt
