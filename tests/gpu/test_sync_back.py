"""The CPU side of the GPU suite's `mcx run`: `mcx sync` sends what the GPU machine journaled.

The GPU machine has no MLflow: tests/gpu/test_mcx_run.py leaves the project it ran in (run directories and
their journals, no checkpoints) as mcx-run-project.tar.gz in the suite's output folder. Here, where MLflow is
installed, point MCX_GPU_RESULTS at that folder (or the file) and run this module:

    MCX_GPU_RESULTS=/path/to/OUT .venv/bin/python -m pytest tests/gpu/test_sync_back.py -q -p no:cacheprovider

Without MCX_GPU_RESULTS it is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from gpuwork import mcx

ARCHIVE = "mcx-run-project.tar.gz"


def _archive() -> Path | None:
    given = os.environ.get("MCX_GPU_RESULTS")
    if not given:
        return None
    path = Path(given)
    return path / ARCHIVE if path.is_dir() else path


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    _archive() is None, reason="MCX_GPU_RESULTS is not set: it names the GPU suite's output folder "
    "(bash benchmarks/gpu/suite.sh OUT --only gpu), whose mcx-run-project.tar.gz this syncs")]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    archive = _archive()
    assert archive.is_file(), f"{archive} is missing: the GPU suite's test_mcx_run.py writes it"
    root = tmp_path_factory.mktemp("synced")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root / "project"


def test_sync_sends_every_journaled_record_and_metric_once(project):
    from mlflow import MlflowClient

    from mcx.track.journal import Journal

    (run_dir,) = [p for p in (project / ".mcx" / "runs").iterdir() if p.is_dir()]
    assert Journal(run_dir / "track").pending(), "nothing journaled: was the run recorded on the GPU machine?"
    first = mcx(project, "sync", "--json")
    assert first.code == 0, first
    report = first.json()
    assert report["ok"] and report["metrics_sent"] > 0, report
    assert Journal(run_dir / "track").pending() == []
    client = MlflowClient(tracking_uri=f"sqlite:///{project / '.mcx' / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    (parent,) = client.search_runs(exps, f"tags.`mcx.run_id` = '{run_dir.name}' and tags.`mcx.record` = 'run'")
    kids = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    stages = {k.data.tags.get("mcx.stage"): k for k in kids}
    assert {"smoke", "full"} <= set(stages), [k.data.tags for k in kids]
    lines = [json.loads(line) for line in (run_dir / "full" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    expected = [(r["step"], r["loss"]) for r in lines if r["kind"] == "train"]
    history = client.get_metric_history(stages["full"].info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == expected
    again = mcx(project, "sync", "--json")
    assert again.code == 0 and again.json()["metrics_sent"] == 0 and again.json()["ops_sent"] == 0, again
