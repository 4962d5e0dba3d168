"""`mcx eval RUN_ID|hf:DIR`: lm-evaluation-harness on a run's weights (its Hugging Face export) or on a model
directory, content-addressed (D68).

The key is the model's identity (the run ID, or the directory's content), the harness's settings, its version
and every task's identity (mcx.eval.job); ``.mcx/evals/<key>/`` keeps the job, the harness's log and the
scores, so the same evaluation asked again is read back, not recomputed. A run's evaluation also goes into its
directory (``eval.json``), its MLflow record (``eval/<task>/<metric>`` and ``..._stderr``) and run.json's summary.
With ``[eval] every = N`` the checkpoints of the full stage at multiples of N are evaluated too, one evaluation
each (keyed by the run ID and the step), into ``eval-steps.json`` and MLflow at their steps (D71).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attrs import evolve, field, frozen

from mcx.contract.result import read_stage_result
from mcx.contract.status import Status
from mcx.errors import InputError, McxError, RunIdError
from mcx.eval.job import LOG_FILE, SCORES_FILE, EvalJob, EvalSettings, write_job
from mcx.eval.scores import PREFIX, RUN_FILE, STEPS_FILE, Evaluation, read_evaluation, steps_to_dict
from mcx.eval.steps import every_steps
from mcx.eval.tasks import harness_version, resolve_tasks
from mcx.eval.worker import OFFLINE
from mcx.fingerprint.init_from import check_checkpoint, run_source
from mcx.hashing import digest, file_sha256
from mcx.jsonfile import write_json_atomic
from mcx.ops.progress import Note, Progress, quiet
from mcx.spec import loads_spec
from mcx.spec.schema import EvalSpec
from mcx.track import paths

EVALS = "evals"  # under .mcx/: one directory per evaluation key
EXPORT_DIR = "eval-hf"  # a run directory's Hugging Face export, made for its first evaluation
STEP_EXPORTS = "eval-hf-steps"  # a checkpoint's export while it is evaluated (removed after: one model each)
LOG_TAIL = 30  # lines of the harness's log quoted when it fails
# [eval] model -> (what the progress line calls it, the worker module that runs it)
WORKERS = {"hf": ("its Hugging Face model on the export", "mcx.eval"),
           "megatron": ("its model interface over the run's Megatron-Core model", "mcx.train.eval_model")}


@frozen(kw_only=True)
class EvalOverrides:
    """What `mcx eval` flags set in place of the run's [eval] table (None: the table's)."""

    tasks: tuple[str, ...] | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    batch_size: int | None = None
    every: int | None = None  # the checkpoints at multiples of this step too; 0: the final weights only
    fresh: bool = False  # compute again even when the cache holds this evaluation (its scores are replaced)


@frozen(kw_only=True)
class EvalOutcome:
    """What `mcx eval` returns: the evaluation, what it evaluated, and where its files are."""

    target: str  # the run ID or hf:DIR as given
    run_id: str | None
    evaluation: Evaluation
    directory: str  # .mcx/evals/<key>
    steps: dict[int, Evaluation] = field(factory=dict)  # [eval] every: each evaluated checkpoint's step -> its evaluation (D71)
    steps_error: str | None = None  # why a checkpoint's evaluation failed (the final scores and earlier steps stand)

    def to_dict(self) -> dict[str, Any]:
        out = {"target": self.target, "run_id": self.run_id, "directory": self.directory, **self.evaluation.to_dict()}
        if self.steps:
            out["steps"] = steps_to_dict(self.steps)["steps"]
        if self.steps_error is not None:
            out["steps_error"] = self.steps_error
        return out


def evaluate(target: str, project: Path, *, overrides: EvalOverrides = EvalOverrides(),
             progress: Progress = quiet, recorder: Any = None) -> EvalOutcome:
    """Evaluate ``target`` (a run ID or ``hf:DIR``) with the run's [eval] table as ``overrides`` change it.
    ``recorder``: the run's RunRecorder when `mcx run` calls this after its full stage (else one is loaded)."""
    root = Path(project).resolve()
    if target.startswith("hf:"):
        return _evaluate_dir(target, root, overrides, progress)
    return evaluate_run(target, root, overrides=overrides, progress=progress, recorder=recorder)


