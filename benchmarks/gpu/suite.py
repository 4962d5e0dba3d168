"""The GPU suite's runner (benchmarks/gpu/suite.sh installs the carried wheels, then runs this).

    python3 benchmarks/gpu/suite.py OUT [--only NAME[,NAME...]] [--list] [--timeout S] [-- EXTRA ARGS]

Runs the named tasks one after the other (default: gpu, gpu-fp8, site, gpu2, throughput-1gpu), each with its output in
OUT/<name>.log (and its files under OUT/<name>/), and writes OUT/junit.xml (the pytest tasks' JUnit
reports merged) and OUT/summary.json (per task: exit code, wall time; per test: outcome and duration;
the throughput figures; the GPUs and versions). EXTRA ARGS go to the end of the one task named by
--only (pytest options such as ``-k fp8``; ``--mbs 2`` or ``--set KEY=VALUE`` for throughput.py, which
override the task's own; gpu_validation.py options). A task that needs more GPUs than are visible is
recorded as skipped. Exit code: 0 when every task that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
WORK = Path("/tmp/mcx-gpu-suite")  # checkpoints and stage directories stay here, not in OUT
T = ["benchmarks/throughput.py"]
V = ["benchmarks/gpu_validation.py"]
S1, S2, S2F = "experiments/h200_1gpu.toml", "experiments/h200_2gpu.toml", "experiments/h200_2gpu_fp8.toml"

# name: (GPUs, minutes (gpu measured on one H100 on 2026-12-05; the others estimated on H200s from the runs of
# 2026-11-30 and site_check/ckpt_integrity), what, argv).
# In argv, {out} is OUT/<name> and {work} this task's work directory.
TASKS: dict[str, tuple[int, float, str, list[str]]] = {
    "gpu": (1, 11.5, "pytest -m gpu: tests/gpu on one GPU, but FP8 against bf16 (task gpu-fp8)",
            [PY, "-m", "pytest", "tests/gpu", "-m", "gpu", "-k", "not fp8", "-p", "no:cacheprovider", "-q", "-rfEs",
             "--durations=0"]),
    "gpu-fp8": (1, 8, "pytest -m gpu -k fp8: FP8 against bf16 for 300 steps at two seeds on one GPU",
                [PY, "-m", "pytest", "tests/gpu", "-m", "gpu", "-k", "fp8", "-p", "no:cacheprovider", "-q", "-rfEs",
                 "--durations=0"]),
    "site": (1, 1.5, "pytest tests/test_preflight.py where Transformer Engine is installed (Slurm's test left to CI)",
             [PY, "-m", "pytest", "tests/test_preflight.py", "-m", "not slurm", "-p", "no:cacheprovider", "-q", "-rfEs",
              "--durations=0"]),
    "gpu2": (2, 6, "pytest -m gpu2: tests/gpu's two-GPU layouts",
             [PY, "-m", "pytest", "tests/gpu", "-m", "gpu2", "-p", "no:cacheprovider", "-q", "-rfEs", "--durations=0"]),
    # docs/benchmarks.md: mcx vs the bare loop (ratio), MFU, FP8 ratio; README's "Speed on H200".
    "throughput-1gpu": (1, 4, "throughput.py: one-H200 spec, Transformer Engine, micro-batch 4, bare loop and mcx",
                        [PY, *T, "--spec", S1, "--impl", "te", "--mbs", "4", "--steps", "5", "--warmup", "2",
                         "--runners", "bare,mcx", "--work-dir", "{work}", "--out", "{out}/throughput.json"]),
    "throughput-1gpu-local": (1, 4, "throughput.py: one-H200 spec, local spec + SDPA, micro-batch 4, bare and mcx",
                              [PY, *T, "--spec", S1, "--impl", "local", "--mbs", "4", "--steps", "5", "--warmup", "2",
                               "--runners", "bare,mcx", "--work-dir", "{work}", "--out", "{out}/throughput.json"]),
    "throughput-1gpu-fp8": (1, 2.5, "throughput.py: one-H200 spec, FP8 hybrid with the fused MLP, micro-batch 4, mcx",
                            [PY, *T, "--spec", S1, "--impl", "te", "--fp8", "hybrid", "--mbs", "4", "--steps", "5",
                             "--warmup", "2", "--runners", "mcx", "--set", "train.te_op_fuser=true",
                             "--work-dir", "{work}", "--out", "{out}/throughput.json"]),
    # Issue 41's small shapes (throughput.py PRESETS): bare loop, mcx and mcx with CUDA graphs, then 3 profiled
    # steps of each; 5 warm-up steps, the graphs' capture (after 3 eager steps) among them.
    **{f"throughput-{name}": (1, minutes, f"throughput.py --preset {name}: Transformer Engine, bare, mcx and mcx with "
                                          "CUDA graphs, then 3 profiled steps of each (op tables in throughput.json)",
                              [PY, *T, "--preset", name, "--impl", "te", "--steps", "10", "--warmup", "5",
                               "--profile", "3", "--runners", "bare,mcx,graphs", "--work-dir", "{work}",
                               "--out", "{out}/throughput.json"])
       for name, minutes in (("quickstart", 2.5), ("layout", 3.5), ("350m", 4), ("1b", 4.5))},
    "throughput-2gpu": (2, 3.5, "throughput.py: LLaMA-3 8B, DP 2, Transformer Engine, bf16, mcx",
                        [PY, *T, "--spec", S2, "--gpus", "2", "--impl", "te", "--steps", "4", "--warmup", "2",
                         "--runners", "mcx", "--work-dir", "{work}", "--out", "{out}/throughput.json"]),
    "throughput-2gpu-fp8": (2, 4, "throughput.py: the FP8 recipe (LLaMA-3 8B, seq 8192, DP 2), mcx",
                            [PY, *T, "--spec", S2F, "--gpus", "2", "--impl", "te", "--steps", "4", "--warmup", "2",
                             "--runners", "mcx", "--work-dir", "{work}", "--out", "{out}/throughput.json"]),
    "fp8-curve": (1, 4, "gpu_validation.py fp8-curve: FP8 against bf16 for 300 steps",
                  [PY, *V, "fp8-curve", "--gpus", "0", "--steps", "300", "--work-dir", "{work}", "--out", "{out}"]),
    "layouts": (2, 8, "gpu_validation.py layouts: one-GPU references and two-GPU layouts (--only via EXTRA ARGS)",
                [PY, *V, "layouts", "--gpus", "0,1", "--work-dir", "{work}", "--out", "{out}", "--timeout", "150"]),
    "faults": (1, 4, "gpu_validation.py faults: SIGKILL and SIGTERM, resumed, against an uninterrupted run",
               [PY, *V, "faults", "--gpus", "0", "--work-dir", "{work}", "--out", "{out}", "--timeout", "240"]),
    "ckpt-stall": (1, 3.5, "gpu_validation.py ckpt-stall: synchronous against asynchronous saves, every 40 of 121 steps",
                   [PY, *V, "ckpt-stall", "--gpus", "0", "--spec", "dense", "--steps", "121", "--every", "40",
                    "--work-dir", "{work}", "--out", "{out}", "--timeout", "125"]),
    "trace-cost": (1, 2, "trace_cost.py: a step untraced, traced as `mcx locate` replays it and with the cross-layout "
                         "trace, alternated (D74); tiny.toml at hidden 1024, 8 layers, bf16",
                   [PY, "benchmarks/trace_cost.py", "--device", "cuda", "--steps", "8", "--set", "model.num_layers=8",
                    "--set", "model.hidden_size=1024", "--set", "model.num_attention_heads=16", "--set",
                    "model.ffn_hidden_size=2816", "--set", 'train.precision="bf16"', "--out", "{out}/trace_cost.json"]),
    "levers": (1, 13, "levers.py: the one-H200 spec's levers one by one, 20 steps each (MFU, FP8 / bf16, deterministic "
                      "mode's cost); on one call's time: `-- --only` a few at a time",
               [PY, "benchmarks/levers.py", "--out", "{out}"]),
    "plan-check": (1, 6, "plan_check.py: the plan's step time and peak memory against mcx's worker on configurations "
                         "outside the calibration (full recomputation at micro-batch 4, selective, MoE on one GPU)",
                   [PY, "benchmarks/plan_check.py", "--profile", "3", "--out", "{out}"]),
    "mcx-run-1gpu": (1, 4, "gpu_validation.py mcx-run: mcx run experiments/h200_1gpu.toml",
                     [PY, *V, "mcx-run", "--gpus", "0", "--out", "{out}", "--tag", "1gpu", "--timeout", "450", "--",
                      S1, "--yes"]),
    "mcx-run-2gpu": (2, 5, "gpu_validation.py mcx-run: mcx run experiments/h200_2gpu.toml",
                     [PY, *V, "mcx-run", "--gpus", "0,1", "--out", "{out}", "--tag", "2gpu", "--timeout", "500", "--",
                      S2, "--yes"]),
    "mcx-run-2gpu-fp8": (2, 6.5, "gpu_validation.py mcx-run: mcx run experiments/h200_2gpu_fp8.toml",
                         [PY, *V, "mcx-run", "--gpus", "0,1", "--out", "{out}", "--tag", "2gpu-fp8", "--timeout", "500",
                          "--", S2F, "--yes"]),
    "tune-1gpu": (1, 6, "mcx tune of the one-H200 spec on Transformer Engine up to micro-batch 8",
                  [PY, "-m", "mcx", "tune", S1, "--set", 'model.transformer_impl="transformer_engine"',
                   "--max-micro-batch", "8", "--steps", "4", "-o", "{out}/tuned.toml", "--json"]),
    "tune-layouts-1gpu": (1, 6, "mcx tune --layouts of the one-H200 spec: the model's top 3 layouts measured",
                          [PY, "-m", "mcx", "tune", "--layouts", S1, "--set", 'model.transformer_impl="transformer_engine"',
                           "--top", "3", "--steps", "4", "-o", "{out}/tuned_layouts.toml", "--json"]),
    "first-save": (1, 1, "first_save.py: one rank's first saves, profiled",
                   [PY, "benchmarks/first_save.py", "--mib", "1316", "--tensors", "212", "--dir", "{work}",
                    "--out", "{out}/first_save.json"]),
    "host-staging": (1, 1, "host_staging.py: pinned host buffers and the disk",
                     [PY, "benchmarks/host_staging.py", "--gib", "1.3", "--tensors", "64", "--dir", "{work}",
                      "--out", "{out}/host_staging.json"]),
    "site-check": (1, 2.5, "site_check.sh: the worker's node check, mcx run with and without Transformer Engine",
                   ["bash", "benchmarks/gpu/site_check.sh"]),
    "ckpt-integrity": (1, 6, "ckpt_integrity.sh: checkpoint checksums, damage named and set aside",
                       ["bash", "benchmarks/gpu/ckpt_integrity.sh"]),
}
DEFAULT = ("gpu", "gpu-fp8", "site", "gpu2", "throughput-1gpu")


def gpus() -> tuple[int, list[str]]:
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        names = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len(names) if visible is None else len([x for x in visible.split(",") if x.strip()])
    return count, names


def versions() -> dict[str, Any]:
    probe = ("import json, sys, torch\nout = {'python': sys.version.split()[0], 'torch': torch.__version__, "
             "'cuda': torch.version.cuda}\n"
             "for name, mod in (('megatron-core', 'megatron.core'), ('transformer-engine', 'transformer_engine')):\n"
             "    try:\n        m = __import__(mod, fromlist=['x']); out[name] = getattr(m, '__version__', '?')\n"
             "    except Exception as exc:\n        out[name] = f'not importable: {type(exc).__name__}'\n"
             "print(json.dumps(out))")
    done = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else {
        "error": done.stderr[-500:]}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    found["mcx_commit"] = commit.stdout.strip() if commit.returncode == 0 else None
    return found


def junit_tests(path: Path) -> dict[str, Any]:
    """Outcome counts and each test's outcome and duration from a pytest JUnit report."""
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    tests = {}
    for case in root.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                tests[f"{case.get('classname')}::{case.get('name')}"] = {
                    "outcome": outcome, "duration_s": round(float(case.get("time") or 0), 2),
                    "message": (el.get("message") or "")[:500]}
                break
        else:
            tests[f"{case.get('classname')}::{case.get('name')}"] = {
                "outcome": outcome, "duration_s": round(float(case.get("time") or 0), 2)}
    counts = {k: sum(t["outcome"] == k for t in tests.values()) for k in ("passed", "failed", "error", "skipped")}
    return {"counts": counts, "tests": tests}


