"""The job file: what the control plane asks the worker to do (STAGE_DIR/job.json).

The contract is in docs/stage-directory.md. The spec inside is the stage's resolved
``ExperimentSpec``, structured with the same strict converter as a TOML spec, so a job file that a
newer or older control plane wrote is rejected with the exact key instead of being half-understood.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from attrs import evolve, field, frozen

from mcx.contract.files import JOB_FILE
from mcx.contract.profile import ProfileSteps
from mcx.contract.trace import TraceRequest
from mcx.errors import InputError, SpecError
from mcx.plan.layout import JOB_FIELDS, Device, Layout
from mcx.spec import convert
from mcx.spec.schema import DataSpec, ExperimentSpec
from mcx.spec.load import spec_to_dict

Stage = Literal["smoke", "full"]
Output = Literal["bar", "quiet", "json"]
OUTPUTS: tuple[Output, ...] = ("bar", "quiet", "json")
InitKind = Literal["run", "hf", "megatron"]
INIT_KINDS: tuple[InitKind, ...] = ("run", "hf", "megatron")


@frozen(kw_only=True)
class Checks:
    """Smoke-stage check settings (from the spec's [smoke] table)."""

    resume_check_iters: int = 3
    loss_window: int = 5
    min_loss_drop: float = 0.0


@frozen(kw_only=True)
class InitFrom:
    """Where a full stage's weights start when it has no checkpoint of its own (the spec's [init], resolved
    by the control plane: mcx.fingerprint.init_from). ``format``: what ``path`` holds: "torch" (the CPU
    backend's state.pt), "dist" (a Megatron-Core distributed checkpoint), "hf" (a Hugging Face model)."""

    kind: InitKind
    path: str
    format: Literal["torch", "dist", "hf"]
    load_optimizer: bool = False
    reset_step: bool = True


@frozen(kw_only=True)
class Job:
    run_id: str
    stage: Stage
    spec: ExperimentSpec
    layout: Layout = field(factory=Layout)
    data_dir: str  # the dataset's directory; for a mixture, the one its components' paths are relative to (D60)
    checkpoint_dir: str
    train_samples_limit: int | None = None
    checks: Checks = field(factory=Checks)
    device: Device = "cpu"
    output: Output = "bar"
    init: InitFrom | None = None  # the full stage of a run with [init] from; the smoke stage starts at random
    profile: ProfileSteps | None = None  # `mcx run --profile`: steps run under torch.profiler (observation only)
    trace: TraceRequest | None = None  # a replay (`mcx locate`): trace one step, then stop, saving nothing (D70)


def dataset_dir(data: DataSpec, data_dir: Path, path: str) -> Path:
    """The directory of the spec's dataset at ``path`` (``data.path``, or a mixture component's) in a job."""
    return data_dir if data.path is not None else data_dir / path


# The spec's [parallel] degrees and the layout field that carries each in the job file.
DEGREE_KEYS = {"tensor": "tp", "pipeline": "pp", "virtual_pipeline": "vpp", "context": "cp", "expert": "ep",
               "sequence_parallel": "sequence_parallel"}


def job_from_dict(data: dict[str, Any], source: str = JOB_FILE) -> Job:
    """Structure a job dict; every problem is reported with its key.

    The layout section holds the degrees (``JOB_FIELDS``) and the spec's [parallel] table the rest, so
    each value is carried once; the worker's spec gets the layout's degrees back and its Layout equals the
    planner's. A degree also written in the spec (an older control plane) must agree with the layout.
    """
    layout = data.get("layout")
    extra = sorted(set(layout) - set(JOB_FIELDS)) if isinstance(layout, dict) else []
    problems = [(f"layout.{key}", f"unknown key; known keys: {', '.join(JOB_FIELDS)}") for key in extra]
    if extra and isinstance(layout, dict):  # the converter would take the planner's other fields: they are the spec's here
        data = {**data, "layout": {k: v for k, v in layout.items() if k not in extra}}
    if "test_hooks" in data:  # an older control plane's test switch: refused, never half-applied
        problems.append(("test_hooks", "an older mcx's test hooks (MCX_TEST_HOOKS), which this worker does not run; "
                                       "fault injection is the spec's [debug] table (docs/spec.md): run `mcx run` again"))
        data = {k: v for k, v in data.items() if k != "test_hooks"}
    try:
        job = convert.structure(data, Job, source)
    except SpecError as exc:
        raise SpecError([*exc.problems, *problems], source) from None
    written = ((data.get("spec") or {}).get("parallel") or {})
    for key, name in DEGREE_KEYS.items():
        value, carried = written.get(key), getattr(job.layout, name)
        if value not in (None, carried) and not (key == "sequence_parallel" and value is False):
            problems.append((f"spec.parallel.{key}", f"{value!r} disagrees with layout.{name} = {carried!r}, "
                                                     "which the job file carries it as"))
    if problems:
        raise SpecError(problems, source)
    lay, hw = job.layout, job.spec.hardware
    spec = evolve(job.spec, parallel=evolve(job.spec.parallel, **{key: getattr(lay, name)
                                                                  for key, name in DEGREE_KEYS.items()}))
    return evolve(job, spec=spec, layout=evolve(lay, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node,
                                                distributed_optimizer=job.spec.parallel.distributed_optimizer))


def job_to_dict(job: Job) -> dict[str, Any]:
    """The job file's JSON object (docs/stage-directory.md); job_from_dict reads it back."""
    spec = spec_to_dict(job.spec)
    spec["parallel"] = {k: v for k, v in spec["parallel"].items() if k not in DEGREE_KEYS}  # layout carries them
    return {"run_id": job.run_id, "stage": job.stage, "spec": spec, "layout": job.layout.job_dict(),
            "data_dir": job.data_dir, "checkpoint_dir": job.checkpoint_dir,
            "train_samples_limit": job.train_samples_limit,
            "checks": {"resume_check_iters": job.checks.resume_check_iters, "loss_window": job.checks.loss_window,
                       "min_loss_drop": job.checks.min_loss_drop},
            "device": job.device, "output": job.output,
            **({"init": {"kind": job.init.kind, "path": job.init.path, "format": job.init.format,
                         "load_optimizer": job.init.load_optimizer, "reset_step": job.init.reset_step}}
               if job.init else {}),
            **({"profile": {"first": job.profile.first, "last": job.profile.last}} if job.profile else {}),
            **({"trace": {"step": job.trace.step, "keep_bytes": job.trace.keep_bytes, "keep": list(job.trace.keep),
                          **{k: True for k in ("layers", "noise") if getattr(job.trace, k)}}}
               if job.trace else {})}


def read_job(stage_dir: Path) -> Job:
    path = stage_dir / JOB_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"no {JOB_FILE} in {stage_dir};", "the worker needs a stage directory written by `mcx run`.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON ({exc});", "rewrite it with `mcx run`.") from None
    job = job_from_dict(data, str(path))
    problems = check_job(job)
    if problems:
        raise SpecError(problems, str(path))
    return job


