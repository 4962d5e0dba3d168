"""An evaluation's scores: the harness's results as typed scores with their standard errors, the file that
keeps them (``scores.json``, in the evaluation's cache directory and as a run's ``eval.json``), and the flat
metrics the record, MLflow, the baseline gate and sweeps read (``eval/<task>/<metric>``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attrs import asdict, frozen

PREFIX = "eval/"
STDERR = "_stderr"
RUN_FILE = "eval.json"  # a run directory's evaluation: the last one `mcx run` or `mcx eval RUN` made
STEPS_FILE = "eval-steps.json"  # with [eval] every: the evaluation of each checkpoint it judged, by step (D71)


_LOWER = ("perplexity", "ppl", "loss", "bits_per_byte", "ter")  # harness metrics where less is better


def is_eval_metric(name: str) -> bool:
    """``eval/<task>/<metric>``: a score (not its standard error)."""
    parts = name.split("/")
    return len(parts) == 3 and parts[0] + "/" == PREFIX and all(parts) and not name.endswith(STDERR)


def eval_better(name: str) -> str:
    """Which way an evaluation metric improves, by the harness's metric name: "lower" or "higher"."""
    last = name.rsplit("/", 1)[-1].lower()
    return "lower" if any(word in last for word in _LOWER) else "higher"


@frozen
class Score:
    task: str
    metric: str  # the harness's metric, with its filter when not "none" (exact_match.strict-match)
    value: float
    stderr: float | None  # the harness's standard error; None where it gives none
    higher_is_better: bool | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.task}/{self.metric}"


@frozen(kw_only=True)
class Evaluation:
    """One evaluation's result: what was evaluated (its key and model), how, and the scores."""

    key: str
    model: dict[str, str]
    harness: str
    device: str
    settings: dict[str, Any]
    tasks: dict[str, dict[str, Any]]  # task -> {"version": ..., "samples": N}
    scores: tuple[Score, ...]
    wall_s: float
    cached: bool = False  # read from the cache, not computed by this command

    def metrics(self) -> dict[str, float]:
        """``eval/<task>/<metric>`` and ``..._stderr``, for MLflow, the baseline gate and sweeps."""
        out: dict[str, float] = {}
        for s in self.scores:
            out[s.name] = s.value
            if s.stderr is not None:
                out[s.name + STDERR] = s.stderr
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self, recurse=True, value_serializer=lambda _i, _a, v: list(v) if isinstance(v, tuple) else v)


def from_harness(results: dict[str, Any], *, key: str, model: dict[str, str], harness: str, device: str,
                 settings: dict[str, Any], wall_s: float) -> Evaluation:
    """The scores of ``lm_eval.simple_evaluate``'s result (its ``results``, ``versions``, ``n-samples`` and
    ``higher_is_better``): every numeric metric, with its ``_stderr`` partner."""
    scores: list[Score] = []
    tasks: dict[str, dict[str, Any]] = {}
    better = results.get("higher_is_better") or {}
    for task, values in sorted((results.get("results") or {}).items()):
        samples = (results.get("n-samples") or {}).get(task) or {}
        tasks[task] = {"version": (results.get("versions") or {}).get(task), "samples": samples.get("effective")}
        for raw, value in sorted(values.items()):
            metric, _, filt = raw.partition(",")
            if metric.endswith(STDERR) or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if better.get(task) and metric not in better[task]:  # bookkeeping (sample_len), not a score
                continue
            stderr = values.get(f"{metric}{STDERR},{filt}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None
            name = metric if filt in ("", "none") else f"{metric}.{filt}"
            scores.append(Score(task, name, float(value), stderr, (better.get(task) or {}).get(metric)))
    return Evaluation(key=key, model=model, harness=harness, device=device, settings=settings, tasks=tasks,
                      scores=tuple(scores), wall_s=wall_s)


def evaluation_from_dict(raw: dict[str, Any]) -> Evaluation:
    scores = tuple(Score(s["task"], s["metric"], float(s["value"]), s.get("stderr"), s.get("higher_is_better"))
                   for s in raw["scores"])
    return Evaluation(key=raw["key"], model=dict(raw["model"]), harness=raw["harness"], device=raw["device"],
                      settings=dict(raw["settings"]), tasks=dict(raw["tasks"]), scores=scores,
                      wall_s=float(raw["wall_s"]), cached=bool(raw.get("cached", False)))


def read_evaluation(path: Path) -> Evaluation | None:
    """The evaluation in ``path``, or None when there is none (or it is torn or damaged)."""
    try:
        return evaluation_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_eval_metrics(run_dir: Path) -> dict[str, float]:
    """A run directory's evaluation as flat metrics (nothing when it was not evaluated)."""
    found = read_evaluation(Path(run_dir) / RUN_FILE)
    return found.metrics() if found is not None else {}


def steps_to_dict(steps: dict[int, Evaluation]) -> dict[str, Any]:
    """``eval-steps.json``: each evaluated checkpoint's step (as a string, JSON's keys) -> its evaluation."""
    return {"steps": {str(step): ev.to_dict() for step, ev in sorted(steps.items())}}


def read_step_evaluations(run_dir: Path) -> dict[int, Evaluation]:
    """A run's evaluations at its checkpoints, by step (none when [eval] every was not set, or the file is damaged)."""
    try:
        raw = json.loads((Path(run_dir) / STEPS_FILE).read_text(encoding="utf-8"))
        return {int(step): evaluation_from_dict(ev) for step, ev in sorted(raw["steps"].items(), key=lambda i: int(i[0]))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