def throughput_figures(path: Path) -> dict[str, Any] | None:
    """The headline figures of one throughput.py result (its whole JSON is in OUT/<task>/)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    keep = ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu_median", "tflops_per_gpu", "mfu", "mem_peak_bytes", "error",
            "step_time_s_median", "plan_error")
    out: dict[str, Any] = {k: data.get(k) for k in ("spec", "preset", "impl", "precision", "micro_batch_size", "gpu_name",
                                                     "ratio", "ratio_median", "meets_target", "ratio_graphs_bare",
                                                     "ratio_graphs_mcx")}
    plan = data.get("plan") or {}
    out["plan"] = {k: plan.get(k) for k in ("step_s", "compute_bound_s", "mem_bytes")}
    for runner, run in (data.get("runs") or {}).items():
        if isinstance(run, dict):
            out[runner] = {k: run[k] for k in keep if k in run}
    return out


def run_task(name: str, out: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    need, _, _, argv = TASKS[name]
    task_out, work = out / name, WORK / name
    shutil.rmtree(work, ignore_errors=True)
    task_out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    argv = [a.format(out=task_out, work=work) for a in argv] + extra
    env = {**os.environ, "OUT": str(task_out), "MCX_GPU_OUT": str(task_out)}
    if argv[1:3] == ["-m", "pytest"]:
        argv += [f"--junitxml={task_out / 'junit.xml'}", f"--basetemp={work / 'pytest'}"]
    print(f"suite: {name}: {shlex.join(argv)}", flush=True)
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait()
            log.write(f"\nsuite: {name} stopped after {timeout:.0f} s\n")
    wall = round(time.monotonic() - t0, 1)
    result: dict[str, Any] = {"rc": rc, "wall_s": wall, "status": "passed" if rc == 0 else "failed",
                              "argv": argv}
    if (task_out / "junit.xml").is_file():
        result.update(junit_tests(task_out / "junit.xml"))
        # The workers' own logs of every test, for what an assertion message does not show.
        for f in (work / "pytest").rglob("*"):
            if f.is_file() and f.name in ("worker.log", "launch.log", "result.json", "verdict.json"):
                dest = task_out / "logs" / f.relative_to(work / "pytest")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)
    figures = throughput_figures(task_out / "throughput.json")
    if figures is not None:
        result["throughput"] = figures
    tail = (out / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
    print("\n".join(f"  {line[:300]}" for line in tail), flush=True)
    print(f"suite: {name}: {result['status']} (rc {rc}) in {wall} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)  # checkpoints: GBs
    return result


def merge_junit(out: Path, names: list[str]) -> None:
    root = ET.Element("testsuites")
    for name in names:
        path = out / name / "junit.xml"
        if path.is_file():
            got = ET.parse(path).getroot()
            for suite in ([got] if got.tag == "testsuite" else list(got)):
                suite.set("name", f"{name}")
                root.append(suite)
    ET.ElementTree(root).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--only", default=",".join(DEFAULT), help="comma-separated task names (--list names them)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--timeout", type=float, default=580, help="seconds per task")
    args = p.parse_args(argv[:cut])
    extra = argv[cut + 1:]
    if args.list:
        for name, (need, minutes, what, _) in TASKS.items():
            print(f"{name:22} {need} GPU{'s' if need > 1 else ' '} ~{minutes:>4} min  {what}")
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        print(f"suite: unknown task(s) {unknown}; --list names them", file=sys.stderr)
        return 2
    if extra and len(names) != 1:
        print("suite: EXTRA ARGS after -- need exactly one task in --only", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    count, gpu_names = gpus()
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpus_visible": count,
                               "gpu": gpu_names, "tasks": {}}
    t0 = time.monotonic()
    for name in names:
        need = TASKS[name][0]
        if count < need:
            reason = f"needs {need} GPUs, {count} visible"
            print(f"suite: {name}: skipped ({reason})", flush=True)
            summary["tasks"][name] = {"status": "skipped", "reason": reason}
        else:
            summary["tasks"][name] = run_task(name, out, extra, args.timeout)
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    merge_junit(out, names)
    ran = [t for t in summary["tasks"].values() if t["status"] != "skipped"]
    summary["versions"] = versions()
    summary["counts"] = {k: sum(t.get("counts", {}).get(k, 0) for t in ran) for k in ("passed", "failed", "error", "skipped")}
    summary["tasks_passed"] = sum(t["status"] == "passed" for t in ran)
    summary["tasks_failed"] = sum(t["status"] == "failed" for t in ran)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"suite: {summary['tasks_passed']} task(s) passed, {summary['tasks_failed']} failed; tests "
          f"{summary['counts']}; {summary['wall_s']} s", flush=True)
    return 0 if summary["tasks_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
