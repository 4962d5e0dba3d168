"""`mcx tune SPEC`: the micro-batch sweep Megatron users do by hand, as short measured trials.

Start at micro-batch 1 and double until the worker runs out of memory (or the global batch no longer
divides), each trial a few real optimizer steps of the full model on the real hardware through the
spec's own launcher. Each trial reports tokens/s/GPU and peak memory; the fastest setting that fits
is written into a new spec (`extends` the original, so the diff is one key). A trial that ran out of
memory with the allocator's fragments (what ``mcx.plan.memory.fragments`` counts) runs once more with
``train.expandable_segments`` on, which stays on for the larger sizes and is written into the new spec
when the best setting needed it (D27: on H200, micro-batch 8 ran out of memory from fragments alone).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import evolve

from mcx.contract.files import JOB_FILE, METRICS_FILE
from mcx.contract.job import job_to_dict
from mcx.contract.result import read_stage_result
from mcx.errors import BudgetError, InputError, SpecError, TrainingFailed
from mcx.launch import launcher_for, placement, preflight, worker_env
from mcx.metrics.summary import BY_KEY, reduce_values
from mcx.ops.data import ensure_dataset
from mcx.ops.outputs import check_output_file, write_text
from mcx.ops.plan import PlanResult, plan_loaded
from mcx.ops.progress import Note, Progress
from mcx.ops.stage import stage_job
from mcx.plan.fusions import unmeasured_steps
from mcx.plan.memory import ALLOCATOR_SETTING, OOM_TEXTS, fragments
from mcx.plan.smoketime import STARTUP_S as SLURM_STARTUP_S
from mcx.report.tune_results import MEASURED_KEYS, Measured, MicroBatchTrial, Trial, TuneResult
from mcx.spec import ExperimentSpec, load_spec
from mcx.track.runcache import acquire

TUNE_PREFIX = "mcx-tune-"  # <project>/.mcx/mcx-tune-XXXX/: the trials' work directory (mcx gc knows it)
# A trial's start before its first step: a Slurm job's as the smoke stage's limit allows it (mcx.plan.smoketime);
# here, imports, the model's build and the first step's compilation (about a minute on one H200, benchmarks/README.md).
TRIAL_STARTUP_S = {"slurm": SLURM_STARTUP_S, "local": 60.0, "torchrun": 60.0}


def trials_dir(project: Path) -> Path:
    """A fresh work directory for the trials, under <project>/.mcx where there is one (mcx gc knows its prefix)."""
    return Path(tempfile.mkdtemp(prefix=TUNE_PREFIX, dir=project / ".mcx" if (project / ".mcx").is_dir() else None))


def extends_lines(spec_path: str, dest: Path, overrides: list[str]) -> str:
    """A tuned spec's overrides (as comments) and its ``extends`` of the original, relative where it can be."""
    rel = Path(spec_path).resolve()
    try:
        rel = rel.relative_to(dest.resolve().parent)
    except ValueError:
        pass
    return "".join(f"# --set {o}\n" for o in overrides) + f'extends = "{rel}"\n\n'


def trials_gate(spec: ExperimentSpec, step_times: Sequence[float | None], steps: int, *, yes: bool,
                confirm: Callable[[str], bool] | None, progress: Progress) -> float | None:
    """The trials' GPU-hours (their start-ups and steps on the spec's GPUs; None where a step's time is unknown),
    said before any trial starts and held to budget.max_gpu_hours as `mcx run` holds a job: above it, go on only
    with --yes or the user's confirmation, else BudgetError (exit 2) with nothing started."""
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    startup = TRIAL_STARTUP_S.get(spec.launch.kind, TRIAL_STARTUP_S["slurm"])
    known = [s for s in step_times if s is not None]
    hours: float | None = (None if not step_times or len(known) < len(step_times)
                           else sum(startup + (steps + 1) * s for s in known) * world / 3600)
    where = "on Slurm" if spec.launch.kind == "slurm" else "here"
    unit = "CPU process" if spec.hardware.gpu == "cpu" else "GPU"
    size = f"{len(step_times)} trial{'s' * (len(step_times) != 1)} of {steps + 1} steps on {world} {unit}{'s' * (world != 1)}"
    progress(Note(lead="tune", text=f": at most {size} {where}"
                  + (f", about {hours:,.2g} GPU-hours" if hours is not None else "")))
    limit = spec.budget.max_gpu_hours
    if limit is None or hours is None or hours <= limit or yes:
        return hours
    message = f"the trials may use about {hours:,.2g} GPU-hours ({size}), above budget.max_gpu_hours = {limit:,.4g}"
    if confirm is not None and confirm(message + "."):
        return hours
    raise BudgetError(message + ";", "measure fewer (--top, --max-micro-batch) or fewer steps (--steps), raise "
                      "budget.max_gpu_hours, or confirm with --yes.")


def _records(metrics: Path) -> list[dict[str, Any]]:
    out = []
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if record.get("kind") == "train":
                out.append(record)
    return out


