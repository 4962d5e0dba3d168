"""What tracking costs a training run: forwarding overhead side by side with a simulated worker.

A worker process runs N steps (each a CPU-bound spin of --step-time seconds, like a training loop's
host thread) and appends one metrics.jsonl line per step exactly as mcx's worker does (eval lines
every --eval-interval steps). It runs twice: alone, and with the control plane forwarding its file
to MLflow (embedded SQLite store) through mcx.track's MetricsForwarder. Reported:

- ``worker``: mean step time alone and while forwarded, and their ratio (the worker's slowdown);
- ``forwarder``: the control plane's CPU seconds and busy (wall) seconds per training step, and as a
  fraction of the step time (target: < 1 %);
- ``startup``: one-time costs (importing mlflow, dvc; opening the store);
- ``sync``: replaying a run recorded offline (metrics per second);
- ``curves``: reading one metric of 100 runs x 10,000 steps from run directories (``mcx compare``).

Usage: python benchmarks/tracking_overhead.py [--steps 120] [--step-time 0.5] [--poll S] [--json out.json]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKER = textwrap.dedent("""
    import json, sys, time
    path, out = sys.argv[1], sys.argv[5]
    steps, step_time, eval_interval = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    times = []
    with open(path, "a") as f:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < step_time:   # the step's host-side work
                pass
            rec = {"kind": "train", "step": step, "loss": 10.0 / step, "grad_norm": 1.0, "lr": 3e-4,
                   "tokens_per_s_per_gpu": 9407.1, "tflops_per_gpu": 454.2, "mfu": 0.459,
                   "mem_peak_bytes": 125627793408, "step_time_s": step_time, "time": time.time()}
            f.write(json.dumps(rec, sort_keys=True) + "\\n")
            if step % eval_interval == 0:
                f.write(json.dumps({"kind": "valid", "step": step, "loss": 3.2, "ppl": 24.5}, sort_keys=True) + "\\n")
            f.flush()
            times.append(time.perf_counter() - t0)
    json.dump(times, open(out, "w"))
