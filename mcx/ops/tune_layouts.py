"""`mcx tune --layouts SPEC`: the parallel layouts that fit, ranked by the step-time model; where the spec's GPUs
are present, the top few measured with short trials and the fastest written into a new spec.

The ranking is mcx.plan.tuning's. A trial is `mcx tune`'s: a few real optimizer steps of the full model through
the spec's own launcher (Slurm's nodes for a Slurm spec). One that runs out of memory with the allocator's
fragments runs once more with ``train.expandable_segments``, as in the micro-batch sweep.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attrs import evolve

from mcx.errors import InputError, SpecError, TrainingFailed
from mcx.ops.outputs import check_output_file, write_text
from mcx.ops.plan import PlanResult, plan_loaded
from mcx.ops.progress import Note, Progress
from mcx.ops.tune import extends_lines, measure_trial, trials_dir, trials_gate
from mcx.plan.gpus import gpu_from_name, gpu_info
from mcx.plan.memory import ALLOCATOR_SETTING, fragments
from mcx.plan.tuning import Candidate, apply, rank_layouts
from mcx.report.tune_results import LayoutTrial, RankedLayout, TuneLayoutsResult
from mcx.spec import ExperimentSpec, load_spec
from mcx.spec.convert import toml_value
from mcx.track.runcache import acquire

SETTING_ORDER = ("parallel.tensor", "parallel.pipeline", "parallel.virtual_pipeline", "parallel.context",
                 "parallel.expert", "parallel.sequence_parallel", "parallel.distributed_optimizer",
                 "train.micro_batch_size", "train.recompute_granularity", "train.recompute_method",
                 "train.recompute_num_layers")


def _where_trials_run(spec: ExperimentSpec, planned: PlanResult) -> str | None:
    """None where the trials can run (the spec's GPUs are here, or Slurm's nodes have them); else why not."""
    if spec.launch.kind == "slurm":
        return None
    if planned.plan.full.device == "cpu":
        return "this machine shows no GPU (nvidia-smi)"
    seen = planned.record.hardware.visible_gpus
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    if spec.hardware.nodes > 1 or len(seen) < world:
        return f"the spec's {world} GPUs are not all here ({len(seen)} visible; a Slurm spec measures on its nodes)"
    if {gpu_from_name(str(g.get("name", ""))) for g in seen} != {spec.hardware.gpu}:
        return f"the GPUs here are not hardware.gpu = \"{spec.hardware.gpu}\""
    return None


def _measure_candidate(spec: ExperimentSpec, cand: Candidate, rank: int, steps: int, project: Path, work: Path,
                       progress: Progress) -> LayoutTrial:
    tspec = apply(spec, cand.settings)
    trial = measure_trial(tspec, steps, project, work / f"rank{rank}", f"layout {rank}")
    unused = None if trial.fits else fragments(trial.out_of_memory or {})
    if unused is not None:
        progress(Note(text=f"  layout {rank}: out of memory with {unused / 2**30:.1f} GiB reserved but unallocated; "
                           f"again with {ALLOCATOR_SETTING}"))
        tspec = evolve(tspec, train=evolve(tspec.train, expandable_segments=True))
        trial = measure_trial(tspec, steps, project, work / f"rank{rank}-expandable", f"layout {rank}")
    return LayoutTrial(rank=rank, candidate=cand, trial=trial)


def _spec_text(original: ExperimentSpec, best: LayoutTrial, extends: str) -> str:
    """The tuned spec: ``extends`` the original, with the keys the best layout changes."""
    import tomli_w

    sections: dict[str, dict[str, Any]] = {}
    for dotted in SETTING_ORDER:
        if dotted not in best.candidate.settings:
            continue
        value = best.candidate.settings[dotted]
        section, key = dotted.split(".")
        if getattr(getattr(original, section), key) == value:
            continue
        # TOML has no null: no interleaving is virtual_pipeline = 1 (the planner reads it as none)
        sections.setdefault(section, {})[key] = 1 if value is None else value
    if best.trial.expandable_segments and not original.train.expandable_segments:
        sections.setdefault("train", {})["expandable_segments"] = True
    head = (f"# Written by `mcx tune --layouts` on {time.strftime('%Y-%m-%d')}: layout {best.rank} of the model's "
            f"ranking measured {best.trial.tokens_per_s_per_gpu:,.0f} tokens/s/GPU (predicted "
            f"{best.candidate.step.tokens_per_s_per_gpu:,.0f}).\n")
    return head + extends + tomli_w.dumps(sections)


def tune_layouts(spec_path: str, overrides: list[str], *, project: Path, out: str | None, top: int, show: int,
                 steps: int, measure: bool, progress: Progress, yes: bool = False,
                 confirm: Callable[[str], bool] | None = None) -> TuneLayoutsResult:
    if steps < 2 or top < 1 or show < 1:
        raise InputError("--steps must be at least 2, --top and --show at least 1;", "e.g. --top 3 --steps 6.")
    spec = load_spec(spec_path, overrides)
    if gpu_info(spec.hardware.gpu) is None:
        raise SpecError([("hardware.gpu", f"\"{spec.hardware.gpu}\" is not in mcx's GPU table, so no layout can be "
                          "priced; name the model (H100, H200, B200, A100-80GB, ...)")], "mcx tune --layouts")
    dest = check_output_file(out or str(Path(spec_path).with_suffix(".tuned.toml")), "-o" if out else "the tuned spec")
    planned = plan_loaded(spec, project, probe_hardware=True)
    ranking = rank_layouts(spec, te_available=planned.te_available, vocab_size=planned.plan.vocab_size)
    if not ranking.candidates:
        raise SpecError([("hardware", f"no layout of {spec.hardware.nodes} x {spec.hardware.gpus_per_node} "
                          f"{spec.hardware.gpu} holds this model, even with full recomputation")],
                        "add GPUs or nodes, or shrink the model or the sequence")
    shown = ranking.candidates[:max(show, top)]
    current = None
    if ranking.current is not None:
        rank = next((i + 1 for i, c in enumerate(ranking.candidates) if c.key == ranking.current.key), None)
        current = RankedLayout(rank=rank, candidate=ranking.current)
    result = TuneLayoutsResult(considered=ranking.considered, too_big=ranking.too_big, fitting=len(ranking.candidates),
                               capacity_bytes=ranking.capacity_bytes, current=current,
                               ranking=tuple(RankedLayout(rank=i + 1, candidate=c) for i, c in enumerate(shown)))
    why_not = "--no-measure" if not measure else _where_trials_run(spec, planned)
    if why_not is not None:
        return evolve(result, not_measured=why_not)
    first = ranking.candidates[0]
    progress(Note(lead="tune", text=f": {len(ranking.candidates)} layouts fit; the model's pick, "
                  f"{first.step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU predicted: "
                  + ", ".join(f"{k}={toml_value(first.settings[k])}" for k in SETTING_ORDER if first.settings.get(k) is not None)))
    hours = trials_gate(spec, [c.step.step_s for c in ranking.candidates[:top]], steps, yes=yes, confirm=confirm,
                        progress=progress)
    trials: list[LayoutTrial] = []
    work = trials_dir(project)
    lock = acquire(work)
    try:
        for i, cand in enumerate(ranking.candidates[:top]):
            progress(Note(lead="tune", text=f": layout {i + 1} of the ranking, {steps} measured steps"))
            trial = _measure_candidate(spec, cand, i + 1, steps, project, work, progress)
            trials.append(trial)
            if trial.trial.fits:
                progress(Note(text=f"  {trial.trial.tokens_per_s_per_gpu:,.0f} tokens/s/GPU (predicted "
                                   f"{cand.step.tokens_per_s_per_gpu:,.0f})"))
            else:
                progress(Note(text=f"  layout {i + 1}: out of memory"))
    finally:
        lock.release()
        shutil.rmtree(work, ignore_errors=True)
    fitting = [t for t in trials if t.trial.fits]
    if not fitting:
        raise TrainingFailed(f"all {len(trials)} measured layouts ran out of memory;",
                             "measure more of the ranking with --top, or raise hardware.gpus_per_node or nodes.")
    best = max(fitting, key=lambda t: t.trial.tokens_per_s_per_gpu)
    write_text(dest, _spec_text(spec, best, extends_lines(spec_path, dest, overrides)), "-o")
    return evolve(result, trials=tuple(trials), best=best, spec=str(dest), trials_gpu_hours=hours)