def _trial(spec: ExperimentSpec, mbs: int, steps: int, project: Path, work: Path) -> MicroBatchTrial:
    """One micro-batch trial of the sweep."""
    trial = measure_trial(evolve(spec, train=evolve(spec.train, micro_batch_size=mbs)), steps, project, work / f"mbs{mbs}",
                     f"micro_batch_size={mbs}")
    return MicroBatchTrial(micro_batch_size=mbs, trial=trial)


def measure_trial(spec: ExperimentSpec, steps: int, project: Path, stage_path: Path, label: str) -> Trial:
    """A few real optimizer steps of ``spec`` through its own launcher: its figures, or that it ran out of memory."""
    skip = unmeasured_steps(spec.train)  # a graphed trial's eager steps and capture come first, unmeasured
    steps += skip
    tspec = evolve(spec, train=evolve(spec.train, train_iters=steps + 1, eval_interval=10**9,
                                      lr_warmup_iters=min(spec.train.lr_warmup_iters, steps)),
                   checkpoint=evolve(spec.checkpoint, interval=0, async_save=False))
    tpr = plan_loaded(tspec, project, probe_hardware=True)
    job_spec, job_layout = tpr.plan.full.spec, tpr.plan.full.layout
    stage_path.mkdir(parents=True)
    data_dir = ensure_dataset(project, spec.data, remote=spec.tracking.dvc_remote)
    job = stage_job(tpr.plan.full, tpr, stage_path, data_dir, "quiet")
    (stage_path / JOB_FILE).write_text(json.dumps(job_to_dict(job)), encoding="utf-8")
    launcher = launcher_for(job_spec.launch)
    handle = launcher.start(stage_path, placement(job_layout, job.device), job_spec.launch, worker_env(job_spec))
    try:
        while handle.poll() in ("pending", "running") and len(_records(stage_path / METRICS_FILE)) < steps + 1:
            time.sleep(0.5)
    finally:
        if handle.poll() in ("pending", "running"):  # enough steps: no final checkpoint or evaluation
            kill = getattr(handle, "kill", None)
            kill() if kill is not None else handle.cancel()
        outcome = handle.wait()
    recs = _records(stage_path / METRICS_FILE)
    if len(recs) < steps + 1:
        facts = _out_of_memory(stage_path)
        if facts is not None or _log_says_out_of_memory(stage_path):
            return Trial(expandable_segments=spec.train.expandable_segments, measured=None, out_of_memory=facts)
        # The trials' directory goes when tune ends: the log's last lines travel in the error instead.
        raise TrainingFailed(f"the trial at {label} stopped after {len(recs)} steps "
                             f"({outcome.state}: {outcome.detail}); the last lines of its worker.log:\n"
                             + _log_tail(stage_path), "fix what it names and run mcx tune again.")
    # The trial's figures as docs/metrics.md defines them (the first of its few steps is the warm-up left out).
    recs = recs[skip:]

    def summary(key: str) -> float | None:
        return reduce_values(BY_KEY[key].reduce, [r[key] for r in recs if r.get(key) is not None])

    return Trial(expandable_segments=spec.train.expandable_segments,
                 measured=Measured(**{key: summary(key) for key in MEASURED_KEYS}))


