"""Cold `mcx plan`: a fresh process per call, for every shipped spec, next to a bare interpreter start.

For each ``experiments/*.toml`` and ``experiments/published/*.toml``, ``--repeats`` times (rounds
interleaved with the baseline, so machine load hits both alike):

    plan      ``python -m mcx plan SPEC --json`` in a new process: interpreter start, imports,
              load, plan, fingerprint (git, DVC files, hardware probe) and run ID
    baseline  ``python -c pass`` in a new process: the interpreter's own start-up

and once more, untimed, through a wrapper that runs the same command with ``runpy`` and then lists
what it imported: the control plane must not import torch, megatron, transformer_engine, mlflow or
dvc (docs/architecture.md). ``-X importtime`` of one more run names the slowest imports.

Prints one JSON object: per spec the median, min and max wall time, the ratio of the medians
(plan / baseline) and the difference, the median CPU time (user + system of the child: less
sensitive than wall time to other load on the machine) and its ratio, the exit codes, the
forbidden modules imported (must be empty) and the slowest imports; the baseline; the load average.

    .venv/bin/python benchmarks/plan_cold.py [--repeats 5] [--specs experiments/tiny.toml ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "megatron", "transformer_engine", "mlflow", "dvc")
MARKER = "plan_cold:modules="

# Runs `mcx plan` in this interpreter as `python -m mcx` would, then reports the top-level modules
# it imported (stderr, one marker line), exiting with mcx's exit code.
WRAPPER = f"""
import json, runpy, sys
sys.argv = ["mcx", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("mcx", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
top = sorted({{name.split(".")[0] for name in list(sys.modules)}} - set(sys.stdlib_module_names) - {{"__main__"}})
sys.stderr.write("{MARKER}" + json.dumps(top) + "\\n")
sys.exit(code)
"""


def timed(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the child: user + system, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def imported_modules(python: str, spec: str) -> tuple[list[str], int]:
    done = subprocess.run([python, "-c", WRAPPER, "plan", spec, "--json"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    lines = [line for line in done.stderr.splitlines() if line.startswith(MARKER)]
    if not lines:
        raise SystemExit(f"plan_cold: the import probe for {spec} printed no module list:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARKER):]), done.returncode


def slowest_imports(python: str, spec: str, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` top-level imports with the largest cumulative time (``-X importtime``)."""
    done = subprocess.run([python, "-X", "importtime", "-m", "mcx", "plan", spec, "--json"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        # Nested imports are indented by two spaces per level after the one separating space.
        if cumulative.strip().isdigit() and name.startswith(" ") and not name.startswith("  "):
            rows.append({"module": name.strip(), "cumulative_ms": int(cumulative) / 1000})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:n]


def summary(runs: list[tuple[float, float]]) -> dict[str, float]:
    """Wall time (median, min, max) and CPU time (median) over runs of (wall, cpu) seconds."""
    walls = [wall for wall, _ in runs]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "cpu_median_s": statistics.median(cpu for _, cpu in runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Cold `mcx plan` per shipped spec vs `python -c pass` (fresh processes).")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--specs", nargs="*", help="default: every experiments/*.toml and experiments/published/*.toml")
    p.add_argument("--python", default=sys.executable, help="the interpreter of the environment to measure")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args(argv)
    shipped = (*(ROOT / "experiments").glob("*.toml"), *(ROOT / "experiments" / "published").glob("*.toml"))
    specs = args.specs or sorted(str(path.relative_to(ROOT)) for path in shipped)
    py = args.python

    baseline: list[tuple[float, float]] = []
    plans: dict[str, list[tuple[float, float]]] = {s: [] for s in specs}
    codes: dict[str, set[int]] = {s: set() for s in specs}
    for _ in range(args.repeats):
        baseline.append(timed([py, "-c", "pass"])[:2])
        for spec in specs:
            wall, cpu, code = timed([py, "-m", "mcx", "plan", spec, "--json"])
            plans[spec].append((wall, cpu))
            codes[spec].add(code)

    base = summary(baseline)
    per_spec = {}
    for spec in specs:
        modules, code = imported_modules(py, spec)
        s = summary(plans[spec])
        per_spec[spec] = {**s, "ratio_to_baseline": s["median_s"] / base["median_s"],
                          "over_baseline_s": s["median_s"] - base["median_s"],
                          "cpu_ratio_to_baseline": s["cpu_median_s"] / base["cpu_median_s"],
                          "exit_codes": sorted(codes[spec] | {code}),
                          "forbidden_imported": [m for m in FORBIDDEN if m in modules],
                          "third_party_imported": modules, "slowest_imports": slowest_imports(py, spec)}
    medians = [v["median_s"] for v in per_spec.values()]
    result = {
        "repeats": args.repeats, "python": py, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "baseline_python_c_pass": base, "plan": per_spec,
        "plan_median_of_medians_s": statistics.median(medians), "plan_worst_median_s": max(medians),
        "all_exit_zero": all(v["exit_codes"] == [0] for v in per_spec.values()),
        "no_forbidden_imports": not any(v["forbidden_imported"] for v in per_spec.values()),
    }
    line = json.dumps(result, sort_keys=True)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