def check_job(job: Job) -> list[tuple[str, str]]:
    """Consistency of the layout with the spec (the planner guarantees this; the worker re-checks)."""
    lay, t, m = job.layout, job.spec.train, job.spec.model
    out: list[tuple[str, str]] = []
    product = lay.tp * lay.pp * lay.cp * lay.dp
    if product != lay.world_size:
        out.append(("layout.world_size", f"{lay.world_size} != tp*pp*cp*dp = {product}"))
    if t.global_batch_size % (t.micro_batch_size * lay.dp):
        out.append(("spec.train.global_batch_size", f"{t.global_batch_size} is not divisible by "
                    f"micro_batch_size*dp = {t.micro_batch_size * lay.dp}"))
    if m.num_layers % lay.pp:
        out.append(("layout.pp", f"{lay.pp} does not divide model.num_layers={m.num_layers}"))
    if lay.vpp is not None and (m.num_layers // max(lay.pp, 1)) % lay.vpp:
        out.append(("layout.vpp", f"{lay.vpp} does not divide the {m.num_layers // lay.pp} layers per pipeline stage"))
    if lay.ep > 1 and (m.num_experts is None or m.num_experts % lay.ep):
        out.append(("layout.ep", f"{lay.ep} does not divide model.num_experts={m.num_experts}"))
    if lay.ep > 1 and (lay.dp * lay.cp) % lay.ep:
        out.append(("layout.ep", f"{lay.ep} does not divide dp*cp = {lay.dp * lay.cp}"))
    return out


def num_microbatches(job: Job) -> int:
    t = job.spec.train
    return t.global_batch_size // (t.micro_batch_size * job.layout.dp)