def evaluate_run(run_id: str, root: Path, *, overrides: EvalOverrides = EvalOverrides(), progress: Progress = quiet,
                 recorder: Any = None, spec_eval: EvalSpec | None = None) -> EvalOutcome:
    run_dir = root / paths.STATE_DIR / paths.RUNS / run_id
    if not re.fullmatch(r"[0-9a-f]{12}", run_id) or not (run_dir / "spec.toml").is_file():
        raise RunIdError(f"no run {run_id} in this project;", "`mcx ls` lists the runs here; a model directory is "
                         "given as hf:DIR.")
    full = read_stage_result(run_dir / "full")
    if full is None or full.status != Status.FINISHED:
        raise InputError(f"run {run_id} has no finished full stage to evaluate;",
                         f"`mcx run` it to the end first (`mcx show {run_id}` says where it stopped).")
    if spec_eval is None:
        spec_eval = loads_spec((run_dir / "spec.toml").read_text(encoding="utf-8"), str(run_dir / "spec.toml")).eval
    device = "cuda" if full.details.get("device") == "cuda" else "cpu"  # the run's own hardware
    job = evolve(_job({"run": run_id}, "", device, spec_eval, overrides, root, what=f"run {run_id}"),
                 interface=spec_eval.model)
    last = full.steps or 0
    every = spec_eval.every if overrides.every is None else overrides.every
    if every is not None and every < 0:
        raise InputError(f"--every {every} must be at least 0;", "give --every 0 (the final weights only) or a step.")
    wanted = every_steps(every, last - 1)  # the last step's weights are the final evaluation's
    for step in wanted:  # each checkpoint there before anything is evaluated (kept for [eval] every, D71)
        run_source(root, run_id, step, key="eval", step_key="--every")

    def export() -> str:
        return str(_export(run_id, root, run_dir, full.steps, progress))

    model_dir = (lambda: _own_weights(root, run_id, run_dir, full.steps)) if job.interface == "megatron" else export
    evaluation, directory = _cached_or_run(job, root, model_dir, overrides.fresh, progress)
    write_json_atomic(run_dir / RUN_FILE, evaluation.to_dict())
    if recorder is None:  # a finished run evaluated afterwards: its summary gains the scores (`mcx run` adds its own)
        _add_to_summary(run_dir, evaluation.metrics())
    steps: dict[int, Evaluation] = {}
    steps_error = None
    for step in wanted:
        try:
            steps[step] = _evaluate_step(job, run_id, root, run_dir, step, overrides.fresh, progress)
        except McxError as exc:  # the final weights' scores stand, recorded below; `mcx eval ID` retries the rest
            steps_error = f"the evaluation of the checkpoint of step {step} failed: {exc}" + \
                (f" ({exc.hint})" if exc.hint else "")
            break
    if steps:
        write_json_atomic(run_dir / STEPS_FILE, steps_to_dict({**steps, last: evaluation}))
    _record(root, run_dir, [*steps.items(), (last, evaluation)], recorder)
    return EvalOutcome(target=run_id, run_id=run_id, evaluation=evaluation, directory=str(directory),
                       steps={**steps, last: evaluation} if steps else {}, steps_error=steps_error)


def _evaluate_step(job: EvalJob, run_id: str, root: Path, run_dir: Path, step: int, fresh: bool,
                   progress: Progress) -> Evaluation:
    """The checkpoint of ``step`` evaluated as the final weights are (read by the Megatron-Core interface, or
    exported for this evaluation only), keyed by the run ID and the step."""
    dest = run_dir / STEP_EXPORTS / f"step-{step}"
    at_step = evolve(job, model={"run": run_id, "step": str(step)})
    model_dir = (lambda: _own_weights(root, run_id, run_dir, step)) if job.interface == "megatron" else \
        (lambda: str(_export(run_id, root, run_dir, step, progress, dest=dest)))
    try:
        evaluation, _ = _cached_or_run(at_step, root, model_dir, fresh, progress, label=f" at step {step}")
    finally:
        shutil.rmtree(dest, ignore_errors=True)
        with contextlib.suppress(OSError):  # another evaluation's export may still be there
            dest.parent.rmdir()
    return evaluation


def _own_weights(root: Path, run_id: str, run_dir: Path, step: int | None) -> str:
    """The Megatron-Core interface reads the checkpoint of ``step`` itself (the job's model names the step, or the
    final one): checked as an export checks it."""
    found = run_source(root, run_id, step, key="eval", step_key="--step")
    check_checkpoint(root, run_id, Path(found["info"]["path"]), "eval")
    return str(run_dir)


def _evaluate_dir(target: str, root: Path, overrides: EvalOverrides, progress: Progress) -> EvalOutcome:
    if overrides.every:
        raise InputError(f"--every {overrides.every}: {target} is one model directory, with no checkpoints;",
                         "leave --every out for hf:DIR (it evaluates a run's checkpoints).")
    given = target[3:]
    path = Path(given).expanduser()
    path = (path if path.is_absolute() else root / path).resolve()
    if not (path / "config.json").is_file():
        raise InputError(f"{target}: no Hugging Face model directory there (no config.json);",
                         "give hf:DIR with a directory that transformers loads (config.json, *.safetensors, tokenizer).")
    content = {p.relative_to(path).as_posix(): file_sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}
    job = _job({"hf": digest(content)}, str(path), "cpu", EvalSpec(), overrides, root, what=target)
    evaluation, directory = _cached_or_run(job, root, lambda: str(path), overrides.fresh, progress)
    return EvalOutcome(target=target, run_id=None, evaluation=evaluation, directory=str(directory))


