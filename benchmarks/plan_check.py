"""The plan against what runs, on configurations outside the step-time model's calibration (issue 41).

Each configuration of :data:`CHECKS` (a spec and its overrides: recomputation, mixtures of experts, the
micro-batch the OOM came from) trains a few steps in mcx's worker through ``throughput.py --runners mcx``;
the result puts the plan's step time and peak memory for the GPU that ran (``throughput.plan_beside``)
beside the measured median step and ``torch.cuda.max_memory_allocated``. None of these points is in
``benchmarks/steptime_fit.py``'s fit or the memory model's calibration: their errors are held-out errors.

    python benchmarks/plan_check.py --out OUT_DIR [--only NAME[,NAME...]] [--steps 4] [--warmup 2] [--profile N]

writes ``OUT_DIR/plan_check.json`` (every configuration's throughput result and its errors) and prints a
table; a configuration that fails (an out-of-memory the plan said fits is the finding to look for) is
recorded with the tail of its log and the others still run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  (benchmarks/ is not a package)

# A mixture of experts at a size where dense layers would be the GPU's (kernels about 0.3 s a step on an H100), yet
# the host sets the step: each MoE layer costs it several dense layers' time (steptime_fit.py --moe, D81).
_MOE = ['train.precision="bf16"', "train.deterministic=false", "model.seq_length=4096",
        "model.max_position_embeddings=4096", "model.num_layers=8", "model.hidden_size=2048",
        "model.num_attention_heads=16", "model.num_query_groups=4", "model.ffn_hidden_size=8192",
        "model.num_experts=8", "model.moe_ffn_hidden_size=4096", "model.vocab_size=32000",
        "train.micro_batch_size=2", "train.global_batch_size=8"]

# name: (spec, overrides, what)
CHECKS: dict[str, tuple[str, list[str], str]] = {
    "full-recompute-mbs4": ("experiments/h200_1gpu.toml",
                            ["train.micro_batch_size=4", 'train.recompute_granularity="full"',
                             'train.recompute_method="uniform"', "train.recompute_num_layers=1"],
                            "the one-H200 spec at micro-batch 4 with full recomputation: planned 70.8 GiB on an H100, "
                            "ran out of memory there (2026-12-06)"),
    "full-recompute-mbs4-expandable": ("experiments/h200_1gpu.toml",
                                       ["train.micro_batch_size=4", 'train.recompute_granularity="full"',
                                        'train.recompute_method="uniform"', "train.recompute_num_layers=1",
                                        "train.expandable_segments=true"],
                                       "the same with expandable segments, the setting the plan's memory verdict "
                                       "asks for above 85% of the GPU (D76)"),
    "selective-recompute-mbs2": ("experiments/h200_1gpu.toml",
                                 ["train.micro_batch_size=2", 'train.recompute_granularity="selective"'],
                                 "the one-H200 spec at micro-batch 2, selective recomputation"),
    "moe-8x-top2": ("experiments/tiny_moe.toml", _MOE,
                    "8 layers, hidden 2048, 8 experts of 4096 top-2, vocabulary 32000, seq 4096, 4 micro-batches "
                    "of 2, one GPU"),
    "moe-8x-top2-grouped": ("experiments/tiny_moe.toml", [*_MOE, "model.moe_grouped_gemm=true"],
                            "the same with the experts as one grouped GEMM"),
    # Held out of the MoE host term the two above fit (D81): other expert counts, each dispatch.
    "moe-4x-top2": ("experiments/tiny_moe.toml", [*_MOE, "model.num_experts=4"],
                    "the 8-expert model with 4 experts, one GEMM pair each"),
    "moe-16x-top2-grouped": ("experiments/tiny_moe.toml",
                             [*_MOE, "model.num_experts=16", "model.moe_ffn_hidden_size=2048",
                              "model.moe_grouped_gemm=true"],
                             "16 experts of 2048 (the same expert parameters), as one grouped GEMM"),
}

_GPU_TIME = re.compile(r"Self CUDA time total: ([\d.]+)(us|ms|s)\b")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def gpu_seconds(table: str, steps: int) -> float | None:
    """The kernels' own time a step from a profiled op table (torch.profiler's "Self CUDA time total")."""
    found = _GPU_TIME.search(table)
    return float(found.group(1)) * _UNIT[found.group(2)] / steps if found and steps else None


def check(name: str, out: Path, *, steps: int, warmup: int, profile: int = 0) -> dict[str, Any]:
    spec, overrides, what = CHECKS[name]
    target = out / f"{name}.json"
    argv = ["--spec", spec, "--impl", "te", "--runners", "mcx", "--steps", str(steps), "--warmup", str(warmup),
            "--work-dir", str(out / "work" / name), "--out", str(target), "--timeout", "600",
            "--profile", str(profile), *[a for o in overrides for a in ("--set", o)]]
    failed = throughput.run_quietly(argv)
    if failed is not None:
        return {"name": name, "what": what, "failed": failed}
    result = json.loads(target.read_text(encoding="utf-8"))
    run = result["runs"]["mcx"]
    measured = {"step_s": run["step_time_s_median"], "mem_bytes": run["mem_peak_bytes"]}
    table = (run.get("profile") or {}).get("table") or ""
    if table:  # whether the host or the GPU sets the step: the kernels' own time beside it, and the top ops
        measured["gpu_s"] = gpu_seconds(table, profile)
        measured["ops"] = "\n".join(table.splitlines()[:30])
    return {"name": name, "what": what, "plan": result["plan"], "error": run["plan_error"], "measured": measured}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated names of " + ", ".join(CHECKS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="N more steps under torch.profiler: the kernels' time a step beside the step (host or GPU bound)")
    args = p.parse_args(argv)
    names = throughput.chosen(args.only, CHECKS, "plan_check")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        results.append(check(name, out, steps=args.steps, warmup=args.warmup, profile=args.profile))
        (out / "plan_check.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for r in results:
        if "failed" in r:
            print(f"{r['name']:<26} failed: {throughput.failure_line(r['failed'])}")
            continue
        m, pl, e = r["measured"], r["plan"] or {}, r["error"] or {}
        print(f"{r['name']:<26} step {m['step_s']:.3f} s (plan {pl.get('step_s') or float('nan'):.3f}, "
              f"{e.get('step', float('nan')):+.1%})  memory {m['mem_bytes'] / 2**30:.1f} GiB "
              f"(plan {pl.get('mem_bytes', 0) / 2**30:.1f}, {e.get('mem', float('nan')):+.1%})"
              + (f"  kernels {m['gpu_s']:.3f} s a step" if m.get("gpu_s") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
