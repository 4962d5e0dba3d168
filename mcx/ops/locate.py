"""`mcx locate A B` and `mcx reproduce RUN --locate`: why two runs of one model and layout parted (D70).

Each run's full stage is replayed over the first step whose train loss differs (or ``--step N``): from its
newest checkpoint at or before step N-1, the worker runs the stage's own job file again (same spec, layout
and launcher) with the job's ``trace`` set, trains up to step N and traces that step (mcx.train.trace). The
replay is its own stage directory, ``<run>/replays/step<N>/``, holding a link to the checkpoint it starts
from: the run's metrics and checkpoints are never written (mcx.ops.replays). A replay that already finished
is reused. Two runs of one model in different layouts or micro-batch splits are compared layer by layer
instead (mcx.ops.locate_layouts, D74).

The two traces are diffed offline (mcx.report.located): the first record whose output differs, classified
from the runs' fingerprints (data, config, code, environment, hardware), the trace itself (only updates differ:
the optimizer) and, where nothing else explains it, a second replay of the first run (differs from the
first replay: a non-deterministic kernel). Its size is the max abs difference of the full tensors, which
the replays keep for their first records, and which a second pair of replays keeps for a later one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcx.contract.files import JOB_FILE, METRICS_FILE
from mcx.contract.trace import TRACE_DIR, tensors_file
from mcx.errors import InputError, RunIdError
from mcx.fingerprint.diff import explain
from mcx.fingerprint.record import record_from_dict
from mcx.metrics.curves import read_metrics
from mcx.ops.locate_layouts import locate_across, micro_split
from mcx.ops.progress import Note, Progress
from mcx.ops.replays import Records, read_trace, replay, stage_job
from mcx.report.located import (FIXES, Kind, Located, difference, first_pair, only_updates_differ,
                                structure_problem)
from mcx.report.parted import LayoutsLocated
from mcx.track.paths import check_run_id, run_dir

REF = re.compile(r"^([0-9a-f]{12})(?:/(r[0-9]+))?$")


def run_path(project: Path, ref: str) -> Path:
    """The directory of ``RUN_ID`` or ``RUN_ID/rN`` (its reproduction N), which must have a full stage."""
    m = REF.match(ref)
    if not m:
        raise RunIdError(f"{ref!r} is not a run ID or RUN_ID/rN;", "name a run ID (12 lowercase hex digits, `mcx ls`) "
                         "or a reproduction of one, RUN_ID/rN (`mcx reproduce` prints its label).")
    path = run_dir(project, check_run_id(m.group(1)))
    if m.group(2):
        path = path / "reproductions" / m.group(2)
    if not (path / "full" / JOB_FILE).is_file() or not (path / "full" / METRICS_FILE).is_file():
        raise RunIdError(f"{ref}: no trained full stage in {path};", "name a run (or reproduction) that trained: "
                                                                     "`mcx ls` lists the runs.")
    return path


COMPARED = ("train/loss", "train/grad_norm")  # what says two steps trained alike


def _train_curves(stage: Path) -> dict[str, dict[int, float]]:
    """Each compared metric of the stage's metrics.jsonl, step -> value (mcx.metrics's reader)."""
    curves, _ = read_metrics(stage / METRICS_FILE)
    return {name: dict(zip(c.steps, c.values)) for name in COMPARED if (c := curves.get(name)) is not None}


def _last_step(curves: dict[str, dict[int, float]]) -> int:
    return max(curves.get("train/loss", {}), default=0)


def first_differing_step(ca: dict[str, dict[int, float]], cb: dict[str, dict[int, float]]) -> int | None:
    """The first step whose train loss or gradient norm differs (bitwise) between two stages' curves; None: none."""
    both = sorted(set(ca.get("train/loss", {})) & set(cb.get("train/loss", {})))
    for step in both:
        if any(ca.get(k, {}).get(step) != cb.get(k, {}).get(step) for k in COMPARED):
            return step
    return None


def _kept(replay_dir: Path, rank: int, key: str) -> Any:
    import torch  # only here: reading the kept tensors of the record found

    path = replay_dir / TRACE_DIR / tensors_file(rank)
    return torch.load(path, weights_only=True).get(key) if path.is_file() else None


def max_abs(a: Path, b: Path, rank: int, key: str) -> float | None:
    x, y = _kept(a, rank, key), _kept(b, rank, key)
    if x is None or y is None or x.shape != y.shape:
        return None
    return float((x.double() - y.double()).abs().max()) if x.numel() else 0.0


def _fingerprint(path: Path) -> Any:
    file = path / "fingerprint.json"
    return record_from_dict(json.loads(file.read_text(encoding="utf-8")), str(file))


def _named(changes: Sequence[Any]) -> str:
    changes = [c for c in changes if c.a != c.b]  # a table added with unset keys: only those set
    return ", ".join(f"{c.key} ({c.a!r} -> {c.b!r})" for c in changes[:6]) + (" ..." if len(changes) > 6 else "")


