"""Calibrate the step-time model (mcx.plan.steptime) on measured steps and check it (docs/steptime.md, D44).

MEASURED lists mcx's H200 runs in benchmarks/calibration/ (its README says where each came from): each result
file names its spec, overrides and layout, and holds the worker's step times; their median is the measured step. PUBLISHED lists NVIDIA's
rows (experiments/published/: each spec's header cites its source), with the settings NVIDIA ran that mcx
does not (TP communication overlap, FP8 parameter all-gather): the model is checked on the run NVIDIA made,
and also priced as mcx would run the spec. Every error is the step's, predicted / measured - 1 (above zero:
the model is slower than the hardware), as `mcx show` reports it after a run.

``--fit`` fits FITTED by least squares on the log errors of all twenty steps, each constant held near its
PRIOR (the H200 steps alone are 10 runs of one model's shapes: they cannot tell a slower GEMM from more
element-wise traffic), and fits again without each published row in turn: that row's ``held_out_error`` is
the model's error on a configuration its calibration never saw.

    .venv/bin/python benchmarks/steptime_fit.py                  # the table at mcx's shipped calibration
    .venv/bin/python benchmarks/steptime_fit.py --fit --out F    # the fit, the held-out errors; paste
                                                                 # "calibration" into CALIBRATIONS

``--host FILE...`` fits the host floor instead (``host_layer_s``, ``host_step_s``; the other constants as
shipped) on throughput.py results of the small shapes (``--preset``): each file's ``mcx`` runner (eager) and
``graphs`` runner (``train.cuda_graphs``) are points, priced on the GPU that ran them; each file is then held
out in turn (its error from a fit on the others).

``--moe FILE...`` fits a MoE layer's host time (``host_moe_sequential``, ``host_moe_grouped``: multiples of
``host_layer_s``, as shipped or ``--host-layer-s``) on plan_check.py results: on the configurations named by
``--fit-on`` (default: the two 8-expert ones of the first file); every other point is held out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcx.plan.planner import make_plan  # noqa: E402
from mcx.plan.steptime import CALIBRATIONS, Calibration, Features, predict  # noqa: E402
from mcx.spec import load_spec  # noqa: E402

CALIBRATION = ROOT / "benchmarks" / "calibration"
# One H200 (8 layers of LLaMA-3 8B, seq 4096, GBS 16) and two (the whole 8B, DP 2): the throughput runs.
MEASURED = (
    "h200_1gpu_te_bf16_mbs4.json",
    "h200_1gpu_te_bf16_fuser_mbs4.json",
    "h200_1gpu_te_fp8_mbs4.json",
    "h200_1gpu_te_fp8_fuser_mbs4.json",
    "h200_1gpu_local_bf16_mbs4.json",
    "h200_1gpu_te_bf16_mbs2.json",
    "h200_1gpu_local_bf16_mbs2.json",
    "h200_2gpu_te_bf16_seq4096.json",
    "h200_2gpu_te_bf16_seq8192.json",
    "h200_2gpu_te_fp8_fuser_seq8192.json",
)
OVERLAP = Features(tp_comm_overlap=True, fp8_param_gather=True)
PUBLISHED = (  # spec, tokens/s/GPU, model TFLOP/s/GPU, what NVIDIA ran beyond the spec
    ("llama3_8b_h100_fp8.toml", 14451, 744, Features(fp8_param_gather=True)),
    ("llama3_70b_h100_fp8.toml", 1664, 731, OVERLAP),
    ("llama31_405b_h100_fp8.toml", 326, 822, OVERLAP),
    ("llama2_7b_h100_fp8.toml", 16934, 780, Features()),
    ("llama2_13b_h100_fp8.toml", 8715, 760, Features()),
    ("llama2_70b_h100_fp8.toml", 1728, 768, Features(tp_comm_overlap=True)),
    ("llama3_8b_h100_fp8_cp2.toml", 12273, 711, Features()),
    ("llama3_70b_h100_fp8_cp2.toml", 1524, 734, Features(tp_comm_overlap=True)),
    ("llama3_8b_b200_fp8.toml", 30624, 1576, Features(fp8_param_gather=True)),
    ("mixtral_8x7b_b200_fp8.toml", 15457, 1282, Features(grouped_gemm=True)),
)
# The priors: typical fractions of a Hopper GPU's datasheet its kernels reach in training, before any fit.
PRIOR = Calibration(gemm_bf16=0.72, gemm_fp8=0.62, attention_te=0.6, attention_local=0.4, attention_backward=2.5,
                    attention_len=512.0, elementwise=1.0, moe_layer_s=5e-4, launch_s=6e-6, layer_s=2e-4, comm=0.75,
                    dp_tail=0.1, step_s=0.01)
FITTED = ("gemm_bf16", "gemm_fp8", "attention_te", "attention_local", "attention_len", "elementwise", "layer_s")
# how far (log) a constant may stray from its prior for the price of one 1/e-off step
PRIOR_SPREAD = {"gemm_bf16": 1.0, "gemm_fp8": 1.0, "attention_te": 1.0, "attention_local": 1.0, "attention_len": 1.0,
                "elementwise": 1.0, "layer_s": 1.0}
BOUNDS = {"gemm_bf16": (0.5, 0.95), "gemm_fp8": (0.4, 0.9), "attention_te": (0.3, 0.9), "attention_local": (0.2, 0.9),
          "elementwise": (0.5, 10.0), "layer_s": (1e-6, 2e-3),
          "attention_len": (1.0, 4096.0)}


def measured_points() -> list[dict[str, Any]]:
    out = []
    for rel in MEASURED:
        d = json.loads((CALIBRATION / rel).read_text())
        run = d["runs"]["mcx"]
        spec = load_spec(ROOT / d["spec"], d["overrides"])
        steps = run.get("step_times_s") or [run["step_time_s_median"]]
        out.append({"label": rel, "spec": spec, "measured_s": statistics.median(steps),
                    "features": Features(impl=d["impl"], grouped_gemm=spec.model.moe_grouped_gemm)})
    return out


def published_points() -> list[dict[str, Any]]:
    out = []
    for name, tokens, tflops, nvidia in PUBLISHED:
        spec = load_spec(ROOT / "experiments" / "published" / name)
        step = spec.train.global_batch_size * spec.model.seq_length / tokens / (spec.hardware.nodes * spec.hardware.gpus_per_node)
        out.append({"label": name, "spec": spec, "measured_s": step, "tokens": tokens, "tflops": tflops, "features": nvidia})
    return out


def predicted(point: dict[str, Any], cal: Calibration | None, features: Features | None = None):
    spec = point["spec"]
    plan = make_plan(spec, te_available=True, vocab_size=spec.model.vocab_size or 128256)
    return predict(spec, plan.layout, padded_vocab=plan.params.padded_vocab, features=features or point["features"],
                   calibration=cal)


def fit(points: list[dict[str, Any]]) -> Calibration:
    """Least squares on log(predicted / measured), each constant pulled towards its PRIOR by
    log(value / prior) / PRIOR_SPREAD."""
    from scipy.optimize import least_squares

    base = PRIOR
    x0 = [getattr(base, k) for k in FITTED]
    lo, hi = zip(*(BOUNDS[k] for k in FITTED))

    def residuals(x):
        cal = attrs.evolve(base, **dict(zip(FITTED, x)))
        errors = [math.log(predicted(p, cal).step_s / p["measured_s"]) for p in points]
        return errors + [math.log(v / p) / PRIOR_SPREAD[k] for k, v, p in zip(FITTED, x, x0)]

    found = least_squares(residuals, x0, bounds=(lo, hi), x_scale=[abs(v) or 1e-4 for v in x0])
    return attrs.evolve(base, **{k: float(f"{v:.3g}") for k, v in zip(FITTED, found.x)})


def table(cal: Calibration | None, loo: dict[str, Calibration] | None = None) -> dict[str, Any]:
    rows = {"measured": [], "published": []}
    for p in measured_points():
        st = predicted(p, cal)
        rows["measured"].append({"run": p["label"], "measured_s": round(p["measured_s"], 4),
                                 "predicted_s": round(st.step_s, 4), "error": round(st.step_s / p["measured_s"] - 1, 4)})
    for p in published_points():
        nvidia = predicted(p, cal)
        as_mcx = predicted(p, cal, Features(grouped_gemm=p["features"].grouped_gemm))
        row = {"spec": p["label"], "published_tokens_per_s_per_gpu": p["tokens"], "published_tflops": p["tflops"],
               "predicted_tokens_per_s_per_gpu": round(nvidia.tokens_per_s_per_gpu),
               "error": round(nvidia.step_s / p["measured_s"] - 1, 4)}
        if loo:
            held_out = predicted(p, loo[p["label"]])
            row["held_out_error"] = round(held_out.step_s / p["measured_s"] - 1, 4)
        row |= {"as_mcx_runs_it_tokens_per_s_per_gpu": round(as_mcx.tokens_per_s_per_gpu),
                "breakdown_s": {k: round(v, 4) for k, v in nvidia.breakdown().items()}}
        rows["published"].append(row)
    return rows


HOST_FITTED = ("host_layer_s", "host_step_s")
MOE_FITTED = ("host_moe_sequential", "host_moe_grouped")
MOE_FIT_ON = ("moe-8x-top2", "moe-8x-top2-grouped")


def host_points(files: list[str]) -> list[dict[str, Any]]:
    """One point per runner (mcx, graphs) of each throughput.py result: its spec on the GPU that ran it."""
    from mcx.plan.gpus import gpu_from_name

    out = []
    for path in files:
        d = json.loads(Path(path).read_text())
        gpu = gpu_from_name(d["gpu_name"] or "")
        if gpu is None:
            raise SystemExit(f"steptime_fit: {path}: the GPU {d['gpu_name']!r} is not in mcx's table")
        spec = load_spec(ROOT / d["spec"], [*d["overrides"], f'hardware.gpu="{gpu}"'])
        if spec.model.vocab_size is None:  # the tokenizer's, as the worker padded it
            spec = load_spec(ROOT / d["spec"], [*d["overrides"], f'hardware.gpu="{gpu}"',
                                                f"model.vocab_size={d['padded_vocab_size']}"])
        for runner, graphed in (("mcx", False), ("graphs", True)):
            run = d["runs"].get(runner)
            if run:
                label = f"{Path(path).parent.name}/{Path(path).name}:{runner}"  # two hosts' results share names
                out.append({"label": label, "file": path, "spec": spec,
                            "measured_s": run["step_time_s_median"],
                            "features": Features(impl=d["impl"], cuda_graphs=graphed)})
    return out


def fit_host(points: list[dict[str, Any]]) -> Calibration:
    """host_layer_s and host_step_s by least squares on log(predicted / measured), the rest as shipped."""
    from scipy.optimize import least_squares

    base = CALIBRATIONS["Hopper"]
    x0 = [1e-3, 0.01]

    def residuals(x):
        cal = attrs.evolve(base, **dict(zip(HOST_FITTED, x)))
        return [math.log(predicted(p, cal).step_s / p["measured_s"]) for p in points]

    found = least_squares(residuals, x0, bounds=([0.0, 0.0], [0.05, 1.0]), x_scale=[1e-3, 1e-2])
    return attrs.evolve(base, **{k: float(f"{v:.3g}") for k, v in zip(HOST_FITTED, found.x)})


def host_table(points: list[dict[str, Any]]) -> dict[str, Any]:
    cal = fit_host(points)
    rows = []
    for p in points:
        held = fit_host([o for o in points if o["file"] != p["file"]]) if len({o["file"] for o in points}) > 1 else cal
        st, st_held, shipped = predicted(p, cal), predicted(p, held), predicted(p, None)
        rows.append({"run": p["label"], "measured_s": round(p["measured_s"], 4), "predicted_s": round(st.step_s, 4),
                     "error": round(st.step_s / p["measured_s"] - 1, 4),
                     "held_out_error": round(st_held.step_s / p["measured_s"] - 1, 4),
                     "shipped_error": round(shipped.step_s / p["measured_s"] - 1, 4),
                     "device_s": round(st.step_s - st.host_wait_s, 4), "host_s": round(st.host_s, 4)})
    return {"host_calibration": {k: getattr(cal, k) for k in HOST_FITTED}, "host": rows}


def moe_points(files: list[str]) -> list[dict[str, Any]]:
    """One point per measured MoE configuration of each plan_check.py result, on the GPU the plan priced."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_check import CHECKS

    out = []
    for path in files:
        for row in json.loads(Path(path).read_text()):
            if "measured" not in row or not row["name"].startswith("moe-"):
                continue
            spec_path, overrides, _ = CHECKS[row["name"]]
            spec = load_spec(ROOT / spec_path, [*overrides, f'hardware.gpu="{row["plan"]["gpu"]}"'])
            out.append({"label": f"{Path(path).parent.name}/{row['name']}", "name": row["name"], "file": path,
                        "spec": spec, "measured_s": row["measured"]["step_s"], "gpu_s": row["measured"].get("gpu_s"),
                        "features": Features(impl="transformer_engine", grouped_gemm=spec.model.moe_grouped_gemm)})
    return out


