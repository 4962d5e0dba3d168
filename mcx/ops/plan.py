"""`mcx plan`: load -> plan -> fingerprint -> run ID, without running anything.

A plan describes the job on the spec's hardware. What depends on the machine it is typed on
(Transformer Engine importable, the dataset and tokenizer present, the checkpoint directory
writable: mcx.launch.preflight) is a warning in the plan and a problem at launch (``at_launch``), where
the job starts here. Every problem of a spec comes in one report (SpecError).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.data import mixture
from mcx.data.vocab import tokenizer_vocab_size
from mcx.errors import DataError, SpecError
from mcx.eval.scores import is_eval_metric
from mcx.fingerprint.data import data_paths
from mcx.fingerprint.record import FingerprintRecord, collect, component_hashes, run_id
from mcx.launch import preflight
from mcx.metrics.summary import METRIC_KEYS
from mcx.plan.hostfloor import HostFloor, HostMeasure, learned_floor
from mcx.plan.layout import Device
from mcx.plan.layout_rules import needs_transformer_engine
from mcx.plan.memory import checkpoint_bytes
from mcx.plan.mixture import DataRow, data_rows
from mcx.plan.params import count_params, effective_vocab_size
from mcx.plan.planner import Plan, make_plan
from mcx.plan.shown import ShownPlan
from mcx.plan.steptime import device_for
from mcx.spec import ExperimentSpec, load_spec
from mcx.track.paths import STATE_DIR
from mcx.track.query import step_time_checks

MIXTURE_KEYS = ("data.mix.", "data.valid.", "data.test.")  # a mixture component's keys (D60)

Problems = list[tuple[str, str]]


@frozen
class PlanResult:
    spec: ExperimentSpec
    plan: Plan
    record: FingerprintRecord
    run_id: str | None  # None: the data is not on this machine, so its content (part of the ID) is unknown
    te_available: bool | None  # Transformer Engine as planned (see te_for_plan); the stages are planned alike
    notes: tuple[str, ...] = ()  # what this machine lacks or cannot know, said beside the plan's own warnings
    data: tuple[DataRow, ...] = ()  # a mixture's components as the run reads them (mcx.plan.mixture)

    @property
    def shown(self) -> ShownPlan:
        """The plan as `mcx plan` renders it: the planner's view with this machine's notes."""
        return ShownPlan(self.plan, self.notes, self.data)

    def plan_json(self) -> dict[str, Any]:
        """The plan as plan.json holds it."""
        return self.shown.to_dict()

    def as_json(self) -> dict[str, Any]:
        """`mcx plan --json`: the plan, the run ID and the fingerprint's component hashes."""
        data = self.plan_json()
        return {"run_id": self.run_id, **data, "fingerprint": component_hashes(self.record),
                "warnings": [*data["warnings"], *self.record.warnings]}


def te_available(spec: ExperimentSpec) -> bool | None:
    """Whether Transformer Engine will be there where the worker runs; None when it cannot be known here."""
    if spec.launch.kind == "slurm":
        return None  # planned on a login node; the cluster's environment decides
    if importlib.util.find_spec("transformer_engine") is not None:
        return True
    if spec.hardware.gpu not in ("cpu", "any") and shutil.which("nvidia-smi") is None:
        return None  # planned away from the GPU machine the spec targets
    return False


def runs_here(spec: ExperimentSpec) -> bool:
    """Whether `mcx run` starts the job on this machine (local, torchrun), not on a cluster's nodes."""
    return spec.launch.kind != "slurm"


def te_for_plan(spec: ExperimentSpec, at_launch: bool = False, warnings: list[str] | None = None) -> bool | None:
    """Transformer Engine as the plan assumes it: a spec that asks for it, planned where it is missing,
    is planned for a machine that has it (checked at launch), unless the job starts here now."""
    te = te_available(spec)
    if te is False and spec.hardware.gpu != "cpu" and needs_transformer_engine(spec) \
            and not (at_launch and runs_here(spec)):
        (warnings if warnings is not None else []).append("Transformer Engine is not importable on this machine; the plan assumes the machines the job "
                        "runs on have it, and `mcx run` checks that before the job starts (on Slurm, in the job's "
                        "first seconds)")
        return None
    return te