def locate(ref_a: str, ref_b: str, *, project: Path, step: int | None = None,
           progress: Progress) -> Located | LayoutsLocated:
    """Replay both runs over ``step`` (default: the first step whose loss differs) and name the first operation
    whose output differs while its inputs matched, with its class and the fix to try; for two layouts (or
    micro-batch splits) of one model, compare them layer by layer within a measured band (D74)."""
    path_a, path_b = run_path(project, ref_a), run_path(project, ref_b)
    stage_a, stage_b = path_a / "full", path_b / "full"
    ja, jb = stage_job(stage_a), stage_job(stage_b)
    across = (ja["layout"], ja.get("device"), micro_split(ja)) != (jb["layout"], jb.get("device"), micro_split(jb))
    ca, cb = _train_curves(stage_a), _train_curves(stage_b)
    last = min(_last_step(ca), _last_step(cb))
    if step is None:
        step = first_differing_step(ca, cb)
        if step is None and across:  # equal curves say little of two layouts' tensors: the last step both trained
            step = last or None
        if step is None:
            return Located(run_a=ref_a, run_b=ref_b, step=None, first=None, kind=None, cause="every recorded step's "
                           "loss and gradient norm are bitwise equal", fix="nothing to fix", records=0, replays=())
    if not 1 <= step <= last:
        raise InputError(f"--step {step} is outside the steps both runs trained (1 to {last});",
                         "give a step both recorded.")
    if across:
        return locate_across(ref_a, ref_b, path_a, path_b, ja, jb, step, progress=progress)
    ra, rb = replay(stage_a, step, progress=progress), replay(stage_b, step, progress=progress)
    ta, tb = read_trace(ra), read_trace(rb)
    replays: tuple[str, ...] = (str(ra), str(rb))
    problem = structure_problem(ta, tb)
    if problem:
        raise InputError(f"{ref_a} and {ref_b} cannot be compared operation by operation at step {step}: {problem};",
                         "compare runs of one model and layout.")
    pair = first_pair(ta, tb)
    if pair is None:
        return Located(run_a=ref_a, run_b=ref_b, step=step, first=None, kind=None, cause=f"all {len(ta)} records of "
                       f"step {step} are bitwise equal", fix="nothing to fix", records=len(ta) + len(tb),
                       replays=replays)
    x, y = pair
    if not (x.get("kept") and y.get("kept")):  # a later record than the budget kept: replay both, keeping it
        ra2 = replay(stage_a, step, keep=(x["key"],), progress=progress)
        rb2 = replay(stage_b, step, keep=(x["key"],), progress=progress)
        size, replays = max_abs(ra2, rb2, x["rank"], x["key"]), (*replays, str(ra2), str(rb2))
    else:
        size = max_abs(ra, rb, x["rank"], x["key"])
    first = difference(x, y, size)
    kind, cause = _classify(path_a, path_b, stage_a, step, first, ta, tb, progress)
    return Located(run_a=ref_a, run_b=ref_b, step=step, first=first, kind=kind, cause=cause, fix=FIXES[kind],
                   records=len(ta) + len(tb), replays=replays)


def _classify(path_a: Path, path_b: Path, stage_a: Path, step: int, first: Any, ta: Records, tb: Records,
              progress: Progress) -> tuple[Kind, str]:
    """The class of the first difference and what it rests on (module docstring)."""
    if first.phase == "batch":
        return "data", f"the input batch of micro-batch {first.micro_batch} differs (token ids, labels or masks)"
    components = {c.component: c for c in explain(_fingerprint(path_a), _fingerprint(path_b)).components}
    if "config" in components:
        return "config", "the configs differ: " + _named(components["config"].changes)
    if "data" in components:
        return "data", "the data differs: " + _named(components["data"].changes)
    if "code" in components:
        return "library", "mcx's code differs: " + _named(components["code"].changes)
    if "environment" in components:
        return "library", "the environments differ: " + _named(components["environment"].changes)
    if only_updates_differ(ta, tb):
        return "optimizer", "every batch, forward, backward and gradient record matches; a parameter update differs"
    if "hardware" in components:
        return "hardware", "the hardware differs: " + _named(components["hardware"].changes)
    again = read_trace(replay(stage_a, step, again=True, progress=progress))
    pair = first_pair(ta, again)
    if pair is not None:
        where = difference(pair[0], pair[1], None).where()
        return "nondeterministic", f"{path_a.name} replayed twice already differs, first at {where}"
    return "unexplained", "config, data, environment and hardware match, and a second replay is bitwise equal to the first"


def locate_reproduction(run_id: str, reproduction: str, diverged: bool, *, project: Path,
                        progress: Progress) -> Located | LayoutsLocated:
    """`mcx reproduce RUN --locate`: after a verdict, the original and its reproduction located against each
    other around the first step whose loss differs (nothing replayed when they never differ)."""
    if not diverged:
        progress(Note(text="locate: the verdict is not a divergence; comparing the recorded steps only"))
    return locate(run_id, f"{run_id}/{reproduction}", project=project, progress=progress)
