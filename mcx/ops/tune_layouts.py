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
from mcx.ops.plan import plan_loaded
from mcx.ops.progress import Note, Progress
from mcx.ops.tune import _measure, extends_lines, trials_dir, trials_gate
from mcx.plan.gpus import gpu_from_name, gpu_info
from mcx.plan.memory import ALLOCATOR_SETTING, fragments
from mcx.plan.tuning import Candidate, apply, rank_layouts
from mcx.spec import load_spec
from mcx.spec.convert import toml_value
from mcx.track.runcache import acquire

SETTING_ORDER = ("parallel.tensor", "parallel.pipeline", "parallel.virtual_pipeline", "parallel.context",
                 "parallel.expert", "parallel.sequence_parallel", "parallel.distributed_optimizer",
                 "train.micro_batch_size", "train.recompute_granularity", "train.recompute_method",
                 "train.recompute_num_layers")


def candidate_dict(c: Candidate) -> dict[str, Any]:
    st = c.step
    return {"settings": dict(c.settings), "layout": c.layout.to_dict(), "memory_bytes": c.memory_bytes,
            "memory_verdict": c.verdict, "predicted": {"step_time_s": st.step_s, "mfu": st.mfu,
                                                       "tokens_per_s_per_gpu": st.tokens_per_s_per_gpu,
                                                       "breakdown_s": st.breakdown()}}


def _where_trials_run(spec: Any, planned: Any) -> str | None:
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


def _measure_candidate(spec: Any, cand: Candidate, rank: int, steps: int, project: Path, work: Path,
                       progress: Progress) -> dict[str, Any]:
    tspec = apply(spec, cand.settings)
    trial = _measure(tspec, steps, project, work / f"rank{rank}", f"layout {rank}")
    unused = None if trial["fits"] else fragments(trial.get("out_of_memory") or {})
    if unused is not None:
        progress(Note(text=f"  layout {rank}: out of memory with {unused / 2**30:.1f} GiB reserved but unallocated; "
                           f"again with {ALLOCATOR_SETTING}"))
        tspec = evolve(tspec, train=evolve(tspec.train, expandable_segments=True))
        trial = _measure(tspec, steps, project, work / f"rank{rank}-expandable", f"layout {rank}")
    return {"rank": rank, **trial}


def _spec_text(original: Any, best: dict[str, Any], extends: str) -> str:
    """The tuned spec: ``extends`` the original, with the keys the best layout changes."""
    import tomli_w

    sections: dict[str, dict[str, Any]] = {}
    for dotted in SETTING_ORDER:
        if dotted not in best["settings"]:
            continue
        value = best["settings"][dotted]
        section, key = dotted.split(".")
        if getattr(getattr(original, section), key) == value:
            continue
        # TOML has no null: no interleaving is virtual_pipeline = 1 (the planner reads it as none)
        sections.setdefault(section, {})[key] = 1 if value is None else value
    if best.get("expandable_segments") and not original.train.expandable_segments:
        sections.setdefault("train", {})["expandable_segments"] = True
    measured = best["measured"]
    head = (f"# Written by `mcx tune --layouts` on {time.strftime('%Y-%m-%d')}: layout {best['rank']} of the model's "
            f"ranking measured {measured['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU (predicted "
            f"{best['predicted']['tokens_per_s_per_gpu']:,.0f}).\n")
    return head + extends + tomli_w.dumps(sections)


def tune_layouts(spec_path: str, overrides: list[str], *, project: Path, out: str | None, top: int, show: int,
                 steps: int, measure: bool, progress: Progress, yes: bool = False,
                 confirm: Callable[[str], bool] | None = None) -> dict[str, Any]:
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
    result: dict[str, Any] = {
        "spec": None, "considered": ranking.considered, "too_big": ranking.too_big,
        "fitting": len(ranking.candidates), "capacity_bytes": ranking.capacity_bytes,
        "ranking": [{"rank": i + 1, **candidate_dict(c)} for i, c in enumerate(ranking.candidates[:max(show, top)])],
        "current": None, "trials": [], "best": None, "measured_here": None}
    if ranking.current is not None:
        rank = next((i + 1 for i, c in enumerate(ranking.candidates) if c.key == ranking.current.key), None)
        result["current"] = {"rank": rank, **candidate_dict(ranking.current)}
    why_not = "--no-measure" if not measure else _where_trials_run(spec, planned)
    result["measured_here"] = why_not is None
    if why_not is not None:
        result["not_measured"] = why_not
        return result
    first = ranking.candidates[0]
    progress(Note(lead="tune", text=f": {len(ranking.candidates)} layouts fit; the model's pick, "
                  f"{first.step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU predicted: "
                  + ", ".join(f"{k}={toml_value(first.settings[k])}" for k in SETTING_ORDER if first.settings.get(k) is not None)))
    result["trials_gpu_hours"] = trials_gate(spec, [c.step.step_s for c in ranking.candidates[:top]], steps, yes=yes,
                                             confirm=confirm, progress=progress)
    work = trials_dir(project)
    lock = acquire(work)
    try:
        for i, cand in enumerate(ranking.candidates[:top]):
            progress(Note(lead="tune", text=f": layout {i + 1} of the ranking, {steps} measured steps"))
            trial = _measure_candidate(spec, cand, i + 1, steps, project, work, progress)
            result["trials"].append({**trial, "predicted": candidate_dict(cand)["predicted"]})
            if trial["fits"]:
                progress(Note(text=f"  {trial['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU (predicted "
                                   f"{cand.step.tokens_per_s_per_gpu:,.0f})"))
            else:
                progress(Note(text=f"  layout {i + 1}: out of memory"))
    finally:
        lock.release()
        shutil.rmtree(work, ignore_errors=True)
    fitting = [t for t in result["trials"] if t["fits"]]
    if not fitting:
        raise TrainingFailed(f"all {len(result['trials'])} measured layouts ran out of memory;",
                             "measure more of the ranking with --top, or raise hardware.gpus_per_node or nodes.")
    best_trial = max(fitting, key=lambda t: t["tokens_per_s_per_gpu"])
    cand = ranking.candidates[best_trial["rank"] - 1]
    best = {"rank": best_trial["rank"], "settings": dict(cand.settings), "predicted": best_trial["predicted"],
            "measured": {k: best_trial[k] for k in ("tokens_per_s_per_gpu", "mfu", "mem_peak_bytes", "step_time_s")},
            "expandable_segments": best_trial["expandable_segments"]}
    write_text(dest, _spec_text(spec, best, extends_lines(spec_path, dest, overrides)), "-o")
    result |= {"best": best, "spec": str(dest)}
    return result