def local_device(record: FingerprintRecord) -> Device:
    """The device a job started on this machine gets: "cuda" where the hardware fingerprint probed a GPU
    the spec wants, else "cpu" (make_plan plans each stage's device from it)."""
    return "cuda" if record.hardware.device == "cuda" else "cpu"


def _site(spec: ExperimentSpec, root: Path, record: FingerprintRecord, params: int | None) -> Problems:
    """What this machine lacks for the job: data and tokenizer files, writable checkpoint and run
    directories with room for a checkpoint of ``params`` parameters (None: unknown)."""
    paths = record.data.paths
    tracked = {key: value for name, (key, value) in data_paths(spec.data).items()
               if name in paths and paths[name].source == "dvc"}
    # A DVC-tracked path that is not pulled yet is fetched by `mcx run` (the fingerprint says so).
    pulled_later = frozenset(k for k, value in tracked.items() if not (root / value).exists())
    problems = preflight.dataset(spec, root, skip=pulled_later)
    ckpt_key, ckpt_dir = (("checkpoint.dir", root / spec.checkpoint.dir) if spec.checkpoint.dir is not None
                          else ("checkpoint.dir (unset: the run directory, .mcx/ in the project)", root / STATE_DIR))
    problems += preflight.writable(ckpt_dir, ckpt_key)
    if spec.checkpoint.dir is not None:
        problems += preflight.writable(root / STATE_DIR, "run directory (.mcx/ in the project)")
    if params is not None and not any(key == ckpt_key for key, _ in problems):
        problems += preflight.free_space(ckpt_dir, checkpoint_bytes(spec, params), ckpt_key,
                                    "one checkpoint of this model (weights, fp32 main weights, Adam's moments)")
    return problems


def token_id_problems(spec: ExperimentSpec, root: Path, record: FingerprintRecord) -> Problems:
    """A dataset holding token ids at or past the vocabulary (an embedding row the model does not have, or
    one no tokenizer token trains): refused, from the largest id the data fingerprint recorded."""
    top = record.data.max_token_id
    vocab, source = tokenizer_vocab_size(spec.data, root), "the tokenizer's vocabulary"
    if vocab is None:
        vocab = effective_vocab_size(spec)
        source = "model.vocab_size" if spec.model.vocab_size is not None else source
    if top is None or vocab is None or top < vocab:
        return []
    tops = {name: p.max_token_id for name, p in record.data.paths.items() if p.max_token_id is not None}
    key, path, prefix = spec.data.datasets()[max(tops, key=lambda name: tops[name])]
    return [(key, f"{path!r} holds token id {top} in {prefix}.bin, but {source} has "
                  f"{vocab} ids (0 to {vocab - 1}), so the model cannot read it; prepare the data again with "
                  f"this tokenizer (`mcx data prepare SOURCE --out {path} --force`), or point "
                  "data.tokenizer at the tokenizer that made it")]


def _params(spec: ExperimentSpec, plan: Plan | None, vocab: int | None) -> int | None:
    """The model's parameters, also for a spec whose layout did not plan (counted at TP 1)."""
    if plan is not None:
        return plan.params.total
    vocab = vocab or effective_vocab_size(spec)
    return None if vocab is None else count_params(spec.model, vocab, 1).total