""")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _import_cost(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _project(base: Path, run_id: str, stages: tuple[str, ...] = ("full",)) -> tuple[Path, Path]:
    from mcx.spec.load import dump_spec, load_spec

    project = base / "project"
    rdir = project / ".mcx" / "runs" / run_id
    for stage in stages:
        (rdir / stage).mkdir(parents=True, exist_ok=True)
    (rdir / "spec.toml").write_text(dump_spec(load_spec(REPO / "experiments" / "tiny.toml")))
    return project, rdir


def _run_worker(stage_dir: Path, steps: int, step_time: float, eval_interval: int) -> list[float]:
    out = stage_dir.parent / f"times-{time.monotonic_ns()}.json"
    subprocess.run([sys.executable, "-c", WORKER, str(stage_dir / "metrics.jsonl"), str(steps), str(step_time),
                    str(eval_interval), str(out)], check=True)
    return json.loads(out.read_text())


def forwarding(base: Path, steps: int, step_time: float, eval_interval: int, poll_s: float) -> dict:
    from mcx.track.recorder import RunRecorder

    # Alone.
    _, alone_dir = _project(base / "alone", "00000000a10e")
    alone = _run_worker(alone_dir / "full", steps, step_time, eval_interval)

    # Forwarded: the store is opened first (one-time startup, reported separately).
    project, rdir = _project(base / "forwarded", "00000000f0ad")
    rec = RunRecorder.for_run(project, rdir)
    t0 = time.perf_counter()
    rec.start()
    rec.start_stage("full")
    first = rec.flush()
    startup_s = time.perf_counter() - t0
    assert first.error is None, first
    cpu0, wall0 = _cpu(), time.perf_counter()
    fwd = rec.forwarder("full", poll_s=poll_s).start()
    poll_s = fwd.poll_s
    forwarded = _run_worker(rdir / "full", steps, step_time, eval_interval)
    last = fwd.stop()
    cpu = _cpu() - cpu0
    wall = time.perf_counter() - wall0
    assert last is not None and last.error is None and last.pending_bytes == 0, last
    cursor = json.loads((rdir / "full" / "tracked.json").read_text())
    mean_alone = sum(alone) / len(alone)
    mean_fwd = sum(forwarded) / len(forwarded)
    return {
        "steps": steps, "step_time_s": step_time, "poll_s": poll_s, "metrics_sent": cursor["metrics"],
        "worker": {"mean_step_s_alone": mean_alone, "mean_step_s_forwarded": mean_fwd,
                   "slowdown_ratio": mean_fwd / mean_alone},
        "forwarder": {
            "cpu_s": cpu, "busy_s": fwd.busy_s, "cycles": fwd.cycles, "wall_s": wall,
            "cpu_s_per_step": cpu / steps, "busy_s_per_step": fwd.busy_s / steps,
            "cpu_fraction_of_step": cpu / steps / mean_alone, "busy_fraction_of_step": fwd.busy_s / steps / mean_alone,
        },
        "store_open_and_first_flush_s": startup_s,
    }


def sync_replay(base: Path, steps: int) -> dict:
    from mcx.track.mlflow_store import MlflowStore
    from mcx.track.recorder import RunRecorder
    from mcx.track.sync import sync
    from mcx.track.target import resolve_target

    project, rdir = _project(base / "sync", "000000005ec0", ("full",))
    rec = RunRecorder.for_run(project, rdir, tracking_uri="http://127.0.0.1:9")  # nothing listens: all spooled
    rec.start()
    rec.start_stage("full")
    lines = []
    for s in range(1, steps + 1):
        lines.append(json.dumps({"kind": "train", "step": s, "loss": 1.0 / s, "grad_norm": 1.0, "lr": 3e-4,
                                 "tokens_per_s_per_gpu": 9e3, "tflops_per_gpu": 450.0, "mfu": 0.45,
                                 "mem_peak_bytes": 1e11, "step_time_s": 0.9, "time": 1.7e9 + s}, sort_keys=True))
    (rdir / "full" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rec.finish("finished")
    offline = rec.close()
    assert offline.state == "pending", offline
    # Replay everything into the embedded store (opened first: its creation is a startup cost).
    MlflowStore(resolve_target(project, "embedded")).client.search_experiments()
    t0 = time.perf_counter()
    report = sync(project, tracking_uri="embedded")
    dt = time.perf_counter() - t0
    return {"steps": steps, "metrics": report.metrics_sent, "ops": report.ops_sent, "seconds": dt,
            "metrics_per_s": report.metrics_sent / dt if dt else None, "ok": report.ok}


def curves(base: Path, runs: int, steps: int) -> dict:
    from mcx.track.query import metric_history

    project = base / "curves"
    first = None
    for i in range(runs):
        sdir = project / ".mcx" / "runs" / f"{i:012x}" / "full"
        sdir.mkdir(parents=True)
        if first is None:
            with open(sdir / "metrics.jsonl", "w") as f:
                for s in range(1, steps + 1):
                    f.write(json.dumps({"kind": "train", "step": s, "loss": 10.0 / s, "grad_norm": 1.0, "lr": 3e-4,
                                        "tokens_per_s_per_gpu": 9407.1, "tflops_per_gpu": 454.2, "mfu": 0.459,
                                        "mem_peak_bytes": 125627793408, "step_time_s": 0.87, "time": 1.7e9 + s},
                                       sort_keys=True) + "\n")
            first = sdir / "metrics.jsonl"
        else:
            shutil.copyfile(first, sdir / "metrics.jsonl")
    t0 = time.perf_counter()
    total = sum(len(metric_history(project, f"{i:012x}", "full", "train/loss")) for i in range(runs))
    return {"runs": runs, "steps": steps, "points": total, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-time", type=float, default=0.5)
    ap.add_argument("--eval-interval", type=int, default=50)
    ap.add_argument("--poll", type=float, default=None, help="forwarder poll interval (default: mcx's)")
    ap.add_argument("--sync-steps", type=int, default=10_000)
    ap.add_argument("--curve-runs", type=int, default=100)
    ap.add_argument("--curve-steps", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    base = Path(tempfile.mkdtemp(prefix="mcx-track-bench-"))
    try:
        result = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        "loadavg_start": os.getloadavg()},
            "startup": {"import_mlflow_s": _import_cost("mlflow.tracking"),
                        "import_dvc_repo_s": _import_cost("dvc.repo"),
                        "import_mcx_track_s": _import_cost("mcx.track")},
            "forwarding": forwarding(base, args.steps, args.step_time, args.eval_interval, args.poll),
            "sync": sync_replay(base, args.sync_steps),
            "curves": curves(base, args.curve_runs, args.curve_steps),
        }
        result["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