def _log_tail(stage_dir: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the trial's logs, indented (what a user would have opened)."""
    text = "".join(p.read_text(encoding="utf-8", errors="replace")[-20000:] for p in sorted(stage_dir.glob("*.log")))
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(f"    {line}" for line in tail) + "\n" if tail else "    (the trial wrote no log)\n"


def check_trials_can_run(spec: ExperimentSpec, planned: PlanResult) -> None:
    """Refuse at once what no trial can do on this machine (a trial builds the model for half a minute
    before it would find out): the spec's precision, layout and Transformer Engine against the device
    the trials get here. On Slurm the trials run on the cluster's nodes, which are not probed here."""
    if spec.launch.kind == "slurm":
        return
    lay, t = planned.plan.layout, spec.train
    problems: list[tuple[str, str]] = []
    seen = len(planned.record.hardware.visible_gpus)
    if planned.plan.full.device == "cpu":
        if spec.hardware.gpu not in ("cpu", "any"):
            problems.append(("hardware.gpu", f"\"{spec.hardware.gpu}\", but this machine shows no GPU (nvidia-smi); "
                             "mcx tune measures the real hardware: run it on a machine with that GPU"))
        if t.precision != "fp32":
            problems.append(("train.precision", f"\"{t.precision}\" needs a CUDA GPU, and the trials would run on "
                             "this machine's CPU; run mcx tune where the GPU is, or --set train.precision=fp32 to "
                             "tune on CPU"))
        for key, value in (("parallel.tensor", lay.tp), ("parallel.pipeline", lay.pp), ("parallel.context", lay.cp),
                           ("parallel.expert", lay.ep)):
            if value != 1:
                problems.append((key, f"{value} needs a CUDA GPU; the CPU backend runs data parallelism only (use 1)"))
        if t.recompute_granularity != "none":
            problems.append(("train.recompute_granularity", "needs a CUDA GPU; set it to \"none\" to tune on CPU"))
    else:
        if seen < lay.world_size:  # local and torchrun place every rank on this node
            problems.append(("hardware.gpus_per_node", f"the layout needs {lay.world_size} GPUs on this node, but {seen} are "
                             "visible here (CUDA_VISIBLE_DEVICES, nvidia-smi); run mcx tune where they are, or plan "
                             "a smaller layout with --set"))
        problems += preflight.transformer_engine(spec, cp=lay.cp, sequence_parallel=lay.sequence_parallel,
                                            where="on this machine")
    if problems:
        raise SpecError(problems, "mcx tune: its trials cannot run here")


def _out_of_memory(stage_dir: Path) -> dict[str, Any] | None:
    """What the worker recorded of its allocator when it ran out of memory (result.json), if it did."""
    result = read_stage_result(stage_dir)
    return None if result is None else result.out_of_memory


def _log_says_out_of_memory(stage_dir: Path) -> bool:
    """For a worker that left no result.json (a rank other than 0 under torchrun): its logs' last words."""
    log = "".join(p.read_text(encoding="utf-8", errors="replace")[-4000:] for p in stage_dir.glob("*.log")).lower()
    return any(s in log for s in OOM_TEXTS)


def tune(spec_path: str, overrides: list[str], *, project: Path, out: str | None, max_mbs: int, steps: int,
         progress: Progress, yes: bool = False, confirm: Callable[[str], bool] | None = None) -> TuneResult:
    if steps < 2 or max_mbs < 1:
        raise InputError("--steps must be at least 2 and --max-micro-batch at least 1;", "e.g. --steps 6.")
    spec = original = load_spec(spec_path, overrides)
    dest = check_output_file(out or str(Path(spec_path).with_suffix(".tuned.toml")), "-o" if out else "the tuned spec")
    planned = plan_loaded(spec, project, at_launch=True)  # what this machine lacks is a problem now, not after a build
    check_trials_can_run(spec, planned)
    dp, gbs = planned.plan.layout.dp, spec.train.global_batch_size
    candidates = [m for m in (2**i for i in range(0, 16)) if m <= max_mbs and gbs % (m * dp) == 0]
    if not candidates:
        raise InputError(f"no micro-batch size divides train.global_batch_size={gbs} over dp={dp};",
                         "raise the global batch size.")
    # A global batch's step takes about as long at any micro-batch size: the plan's step for each trial.
    hours = trials_gate(spec, [planned.plan.cost.step_time_s] * len(candidates), steps, yes=yes, confirm=confirm,
                        progress=progress)
    trials: list[MicroBatchTrial] = []
    work = trials_dir(project)
    lock = acquire(work)  # held while the trials run: `mcx gc` removes only a work directory nobody holds
    try:
        for mbs in candidates:
            progress(Note(lead="tune", text=f": micro_batch_size={mbs}, {steps} measured steps"))
            trial = _trial(spec, mbs, steps, project, work)
            unused = None if trial.trial.fits else fragments(trial.trial.out_of_memory or {})
            if unused is not None:
                progress(Note(text=f"  micro_batch_size={mbs}: out of memory with {unused / 2**30:.1f} GiB reserved but "
                                   f"unallocated; again with {ALLOCATOR_SETTING}"))
                trials.append(trial)
                spec = evolve(spec, train=evolve(spec.train, expandable_segments=True))
                trial = _trial(spec, mbs, steps, project, work / "expandable")
            trials.append(trial)
            measured = trial.trial.measured
            if measured is None:
                progress(Note(text=f"  micro_batch_size={mbs}: out of memory; stopping the sweep"))
                break
            progress(Note(text=f"  {measured.tokens_per_s_per_gpu or 0:,.0f} tokens/s/GPU, "
                               f"peak {(measured.mem_peak_bytes or 0) / 2**30:.1f} GiB"))
    finally:
        lock.release()
        shutil.rmtree(work, ignore_errors=True)
    fitting = [t for t in trials if t.trial.fits]
    if not fitting:
        raise TrainingFailed("even micro_batch_size=1 ran out of memory;",
                             "raise parallel.tensor or parallel.pipeline, or set train.recompute_granularity = \"full\".")
    best = max(fitting, key=lambda t: t.trial.tokens_per_s_per_gpu)
    allocator = ("expandable_segments = true\n" if best.trial.expandable_segments and not original.train.expandable_segments
                 else "")
    head = (f"# Written by `mcx tune` on {time.strftime('%Y-%m-%d')}: micro_batch_size={best.micro_batch_size} "
            f"gave {best.trial.tokens_per_s_per_gpu:,.0f} tokens/s/GPU.\n")
    write_text(dest, head + extends_lines(spec_path, dest, overrides)
               + f"[train]\nmicro_batch_size = {best.micro_batch_size}\n{allocator}", "-o")
    return TuneResult(trials=tuple(trials), best=best, spec=str(dest), trials_gpu_hours=hours)
