"""A small real worker for the launcher tests: ``python -m launch_probe STAGE_DIR``.

It keeps the worker's job contract (job.json in, metrics.jsonl, checkpoints/latest and
result.json out, SIGTERM -> checkpoint and exit) around a step counter instead of a model, so
the tests prove the launch mechanics (processes, rendezvous, signals, requeue and resume)
without the cost of training. job.json keys: ``steps``, ``step_seconds``, ``fail_at_step``,
``crash_at_step`` (SIGKILL itself there), ``helper`` (start a helper process first, as Megatron-Core
starts its persistent checkpoint writer, and write its pid to ``helper.pid``).
With WORLD_SIZE > 1 it joins a gloo process group and all-reduces every step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ENV_REPORTED = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_ALGO",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "OMP_NUM_THREADS",
    "MCX_PROBE_VALUE",
    "SLURM_RESTART_COUNT",
)

stop_requested = False
term_signals = 0


def on_term(signum: int, frame: object) -> None:
    global stop_requested, term_signals
    stop_requested = True
    term_signals += 1


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def resume_step(stage: Path) -> int:
    try:
        name = (stage / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return 0
    return json.loads((stage / "checkpoints" / name / "counter.json").read_text())["step"]


def save_checkpoint(stage: Path, step: int) -> None:
    name = f"iter_{step:07d}"
    (stage / "checkpoints" / name).mkdir(parents=True, exist_ok=True)
    write_json(stage / "checkpoints" / name / "counter.json", {"step": step})
    tmp = stage / "checkpoints" / "latest.tmp"
    tmp.write_text(name)
    os.replace(tmp, stage / "checkpoints" / "latest")


def truncate_metrics(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def main() -> int:
    inherited = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_term)
    stage = Path(sys.argv[1])
    job = json.loads((stage / "job.json").read_text())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist = None
    reduced = float(rank + 1)
    if world > 1:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        reduced = t.item()

    def everyone_stops() -> bool:
        if dist is None:
            return stop_requested
        import torch

        flag = torch.tensor([1.0 if stop_requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    if job.get("helper"):  # a spawned daemon that waits forever, like MCore's checkpoint writer
        import multiprocessing

        helper = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(3600,), daemon=True)
        helper.start()
        (stage / "helper.pid").write_text(str(helper.pid))
    start = resume_step(stage)
    metrics = stage / "metrics.jsonl"
    if rank == 0:
        truncate_metrics(metrics, start)
        with open(stage / "worker.log", "a") as log:
            log.write(f"start at step {start + 1}, world size {world}\n")
    status, code, step = "finished", 0, start
    for step in range(start + 1, job["steps"] + 1):
        time.sleep(job.get("step_seconds", 0.0))
        if step == job.get("crash_at_step"):
            os.kill(os.getpid(), signal.SIGKILL)
        if step == job.get("fail_at_step"):
            status, code = "failed", 3
            break
        if rank == 0:
            with open(metrics, "a") as f:
                f.write(json.dumps({"kind": "train", "step": step, "loss": 1.0 / step}) + "\n")
        if everyone_stops():
            status = "preempted"
            break
    if rank == 0:
        if status != "failed":
            save_checkpoint(stage, step)
        write_json(
            stage / "result.json",
            {
                "status": status,
                "passed": status == "finished",
                "steps": step,
                "error": "fail_at_step reached" if status == "failed" else None,
                "world_size": world,
                "term_signals": term_signals,
                "term_inherited": getattr(inherited, "name", str(inherited)),
                "allreduce": reduced,
                "env": {k: os.environ.get(k) for k in ENV_REPORTED},
                "argv": sys.argv[1:],
            },
        )
    if dist is not None:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
