"""The smoke stage's checks, run in the worker after the smoke training finishes.

Each check is ``{"passed": bool, "detail": str, ...values}`` in result.json ``checks``:

* ``loss_finite``: every training loss is a finite number;
* ``loss_falling``: mean of the last ``loss_window`` losses < mean of the first ``loss_window``
  minus ``min_loss_drop``;
* ``checkpoint_roundtrip``: the final checkpoint's files match their checksums, and loaded into a
  freshly built model and optimizer it gives every tensor (weights, optimizer moments and steps,
  learning rates, schedule position) bit for bit; the damaged file or the first differing tensor is named;
* ``resume_bitwise``: from the checkpoint ``resume_check_iters`` steps before the end (its files
  checked likewise), a fresh model replays those steps and every loss equals the recorded one exactly;
* ``throughput``: tokens/s, TFLOP/s and peak memory were measured (finite, positive).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mcx.train.backend import Backend
from mcx.contract.job import Job
from mcx.train.runtime import World

log = logging.getLogger("mcx.train")

Check = dict[str, Any]


def resume_check_step(job: Job) -> int:
    """The step whose checkpoint the resume check restarts from (pinned: never pruned during the stage)."""
    return job.spec.train.train_iters - job.checks.resume_check_iters


def check_losses(job: Job, losses: list[float | None]) -> dict[str, Check]:
    w, drop = job.checks.loss_window, job.checks.min_loss_drop
    bad = [i + 1 for i, x in enumerate(losses) if x is None or not math.isfinite(x)]
    out = {"loss_finite": {"passed": not bad and bool(losses),
                           "detail": f"all {len(losses)} losses finite" if not bad else f"non-finite loss at steps {bad[:10]}"}}
    if bad or len(losses) < 2 * w:
        out["loss_falling"] = {"passed": False, "detail": f"needs {2 * w} finite losses, have {len(losses) - len(bad)}"}
        return out
    finite = [x for x in losses if x is not None]  # every one of them: a None is in ``bad``
    first, last = sum(finite[:w]) / w, sum(finite[-w:]) / w
    passed = last < first - drop
    out["loss_falling"] = {
        "passed": passed, "first_window_mean": first, "last_window_mean": last, "min_loss_drop": drop,
        "detail": (f"mean loss fell from {first:.4f} (first {w} steps) to {last:.4f} (last {w})" if passed else
                   f"mean loss did not fall by more than {drop:g}: {first:.4f} (first {w} steps) -> {last:.4f} "
                   f"(last {w}); the model is not learning (check train.lr, the data, the schedule)"),
    }
    return out


def compare_states(live: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> Check:
    """Bitwise equality of two flat named tensor maps."""
    if live.keys() != loaded.keys():
        missing = sorted(live.keys() - loaded.keys())[:5]
        extra = sorted(loaded.keys() - live.keys())[:5]
        return {"passed": False, "tensors": len(live),
                "detail": f"the loaded state has different entries: missing {missing}, unexpected {extra}"}
    for name, a in live.items():
        b = loaded[name]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a.cpu(), b.cpu()):
            diff = ""
            if a.shape == b.shape and a.is_floating_point() and b.is_floating_point():
                diff = f" (max abs difference {(a.double().cpu() - b.double().cpu()).abs().max().item():.3g})"
            return {"passed": False, "tensors": len(live), "first_mismatch": name,
                    "detail": f"tensor {name} differs after save and load{diff}; the checkpoint does not restore the run"}
    return {"passed": True, "tensors": len(live), "detail": f"all {len(live)} tensors equal after save and load"}


def check_resume(expected: list[tuple[int, float]], replay: Callable[[], list[float]]) -> Check:
    """``replay()`` reruns the steps of ``expected`` from the checkpoint before them."""
    got = replay()
    for (step, want), have in zip(expected, got, strict=True):
        if want != have:
            return {"passed": False, "first_mismatch_step": step, "expected": want, "got": have,
                    "detail": f"after resuming, step {step} gave loss {have!r} instead of {want!r} "
                              f"(difference {have - want:.3g}); resume is not exact"}
    steps = [s for s, _ in expected]
    return {"passed": True, "steps": steps,
            "detail": f"steps {steps[0]}-{steps[-1]} replayed from the checkpoint with bitwise-equal losses"}


def check_throughput(measured: list[dict[str, Any]]) -> Check:
    timed = measured[1:] if len(measured) > 1 else measured
    tps = [r.get("tokens_per_s_per_gpu") or 0.0 for r in timed]
    mem = max((r.get("mem_peak_bytes") or 0 for r in measured), default=0)
    ok = bool(tps) and all(math.isfinite(x) and x > 0 for x in tps) and mem > 0
    return {"passed": ok, "tokens_per_s_per_gpu": sorted(tps)[len(tps) // 2] if tps else None,
            "mem_peak_bytes": mem,
            "detail": f"measured over {len(tps)} steps" if ok else "throughput or memory could not be measured"}


def damaged(directory: Path, problems: list[str] | None) -> Check:
    """A failed check for a checkpoint whose files do not match their checksums."""
    found = problems if problems is not None else ["it has no checksums"]
    return {"passed": False, "damaged": found,
            "detail": f"checkpoint {directory.name} is damaged: {', '.join(found)}; the files on disk are not "
                      "what the save wrote (check the filesystem)"}


def run_checks(job: Job, world: World, train_records: list[dict[str, Any]], live: Backend,
               make_fresh: Callable[[], Backend], final_dir: Path, resume_dir: Path,
               replay_from: Callable[[Backend, Path, int], list[float]],
               problems: Callable[[Path], list[str] | None]) -> dict[str, Check]:
    """All smoke checks. ``replay_from(backend, resume_dir, steps)`` returns the replayed losses;
    ``problems(directory)`` checks a checkpoint's files against its checksums (collective).

    Every rank compares its own tensors (model-parallel shards on GPU); a mismatch on any rank
    fails the check everywhere."""
    losses = [r.get("loss") for r in train_records]
    checks = check_losses(job, losses)
    fresh = make_fresh()
    try:
        found = problems(final_dir)
        if found != []:
            roundtrip = damaged(final_dir, found)
        else:
            fresh.load(final_dir)
            roundtrip = compare_states(live.state_tensors(), fresh.state_tensors())
            if not world.all(roundtrip["passed"]) and roundtrip["passed"]:
                roundtrip = {"passed": False, "tensors": roundtrip["tensors"],
                             "detail": "a tensor differs after save and load on another rank (see worker.log)"}
        if not roundtrip["passed"]:
            log.warning("rank %d: %s", world.rank, roundtrip["detail"])
        checks["checkpoint_roundtrip"] = roundtrip
        n = job.checks.resume_check_iters
        expected = [(int(r["step"]), r["loss"]) for r in train_records[-n:]]
        found = problems(resume_dir)
        checks["resume_bitwise"] = damaged(resume_dir, found) if found != [] else \
            check_resume(expected, lambda: replay_from(fresh, resume_dir, n))
    finally:
        fresh.close()
    # The whole timeline's steps (a stage resumed after its last step timed none itself).
    checks["throughput"] = check_throughput(train_records)
    for name, c in checks.items():
        log.info("smoke check %s: %s (%s)", name, "passed" if c["passed"] else "FAILED", c["detail"])
    return checks
