"""How fast `mcx compare` is on a big comparison: 100 runs x 10,000 steps.

Writes 100 run directories (spec.toml, fingerprint.json, job.json, result.json and a realistic
metrics.jsonl per stage, as docs/stage-directory.md describes) into a temporary directory, then times

    read      reading every file's bytes (the floor: what any loader must do)
    load      load_run_dir for every run (parse metrics into curves)
    compare   compare(runs, baseline)
    table / markdown / json / html   each renderer (table: printed to an in-memory console)

and prints one JSON object. The target is load + compare + all renders under 5 s.

    .venv/bin/python benchmarks/compare_speed.py [--runs 100] [--steps 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

SPEC = """name = "{name}"

[model]
num_layers = 24
hidden_size = 2048
num_attention_heads = 16
num_query_groups = 4
seq_length = 4096

[train]
micro_batch_size = 1
global_batch_size = 512
train_iters = {steps}
lr = {lr}
min_lr = 3e-05
lr_warmup_iters = 200
seed = {seed}
eval_interval = 100
eval_iters = 10

[data]
path = "data/web"

[hardware]
nodes = 1
gpus_per_node = 8
gpu = "H100"
"""


def _metrics_lines(steps: int, seed: int, lr: float, eval_interval: int = 100) -> str:
    rng = random.Random(seed)
    t = 1.75e9 + seed
    out = []
    scale = lr / 3e-4
    for s in range(1, steps + 1):
        loss = 2.6 + 8.2 * math.exp(-s * scale / 400) + rng.gauss(0, 0.04) - 0.02 * math.log1p(s) * scale
        step_time = (40.0 if s == 1 else rng.gauss(6.3, 0.05))
        t += step_time
        tok = 512 * 4096 / 8 / step_time
        tflops = tok * 6 * 1.6e9 / 1e12
        rec = {"kind": "train", "step": s, "loss": loss, "grad_norm": abs(rng.gauss(0.9, 0.15)),
               "lr": lr * min(1.0, s / 200), "tokens_per_s_per_gpu": tok, "tflops_per_gpu": tflops,
               "mfu": tflops / 989.0, "mem_peak_bytes": 61_000_000_000 + s % 7, "step_time_s": step_time, "time": t}
        out.append(json.dumps(rec))
        if s % eval_interval == 0 or s == steps:
            out.append(json.dumps({"kind": "valid", "step": s, "loss": loss + 0.03, "ppl": math.exp(loss + 0.03)}))
    out.append(json.dumps({"kind": "test", "step": steps, "loss": loss + 0.035, "ppl": math.exp(loss + 0.035)}))
    return "\n".join(out) + "\n"


def _stage(root: Path, stage: str, run_id: str, steps: int, seed: int, lr: float) -> None:
    d = root / stage
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"run_id": run_id, "stage": stage, "layout": {
        "tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 8, "world_size": 8, "sequence_parallel": False}}))
    (d / "metrics.jsonl").write_text(_metrics_lines(steps, seed, lr))
    (d / "result.json").write_text(json.dumps({"status": "finished", "passed": True, "checks": {}, "final": {},
                                               "error": None, "steps": steps, "layer_spec": "transformer_engine"}))


def make_runs(root: Path, runs: int, steps: int) -> list[Path]:
    dirs = []
    for i in range(runs):
        run_id = f"{i:04d}" + "ab12cd34"
        lr = (1.5e-4, 3e-4, 6e-4)[i % 3]
        seed = 1234 + i // 3
        d = root / run_id
        d.mkdir(parents=True)
        (d / "spec.toml").write_text(SPEC.format(name=f"llama-1b-sweep-{i}", steps=steps, lr=lr, seed=seed))
        comp = lambda ident: {"id": ident, "info": {}, "warnings": []}  # noqa: E731
        (d / "fingerprint.json").write_text(json.dumps({"run_id": run_id, "components": {
            "code": comp({"commit": f"{i % 4:040x}", "dirty": False, "diff_sha256": None}),
            "environment": comp({"lockfile_sha256": "e" * 64, "python": "3.12.1", "torch": "2.11.0"}),
            "config": comp({"train": {"lr": lr, "seed": seed}}),
            "data": comp({"dataset": "d" * 32}),
            "hardware": comp({"gpu": "H100", "count": 8})}}))
        (d / "plan.json").write_text("{}")
        _stage(d, "smoke", run_id, 30, seed, lr)
        _stage(d, "full", run_id, steps, seed, lr)
        dirs.append(d)
    return dirs


CPU: dict[str, float] = {}


def _timed(fn, name: str = ""):
    """(result, wall seconds); CPU seconds go to CPU[name] (the machine may be shared)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    CPU[name] = time.process_time() - c0
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, default=None, help="write the runs and the HTML here and keep them")
    ap.add_argument("--stdlib-json", action="store_true", help="parse with the standard library even if orjson is there")
    args = ap.parse_args(argv)

    from rich.console import Console

    from mcx.metrics import curves as metricsfile
    from mcx.report.compare_view import compare
    from mcx.report.htmlpage import to_html
    from mcx.report.jsondoc import to_json
    from mcx.report.markdown import to_markdown
    from mcx.report.rundata import load_run_dir
    from mcx.report.table import to_table

    if args.stdlib_json:
        metricsfile._fast_loads = json.loads

    root = args.keep or Path(tempfile.mkdtemp(prefix="mcx-compare-bench-"))
    try:
        _, gen_s = _timed(lambda: make_runs(root, args.runs, args.steps), "generate")
        del CPU["generate"]
        dirs = sorted(p for p in root.iterdir() if p.is_dir())
        files = [f for d in dirs for f in sorted(d.rglob("*")) if f.is_file()]
        nbytes, read_s = _timed(lambda: sum(len(f.read_bytes()) for f in files), "read")
        lines = sum(f.read_bytes().count(b"\n") for f in files if f.name == "metrics.jsonl")
        runs, load_s = _timed(lambda: [load_run_dir(d) for d in dirs], "load")
        cmp, compare_s = _timed(lambda: compare(runs[1:], runs[0]), "compare")

        def table() -> str:
            console = Console(file=io.StringIO(), width=220, color_system="truecolor", force_terminal=True)
            console.print(to_table(cmp))
            return console.file.getvalue()

        table_text, table_s = _timed(table, "table")
        md, markdown_s = _timed(lambda: to_markdown(cmp), "markdown")
        js, json_s = _timed(lambda: json.dumps(to_json(cmp), allow_nan=False), "json")
        html, html_s = _timed(lambda: to_html(cmp), "html")
        if args.keep:
            (root / "compare.html").write_text(html, encoding="utf-8")
        total = load_s + compare_s + table_s + markdown_s + json_s + html_s
        result = {
            "runs": args.runs, "steps": args.steps, "metrics_lines": lines, "bytes_read": nbytes,
            "json_parser": metricsfile._fast_loads.__module__ or "json",
            "generate_s": round(gen_s, 3), "read_s": round(read_s, 3), "load_s": round(load_s, 3),
            "compare_s": round(compare_s, 3), "table_s": round(table_s, 3), "markdown_s": round(markdown_s, 3),
            "json_s": round(json_s, 3), "html_s": round(html_s, 3), "total_s": round(total, 3),
            "total_over_read": round(total / read_s, 1) if read_s else None,
            "html_bytes": len(html.encode()), "markdown_bytes": len(md.encode()), "json_bytes": len(js.encode()),
            "table_chars": len(table_text), "cpu_s": {k: round(v, 3) for k, v in CPU.items()},
            "total_cpu_s": round(sum(v for k, v in CPU.items() if k != "read"), 3), "target_s": 5.0, "within_target": total < 5.0,
        }
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["within_target"] else 1)
