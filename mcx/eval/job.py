"""One evaluation: the model, the tasks and the harness's settings, its content key, and the job file
the worker reads (``job.json`` in the evaluation's directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attrs import asdict, frozen

from mcx.eval.tasks import TaskSource
from mcx.hashing import digest
from mcx.jsonfile import write_json_atomic

JOB_FILE = "job.json"
SCORES_FILE = "scores.json"
LOG_FILE = "eval.log"
KEY_VERSION = 1  # what the key covers; a change makes every evaluation new


@frozen(kw_only=True)
class EvalSettings:
    """The harness's settings that change a score ([eval] without its tasks)."""

    num_fewshot: int = 0
    limit: int | None = None
    batch_size: int = 8


@frozen(kw_only=True)
class EvalJob:
    """What the worker evaluates: the model in ``model_dir`` on ``device``, through ``interface``."""

    model: dict[str, str]  # the model's identity: {"run": ID} or {"hf": content sha256}
    model_dir: str
    device: str  # "cpu" or "cuda"
    tasks: tuple[TaskSource, ...]
    settings: EvalSettings
    harness: str  # lm-eval's version
    # The harness's model: "hf" (HFLM on the Hugging Face directory ``model_dir``) or "megatron" (MegatronLM over
    # the run's own weights, ``model_dir`` its run directory). Not in the key: both score alike (D72).
    interface: str = "hf"

    def key(self) -> str:
        """The evaluation's content address: model, settings, harness version and each task's identity. The
        batch size and the device are left out: they change how fast, not what (a score equal to the last digit is
        not promised across devices, so the device is in the record beside the scores)."""
        return digest({"v": KEY_VERSION, "model": self.model, "harness": self.harness,
                       "num_fewshot": self.settings.num_fewshot, "limit": self.settings.limit,
                       "tasks": [t.identity() for t in self.tasks]})

    def names(self) -> list[str]:
        return [name for t in self.tasks for name in t.names]

    def include_paths(self) -> list[str]:
        return [t.directory for t in self.tasks if t.directory is not None]


def write_job(job: EvalJob, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / JOB_FILE, job_to_dict(job))
    return directory / JOB_FILE


def job_to_dict(job: EvalJob) -> dict[str, Any]:
    return asdict(job, recurse=True, value_serializer=lambda _i, _a, v: list(v) if isinstance(v, tuple) else v)


def read_job(directory: Path) -> EvalJob:
    raw = json.loads((directory / JOB_FILE).read_text(encoding="utf-8"))
    tasks = tuple(TaskSource(given=t["given"], names=tuple(t["names"]), directory=t["directory"],
                             files=tuple(tuple(f) for f in t["files"])) for t in raw["tasks"])
    return EvalJob(model=raw["model"], model_dir=raw["model_dir"], device=raw["device"], tasks=tasks,
                   settings=EvalSettings(**raw["settings"]), harness=raw["harness"],
                   interface=raw.get("interface", "hf"))