def plan_loaded(spec: ExperimentSpec, project: Path, *, probe_hardware: bool = True, require_data: bool = False,
                at_launch: bool = False, verify_data: bool = False, state_root: Path | None = None,
                code_path: Path | None = None) -> PlanResult:
    """Plan ``spec`` from ``project``. ``at_launch``: `mcx run` is about to start it, so what this machine
    lacks is a problem where the job starts here (the data, which the run ID hashes, everywhere).
    ``verify_data``: read every data file instead of trusting the hashes kept for unchanged ones.
    ``state_root``: where the runs an ``[init]`` source names live, when ``project`` is a reproduction's worktree;
    ``code_path``: that worktree, whose own mcx (where it holds one) the worker imports."""
    notes: list[str] = []
    te = te_for_plan(spec, at_launch, notes)
    vocab = None if effective_vocab_size(spec) is not None else tokenizer_vocab_size(spec.data, project)
    problems: Problems = [(f"baseline.tolerances.{metric}", f"unknown metric; use one of {', '.join(METRIC_KEYS)}, "
                           "or an [eval] score eval/<task>/<metric>")
                          for metric in spec.baseline.tolerances if metric not in METRIC_KEYS and not is_eval_metric(metric)]
    problems += [(f"baseline.tolerances.{metric}", "an evaluation score, and this spec evaluates nothing; add [eval] tasks")
                 for metric in spec.baseline.tolerances if is_eval_metric(metric) and not spec.eval.tasks]
    record, data_error = None, None
    try:  # first: the stages' device is planned from its hardware probe
        record = collect(spec, project, probe_hardware=probe_hardware, require_data=require_data, allow_absent=True,
                         rehash_data=verify_data, state_root=state_root, code_path=code_path)
    except DataError as exc:  # e.g. a tracked dataset changed since `dvc add`: said with the rest
        data_error = exc
    plan = None
    try:
        plan = make_plan(spec, te_available=te, vocab_size=vocab,
                         local_device=None if record is None else local_device(record),
                         host_floor=host_floor(spec, state_root or project))
    except SpecError as exc:
        problems += exc.problems
    if record is None:
        raise SpecError(_dedupe([*problems, ("", str(data_error))])) from None
    problems += token_id_problems(spec, project, record)
    site = _site(spec, project, record, _params(spec, plan, vocab))
    if at_launch:
        data_keys = ("data.path", "data.prefix", "data.tokenizer.path", "data.tokenizer.merges")
        problems += [p for p in site if runs_here(spec) or p[0] in data_keys or p[0].startswith(MIXTURE_KEYS)]
    else:
        notes += [f"{key}: {msg} (checked again when the job starts)" for key, msg in site]
    if problems:
        raise SpecError(_dedupe(problems))
    assert plan is not None
    absent = record.data.absent
    rows: list[DataRow] = []
    parts = mixture.train_tokens(spec.data, project) if spec.data.path is None else None
    if parts is not None:  # a mixture here: what the run reads of each component (D60)
        rows, repeated = data_rows(parts, spec.train.train_iters * spec.train.global_batch_size, spec.model.seq_length)
        notes += repeated
    return PlanResult(spec=spec, plan=plan, record=record, run_id=None if absent else run_id(record),
                      te_available=te, notes=tuple(notes), data=tuple(rows))


def host_floor(spec: ExperimentSpec, project: Path) -> HostFloor | None:
    """The host's time a layer and micro-batch on the spec's GPU model as this project's runs measured it
    (mcx.plan.hostfloor); None where none has, or the spec names no GPU of the table."""
    dev = device_for(spec)
    if dev is None:
        return None
    return learned_floor(host_measures(project), str(spec.hardware.gpu), dev.cal.host_layer_s)


def host_measures(project: Path) -> list[HostMeasure]:
    """What each local run's host took a layer and micro-batch where it set the step (its step-time check)."""
    return [HostMeasure(run_id=run_id, gpu=check.gpu, host_layer_s=check.host_layer_s, created=created)
            for run_id, created, check in step_time_checks(project)
            if check.host_layer_s is not None and check.gpu is not None]


def _dedupe(problems: Problems) -> Problems:
    return list(dict.fromkeys(problems))  # first occurrences, in order


def plan_spec(path: str, overrides: list[str], project: Path, *, probe_hardware: bool = True) -> PlanResult:
    return plan_loaded(load_spec(path, overrides), project, probe_hardware=probe_hardware)