def _job(model: dict[str, str], model_dir: str, device: str, table: EvalSpec, overrides: EvalOverrides, root: Path,
         *, what: str) -> EvalJob:
    given = overrides.tasks if overrides.tasks is not None else table.tasks
    if not given:
        raise InputError(f"no evaluation tasks for {what};", "give --tasks NAME|DIR,... (or [eval] tasks in the run's "
                         "spec), e.g. --tasks evals/quickstart_next_line.")
    settings = EvalSettings(
        num_fewshot=table.num_fewshot if overrides.num_fewshot is None else overrides.num_fewshot,
        limit=table.limit if overrides.limit is None else overrides.limit,
        batch_size=table.batch_size if overrides.batch_size is None else overrides.batch_size)
    for flag, value, least in (("--num-fewshot", settings.num_fewshot, 0), ("--limit", settings.limit, 1),
                               ("--batch-size", settings.batch_size, 1)):
        if value is not None and value < least:
            raise InputError(f"{flag} {value} must be at least {least};", f"give {flag} {least} or more.")
    return EvalJob(model=model, model_dir=model_dir, device=device, tasks=resolve_tasks(tuple(given), root),
                   settings=settings, harness=harness_version())


def _cached_or_run(job: EvalJob, root: Path, model_dir: Callable[[], str], fresh: bool,
                   progress: Progress, label: str = "") -> tuple[Evaluation, Path]:
    """``label``: what the progress lines add after the task names (" at step N")."""
    directory = root / paths.STATE_DIR / EVALS / job.key()
    found = None if fresh else read_evaluation(directory / SCORES_FILE)
    if found is not None:
        progress(Note(lead="eval", text=f": {', '.join(job.names())}{label} from the cache "
                                        f"({directory.relative_to(root)})"))
        return evolve(found, cached=True), directory
    job = evolve(job, model_dir=model_dir())
    write_job(job, directory)
    progress(Note(lead="eval", text=f": {', '.join(job.names())}{label} with lm-evaluation-harness {job.harness} on "
                  f"{job.device}, {WORKERS[job.interface][0]} (log: {(directory / LOG_FILE).relative_to(root)})"))
    env = {**os.environ, **OFFLINE}
    with open(directory / LOG_FILE, "wb") as log:
        code = subprocess.call([sys.executable, "-m", WORKERS[job.interface][1], str(directory)], cwd=root, env=env,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    evaluation = read_evaluation(directory / SCORES_FILE) if code == 0 else None
    if evaluation is None:
        tail = (directory / LOG_FILE).read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        raise McxError(f"lm-evaluation-harness failed (exit {code}) on {', '.join(job.names())}:\n  "
                       + "\n  ".join(tail), f"its whole log is {directory / LOG_FILE}; a registry task needs its "
                       "dataset in the local datasets cache (HF_DATASETS_CACHE), as nothing is downloaded.")
    return evaluation, directory


def _export(run_id: str, root: Path, run_dir: Path, step: int | None, progress: Progress,
            dest: Path | None = None) -> Path:
    """The run's final checkpoint (the full stage's last ``step``: `mcx run` evaluates before it marks the run
    finished) as a Hugging Face directory in the run directory, written once; ``dest``: another checkpoint's
    export, there."""
    from mcx.ops.hf import export_hf

    which = "final checkpoint" if dest is None else f"checkpoint of step {step}"
    dest = run_dir / EXPORT_DIR if dest is None else dest
    if (dest / "config.json").is_file():
        return dest
    progress(Note(lead="eval", text=f": exporting run {run_id}'s {which} to {dest.relative_to(root)}"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".eval-hf-", dir=dest.parent))
    try:
        export_hf(run_id, root, str(scratch / "hf"), step=step)
        try:
            os.rename(scratch / "hf", dest)
        except OSError:  # another evaluation of this run exported it meanwhile: the same bytes
            if not (dest / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def _add_to_summary(run_dir: Path, metrics: dict[str, float]) -> None:
    run_json = paths.read_json(run_dir / "run.json")
    summary = run_json.get("summary") if isinstance(run_json, dict) else None
    if not isinstance(summary, dict) or not isinstance(summary.get("final"), dict):
        return
    summary["final"] = {**{k: v for k, v in summary["final"].items() if not k.startswith(PREFIX)}, **metrics}
    write_json_atomic(run_dir / "run.json", run_json)


def _record(root: Path, run_dir: Path, evaluations: list[tuple[int, Evaluation]], recorder: Any) -> None:
    """The scores in the run's MLflow record at the step each judged, through its journal (sent now, or by `mcx
    sync`); the final evaluation last, so its key is the run's ``mcx.eval.key`` tag."""
    from mcx.track.recorder import RunRecorder

    own = recorder is None
    if own:
        try:
            recorder = RunRecorder.load(root, run_dir)
        except InputError:  # never recorded (a run copied in without its track/): the files keep the scores
            return
    for step, evaluation in evaluations:
        recorder.record_eval(evaluation.metrics(), step=step, key=evaluation.key)
    if own:
        recorder.close()
