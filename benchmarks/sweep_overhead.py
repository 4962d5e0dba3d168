"""A sweep's per-trial overhead: `mcx sweep` of N trials against N plain `mcx run`s of the same trial specs.

A fresh project (git, the quickstart specs and dataset, like the tests' ``make_e2e_project``) holds one sweep
spec: the quickstart model shrunk (2 layers, hidden 64, 10 steps, no smoke stage) over N seeds, one trial at
a time. Two copies of the project, so neither side finds the other's runs in its run cache:

- ``runs``: `python -m mcx run SPEC --set train.seed=S` for each seed, one after another (N CLI processes,
  each planning, training, recording in MLflow and DVC);
- ``sweep``: `python -m mcx sweep SPEC` (one process: Optuna's study, every trial planned up front, the
  trials run through the same run machinery, the sweep's MLflow record).

The two sides alternate (runs, sweep, runs, sweep, ... ``--repeats`` times, fresh copies each time); the
result is the ratio of median wall times, sweep / runs (target <= 1.05).

    .venv/bin/python benchmarks/sweep_overhead.py --trials 3 --repeats 2 --out /tmp/sweep_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tomli_w

REPO = Path(__file__).resolve().parents[1]
FILES = ("experiments/tiny.toml", ".dvc/config", ".dvc/.gitignore", ".dvcignore", "data.dvc", ".gitignore",
         "lockfiles/cpu.txt")
DROP = ("MLFLOW_TRACKING_URI", "MCX_PROJECT", "MCX_LOCKFILE")


def make_project(root: Path, seeds: list[int]) -> Path:
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)
    shutil.copytree(REPO / "data" / "quickstart", root / "data" / "quickstart")
    spec = {"extends": "tiny.toml", "name": "overhead",
            "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 192},
            "train": {"train_iters": 10, "eval_interval": 5, "eval_iters": 1, "lr_warmup_iters": 1},
            "smoke": {"enabled": False},
            "sweep": {"method": "grid", "parameters": {"train.seed": seeds}}}
    (root / "experiments" / "overhead.toml").write_text(tomli_w.dumps(spec))
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "project"]):
        subprocess.run(["git", *args], cwd=root, check=True, env={**os.environ, **env})
    return root


def timed(argvs: list[list[str]], project: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in DROP and not k.startswith("MCX_TEST")}
    t0 = time.perf_counter()
    for argv in argvs:
        proc = subprocess.run([sys.executable, "-m", "mcx", "--project", str(project), *argv], cwd=project, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default="/tmp/sweep_overhead")
    p.add_argument("--out")
    args = p.parse_args()
    if not (REPO / "data" / "quickstart" / "manifest.json").is_file():
        raise SystemExit("prepare the quickstart dataset first: ./dev mcx data prepare")
    seeds = list(range(1, args.trials + 1))
    times: dict[str, list[float]] = {"runs": [], "sweep": []}
    for i in range(args.repeats):
        for side in ("runs", "sweep"):
            root = Path(args.dir) / f"{side}-{i}"
            shutil.rmtree(root, ignore_errors=True)
            project = make_project(root, seeds)
            spec = "experiments/overhead.toml"
            argvs = ([["run", spec, "--set", f"train.seed={s}"] for s in seeds] if side == "runs"
                     else [["sweep", spec]])
            times[side].append(timed(argvs, project))
    med = {side: statistics.median(t) for side, t in times.items()}
    out = {"trials": args.trials, "repeats": args.repeats, "seconds": times, "median_s": med,
           "per_trial_s": {side: m / args.trials for side, m in med.items()},
           "ratio_sweep_over_runs": med["sweep"] / med["runs"], "cpu": os.cpu_count(), "load_average": os.getloadavg()}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
