"""mcx's evaluation against lm-evaluation-harness run by hand, on the same Hugging Face export: the time of
`mcx eval hf:DIR --fresh` (a worker subprocess calling ``lm_eval.simple_evaluate`` with the harness's HF model)
and of the `lm_eval` CLI with the same model arguments, task, limit and batch size, alternated ``--repeats``
times; the median ratio, and whether every score and standard error is identical.

    .venv/bin/python benchmarks/eval_speed.py .mcx/runs/RUN_ID/eval-hf --limit 100 --repeats 3
    .venv/bin/python benchmarks/eval_speed.py RUN_ID --limit 100 --repeats 3

DIR is any Hugging Face model directory (`mcx export-hf RUN -o DIR`, or the ``eval-hf`` that `mcx eval RUN`
leaves in the run directory). Given a RUN_ID instead, the run is first exported (`mcx export-hf`, timed: what
the first evaluation of a run through the HF model pays once), and a third column times `mcx eval RUN --fresh`
through the harness's model interface over the run's own Megatron-Core model (``[eval] model = "megatron"``,
D72), which needs no export; all three must give the same scores. The task defaults to the quickstart's,
evals/quickstart_next_line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def by_mcx(model: Path, task_dir: Path, limit: int, batch: int, project: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mcx", "--project", str(project), "eval", f"hf:{model}", "--tasks",
                          str(task_dir), "--limit", str(limit), "--batch-size", str(batch), "--fresh", "--json"],
                         capture_output=True, text=True, check=True, env={**os.environ, **OFFLINE})
    wall = time.perf_counter() - start
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, {(s["task"], s["metric"]): (s["value"], s["stderr"]) for s in doc["scores"]}


# `mcx eval RUN --fresh` with the run's [eval] table replaced: the library call the CLI makes (its --tasks, --limit
# and --batch-size flags set the same fields), with the interface chosen here
MEGATRON = """
import json, sys
from pathlib import Path
from mcx.ops.evaluate import EvalOverrides, evaluate_run
from mcx.spec.schema import EvalSpec
run, project, tasks, limit, batch = sys.argv[1:]
out = evaluate_run(run, Path(project).resolve(), overrides=EvalOverrides(fresh=True),
                   spec_eval=EvalSpec(tasks=(tasks,), limit=int(limit), batch_size=int(batch), model="megatron"))
print(json.dumps(out.to_dict()))
"""


def by_megatron(run: str, task_dir: Path, limit: int, batch: int, project: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", MEGATRON, run, str(project), str(task_dir), str(limit), str(batch)],
                         capture_output=True, text=True, check=True, env={**os.environ, **OFFLINE}, cwd=project)
    wall = time.perf_counter() - start
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["settings"]["interface"] == "megatron", doc["settings"]
    return wall, {(s["task"], s["metric"]): (s["value"], s["stderr"]) for s in doc["scores"]}


def export(run: str, project: Path, dest: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mcx", "--project", str(project), "export-hf", run, "-o", str(dest)],
                   capture_output=True, text=True, check=True, env={**os.environ, **OFFLINE})
    return time.perf_counter() - start


def by_hand(model: Path, task_dir: Path, task: str, limit: int, batch: int) -> tuple[float, dict]:
    lm_eval = Path(sys.executable).with_name("lm_eval")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([str(lm_eval), "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
                        "--device", "cpu", "--include_path", str(task_dir), "--tasks", task, "--limit", str(limit),
                        "--batch_size", str(batch), "--output_path", tmp], capture_output=True, text=True,
                       check=True, env={**os.environ, **OFFLINE}, cwd=tmp)
        wall = time.perf_counter() - start
        results = json.loads(next(Path(tmp).rglob("results_*.json")).read_text())["results"][task]
    scores = {}
    for key, value in results.items():
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr") or not isinstance(value, (int, float)) or metric == "sample_len":
            continue
        scores[(task, metric if filt == "none" else f"{metric}.{filt}")] = (value, results.get(f"{metric}_stderr,{filt}"))
    return wall, scores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory, or a run ID (exported here, and also evaluated "
                    "through the Megatron-Core interface)")
    ap.add_argument("--tasks", default=str(ROOT / "evals" / "quickstart_next_line"))
    ap.add_argument("--task", default="mcx_quickstart_next_line", help="the task name in that directory")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--project", default=str(ROOT))
    args = ap.parse_args()
    project, tasks = Path(args.project).resolve(), Path(args.tasks).resolve()
    with tempfile.TemporaryDirectory() as scratch:
        run = args.model if re.fullmatch(r"[0-9a-f]{12}", args.model) else None
        export_s = None
        if run is not None:
            model = Path(scratch) / "hf"
            export_s = export(run, project, model)
            print(f"mcx export-hf {run}: {export_s:.1f} s", file=sys.stderr)
        else:
            model = Path(args.model).resolve()
        return measure(args, model, tasks, project, run, export_s)


def measure(args: argparse.Namespace, model: Path, tasks: Path, project: Path, run: str | None,
            export_s: float | None) -> int:
    mine, theirs, mega, same = [], [], [], True
    for i in range(args.repeats):  # alternated, so a load that drifts falls on all
        t_mcx, s_mcx = by_mcx(model, tasks, args.limit, args.batch_size, project)
        t_cli, s_cli = by_hand(model, tasks, args.task, args.limit, args.batch_size)
        line = f"repeat {i + 1}: mcx eval (HF) {t_mcx:.1f} s, lm_eval CLI {t_cli:.1f} s"
        same = same and s_mcx == s_cli
        if run is not None:
            t_meg, s_meg = by_megatron(run, tasks, args.limit, args.batch_size, project)
            same = same and s_meg == s_cli
            mega.append(t_meg)
            line += f", mcx eval (Megatron-Core) {t_meg:.1f} s"
        mine.append(t_mcx)
        theirs.append(t_cli)
        print(f"{line}, scores identical: {same}", file=sys.stderr)
    ratio = statistics.median(mine) / statistics.median(theirs)
    report = {"mcx_s": mine, "lm_eval_s": theirs, "median_ratio": round(ratio, 3), "identical_scores": same,
              "limit": args.limit, "batch_size": args.batch_size,
              "scores": {f"{t}/{m}": v for (t, m), v in sorted(s_mcx.items())}}
    if run is not None:
        report.update({"run": run, "export_s": export_s, "megatron_s": mega,
                       "megatron_ratio": round(statistics.median(mega) / statistics.median(theirs), 3)})
    print(json.dumps(report, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
