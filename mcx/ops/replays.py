"""A run's replay over one step with tracing (`mcx locate`, D70; across layouts, D74): the stage's own job
file run again from its checkpoint before the step, in ``<run>/replays/<name>/``, and its trace read back.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from mcx.contract.checkpoints import checkpoint_path, checkpoint_root, checkpoint_steps
from mcx.contract.files import JOB_FILE, LOG_FILE
from mcx.contract.job import read_job
from mcx.contract.result import read_stage_result
from mcx.contract.trace import REPLAYS_DIR, TRACE_DIR, records_file, trace_ranks
from mcx.errors import InputError, TrainingFailed
from mcx.jsonfile import write_json_atomic
from mcx.launch import launcher_for, placement, worker_env
from mcx.ops.progress import Note, Progress
from mcx.weights.checkpoint_files import LATEST

Records = list[dict[str, Any]]


def stage_job(stage: Path) -> dict[str, Any]:
    job: dict[str, Any] = json.loads((stage / JOB_FILE).read_text(encoding="utf-8"))
    return job


def replay(stage: Path, step: int, *, keep: tuple[str, ...] = (), again: bool = False, layers: bool = False,
           noise: bool = False, progress: Progress) -> Path:
    """Replay ``stage`` (a full stage directory) over ``step`` with tracing; returns the replay's directory.
    ``layers``, ``noise``: a replay across layouts, and the band's (mcx.ops.locate_layouts)."""
    job = stage_job(stage)
    name = f"step{step}" + (".again" if again else "") + (".keep" if keep else "") + (".noise" if noise else "") + \
        (".layers" if layers and not noise else "")
    out = stage.parent / REPLAYS_DIR / name
    done = read_stage_result(out)
    if done is not None and done.ok and trace_ranks(out / TRACE_DIR):
        return out
    if not Path(job["data_dir"]).is_dir():
        raise InputError(f"the data {stage} read is gone ({job['data_dir']}: a reproduction's worktree, removed after "
                         "it);", "restore that data version into the project (`dvc checkout`) and locate against the "
                         "original run, or reproduce again with --locate.")
    root = checkpoint_root(stage)
    steps = [s for s in checkpoint_steps(root) if s <= step - 1]
    if step > 1 and not steps:
        there = ", ".join(map(str, checkpoint_steps(root))) or "none"
        raise InputError(f"no checkpoint of {stage} at or before step {step - 1} to replay step {step} from "
                         f"(checkpoints at steps: {there});",
                         "pick a step just after one of those (--step), or train with a smaller checkpoint.interval "
                         "(and a larger checkpoint.keep) to locate steps between them.")
    shutil.rmtree(out, ignore_errors=True)
    ckpts = out / "checkpoints"
    ckpts.mkdir(parents=True)
    if steps:  # the run's checkpoint, linked, never written: the replay saves nothing
        source = checkpoint_path(root, steps[-1])
        os.symlink(source.resolve(), ckpts / source.name)
        (ckpts / LATEST).write_text(source.name, encoding="utf-8")
    job = {k: v for k, v in job.items() if k != "profile"}  # a run's `--profile` is not the replay's
    write_json_atomic(out / JOB_FILE, {**job, "checkpoint_dir": str(ckpts), "output": "quiet",
                                       "trace": {"step": step, "keep_bytes": 0 if layers else 64 * 2**20,
                                                 "keep": list(keep),
                                                 **({"layers": True, "noise": noise} if layers else {})}})
    parsed = read_job(out)
    start = f"checkpoint {steps[-1]}" if steps else "the stage's start"
    progress(Note(lead="locate", text=f": replaying step {step} of {stage.parent.name} from {start} -> {out}"))
    handle = launcher_for(parsed.spec.launch).start(out, placement(parsed.layout, parsed.device), parsed.spec.launch,
                                                    worker_env(parsed.spec))
    handle.wait()
    result = read_stage_result(out)
    if result is None or not result.ok or not trace_ranks(out / TRACE_DIR):
        raise TrainingFailed(f"the replay of step {step} in {out} failed: "
                             f"{result.error if result else 'no result written'};", f"see {out / LOG_FILE}.")
    return out


def read_trace(replay_dir: Path) -> Records:
    where = replay_dir / TRACE_DIR
    return [json.loads(line) for rank in trace_ranks(where)
            for line in (where / records_file(rank)).read_text(encoding="utf-8").splitlines() if line]
