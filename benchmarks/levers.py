"""The benchmark spec's levers on one GPU, one by one (issue 41): MFU over 20 steps, FP8 against bf16.

Each lever of :data:`LEVERS` is the one-H200 spec (``experiments/h200_1gpu.toml``, Transformer Engine) with one
lever (a setting, or two that go together) pulled beyond the lever it names as its base, trained in mcx's worker through ``throughput.py``: the same
global batch (16 sequences of 4096), 20 timed steps after 4 (the graphed levers capture after 3 eager ones).

    python benchmarks/levers.py --out OUT_DIR [--only NAME[,NAME...]] [--steps 20] [--warmup 4]

writes ``OUT_DIR/levers.json`` (each lever's throughput result, its MFU as the time-weighted mean over the timed
steps, and its ratio to its base) and prints a table, then FP8 against bf16: each precision at its best lever,
and the pairs that differ only in precision. A lever that fails (an out-of-memory at micro-batch 8 on an 80 GB
card) is recorded with the tail of its log and the others still run. Micro-batch 4 of this spec is 85 GiB: an H200.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import throughput  # noqa: E402  (benchmarks/ is not a package)
from mcx.fingerprint.hardware import probe  # noqa: E402
from mcx.plan.planner import make_plan  # noqa: E402
from mcx.spec import load_spec  # noqa: E402
from mcx.spec.schema import ExperimentSpec  # noqa: E402

SPEC = "experiments/h200_1gpu.toml"
FUSER = ["--set", "train.te_op_fuser=true"]
MBS8 = ["--mbs", "8", "--set", "train.expandable_segments=true"]

# name: (base lever or None, precision, throughput.py arguments beyond the spec, runner, what)
LEVERS: dict[str, tuple[str | None, str, list[str], str, str]] = {
    "bf16": (None, "bf16", ["--mbs", "4"], "mcx", "bf16, micro-batch 4, mcx's defaults"),
    "bf16-fuser": ("bf16", "bf16", ["--mbs", "4", *FUSER], "mcx", "the MLP as one fused op sequence (D29)"),
    "bf16-fuser-mbs8": ("bf16-fuser", "bf16", [*MBS8, *FUSER], "mcx",
                        "micro-batch 8 with expandable segments (D27), two micro-batches a step"),
    "bf16-fuser-graphs": ("bf16-fuser", "bf16", ["--mbs", "4", *FUSER], "graphs",
                          "the step's forward and backward as one CUDA graph (train.cuda_graphs, D75)"),
    "bf16-deterministic": ("bf16", "bf16", ["--mbs", "4", "--deterministic"], "mcx",
                           "deterministic mode (D12, D80): its cost"),
    "fp8": (None, "fp8", ["--fp8", "hybrid", "--mbs", "4", *FUSER], "mcx",
            "FP8 hybrid, delayed scaling, the fused MLP, micro-batch 4"),
    "fp8-mbs8": ("fp8", "fp8", ["--fp8", "hybrid", *MBS8, *FUSER], "mcx", "micro-batch 8, expandable segments"),
    "fp8-graphs": ("fp8", "fp8", ["--fp8", "hybrid", "--mbs", "4", *FUSER], "graphs",
                   "the step as one CUDA graph"),
}
# FP8 against bf16: the pairs that differ only in precision
PAIRS = (("fp8", "bf16-fuser"), ("fp8-mbs8", "bf16-fuser-mbs8"), ("fp8-graphs", "bf16-fuser-graphs"))


def lever_spec(name: str) -> ExperimentSpec:
    """The spec a lever trains, as throughput.py builds it (its length overrides aside)."""
    _, _, extra, runner, _ = LEVERS[name]
    a = throughput.parser().parse_args(["--spec", SPEC, "--impl", "te", *extra])
    overrides = throughput.spec_overrides(impl="te", fp8=a.fp8, mbs=a.mbs, deterministic=a.deterministic, extra=a.set)
    return throughput.runner_spec(runner, load_spec(ROOT / SPEC, overrides))


def too_big(name: str, card: dict[str, Any] | None) -> str | None:
    """Why a lever is not run on this GPU: the plan's peak over the card's memory (on an 80 GB card each lever
    at micro-batch 4 ran out of memory after a minute of device time). None where it fits or no card is seen."""
    if card is None or card.get("memory_mib") is None:
        return None
    spec = lever_spec(name)
    need = make_plan(spec, te_available=True, vocab_size=throughput.vocab_size(spec, ROOT)).memory.total
    have = card["memory_mib"] * 2**20
    if need <= have:
        return None
    return (f"not run: the plan's peak is {need / 2**30:.1f} GiB and this {card['name']} has {have / 2**30:.1f} GiB "
            "(micro-batch 4 of this spec wants an H200)")


def measure(name: str, out: Path, *, steps: int, warmup: int, card: dict[str, Any] | None = None) -> dict[str, Any]:
    base, precision, extra, runner, what = LEVERS[name]
    unfit = too_big(name, card)
    if unfit is not None:
        return {"name": name, "base": base, "precision": precision, "what": what, "failed": unfit}
    target = out / f"{name}.json"
    argv = ["--spec", SPEC, "--impl", "te", "--runners", runner, "--steps", str(steps), "--warmup", str(warmup),
            "--work-dir", str(out / "work" / name), "--out", str(target), "--timeout", "600", *extra]
    failed = throughput.run_quietly(argv)
    if failed is not None:
        return {"name": name, "base": base, "precision": precision, "what": what, "failed": failed}
    run = json.loads(target.read_text(encoding="utf-8"))["runs"][runner]
    return {"name": name, "base": base, "precision": precision, "what": what, "argv": argv,
            "tokens_per_s_per_gpu": run["tokens_per_s_per_gpu"], "mfu": run["mfu"], "mfu_median": run["mfu_median"],
            "step_s_median": run["step_time_s_median"], "steps_timed": run["steps_timed"],
            "mem_peak_bytes": run["mem_peak_bytes"], "plan_error": run.get("plan_error")}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each lever's ratio to its base; FP8 against bf16 at each one's best lever and pair by pair."""
    ok = {r["name"]: r for r in rows if "failed" not in r}
    for r in rows:
        base = ok.get(r.get("base") or "")
        if base and r["name"] in ok:
            r["vs_base"] = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
    best = {p: max((r for r in ok.values() if r["precision"] == p and not r["name"].endswith("deterministic")),
                   key=lambda r: r["tokens_per_s_per_gpu"], default=None) for p in ("bf16", "fp8")}
    out: dict[str, Any] = {"best": {p: r and r["name"] for p, r in best.items()}}
    if best["bf16"] and best["fp8"]:
        out["fp8_over_bf16_best"] = best["fp8"]["tokens_per_s_per_gpu"] / best["bf16"]["tokens_per_s_per_gpu"]
    out["fp8_over_bf16_pairs"] = {f"{a}/{b}": ok[a]["tokens_per_s_per_gpu"] / ok[b]["tokens_per_s_per_gpu"]
                                  for a, b in PAIRS if a in ok and b in ok}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated names of " + ", ".join(LEVERS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    args = p.parse_args(argv)
    names = throughput.chosen(args.only, LEVERS, "levers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    seen = probe()
    card = next((g for g in seen["gpus"] if g["index"] in seen["visible"]), None)
    for name in names:
        rows.append(measure(name, out, steps=args.steps, warmup=args.warmup, card=card))
        result = {"levers": rows, **summarize(rows)}
        (out / "levers.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for r in rows:
        if "failed" in r:
            print(f"{r['name']:<20} failed: {throughput.failure_line(r['failed'])}")
            continue
        vs = f"  x{r['vs_base']:.3f} of {r['base']}" if "vs_base" in r else ""
        print(f"{r['name']:<20} {r['tokens_per_s_per_gpu']:>9,.0f} tokens/s  MFU {r['mfu']:.2%} (mean of "
              f"{r['steps_timed']})  {r['mem_peak_bytes'] / 2**30:.1f} GiB{vs}")
    if "fp8_over_bf16_best" in result:
        print(f"FP8 / bf16, each at its best ({result['best']['fp8']}, {result['best']['bf16']}): "
              f"{result['fp8_over_bf16_best']:.3f}")
    for pair, ratio in result["fp8_over_bf16_pairs"].items():
        print(f"FP8 / bf16, {pair}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