def fit_moe(points: list[dict[str, Any]], host_layer_s: float | None) -> Calibration:
    """host_moe_sequential and host_moe_grouped by least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares

    base = CALIBRATIONS["Hopper"]
    if host_layer_s is not None:
        base = attrs.evolve(base, host_layer_s=host_layer_s)
    kinds = [k for k, grouped in zip(MOE_FITTED, (False, True))
             if any(p["features"].grouped_gemm == grouped for p in points)]

    def ratio(p):  # what the point says, were the host to set its step (the step is flat in it below the GPU's)
        st = predicted(p, base)
        return max(1.0, (p["measured_s"] - base.host_step_s) / (st.host_layers * base.host_layer_s))

    x0 = [math.exp(statistics.mean(math.log(ratio(p)) for p in points if p["features"].grouped_gemm == (k == MOE_FITTED[1])))
          for k in kinds]

    def residuals(x):
        cal = attrs.evolve(base, **dict(zip(kinds, x)))
        return [math.log(predicted(p, cal).step_s / p["measured_s"]) for p in points]

    found = least_squares(residuals, x0, bounds=([0.0] * len(kinds), [50.0] * len(kinds)))
    return attrs.evolve(base, **{k: float(f"{v:.3g}") for k, v in zip(kinds, found.x)})


def moe_table(points: list[dict[str, Any]], fit_on: list[str], host_layer_s: float | None) -> dict[str, Any]:
    first = points[0]["file"] if points else None
    chosen = [p for p in points if p["label"] in fit_on or (p["file"] == first and p["name"] in fit_on)]
    if not chosen:
        raise SystemExit(f"steptime_fit: none of {fit_on} is among {[p['label'] for p in points]}")
    cal = fit_moe(chosen, host_layer_s)
    rows = []
    for p in points:
        st, shipped = predicted(p, cal), predicted(p, None)
        rows.append({"run": p["label"], "held_out": p not in chosen, "measured_s": round(p["measured_s"], 4),
                     "predicted_s": round(st.step_s, 4), "error": round(st.step_s / p["measured_s"] - 1, 4),
                     "shipped_error": round(shipped.step_s / p["measured_s"] - 1, 4),
                     "device_s": round(st.step_s - st.host_wait_s, 4), "host_s": round(st.host_s, 4),
                     "kernels_s": p["gpu_s"] and round(p["gpu_s"], 4)})
    return {"moe_calibration": {k: getattr(cal, k) for k in ("host_layer_s", *MOE_FITTED)},
            "fit_on": [p["label"] for p in chosen], "moe": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", action="store_true", help="fit the constants on the measured and published steps first")
    p.add_argument("--host", nargs="+", metavar="FILE", help="fit the host floor on these throughput.py results")
    p.add_argument("--moe", nargs="+", metavar="FILE", help="fit the MoE layers' host time on plan_check.py results")
    p.add_argument("--fit-on", default=",".join(MOE_FIT_ON),
                   help="with --moe: the configurations (name, or folder/name) the fit uses; the rest are held out")
    p.add_argument("--host-layer-s", type=float, help="with --moe: the host's time a dense layer (default: shipped)")
    p.add_argument("--out")
    args = p.parse_args()
    if args.moe:
        table_ = moe_table(moe_points(args.moe), args.fit_on.split(","), args.host_layer_s)
        text = json.dumps(table_, indent=1)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return
    if args.host:
        text = json.dumps(host_table(host_points(args.host)), indent=1)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return
    cal = loo = None
    if args.fit:
        points = measured_points() + published_points()
        cal = fit(points)
        loo = {q["label"]: fit([o for o in points if o is not q]) for q in points if "tokens" in q}
    out = {"calibration": attrs.asdict(cal or CALIBRATIONS["Hopper"]), **table(cal, loo)}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
