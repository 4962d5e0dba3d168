"""GPU validation: the runs docs/benchmarks.md reports for issues 3, 6, 8 and 11, as one script.

Each task builds job.json files exactly as the control plane does (``mcx.plan.layout_rules.resolve_layout``
on the spec with the task's ``--set`` overrides), starts mcx's worker on them (``python -m mcx.train``,
under torchrun for two GPUs), and writes one JSON file of results into ``--out``:

    layouts      a small LLaMA-style model (and a small Mixtral-style one for expert parallelism)
                 trained as a smoke stage (loss falls, checkpoint round trip, bitwise resume) on one
                 GPU and in each two-GPU layout: DP 2, TP 2 + sequence parallel, PP 2 (1F1B),
                 PP 2 x VPP 2 (interleaved), CP 2 at 16K tokens, EP 2; each two-GPU curve is compared
                 with its one-GPU reference (mean loss of the last ``WINDOW`` steps, relative
                 difference against ``TOLERANCE``); ``det-*`` runs are repeated in deterministic
                 mode and compared bit for bit
    fp8-curve    the one-H200 spec (experiments/h200_1gpu.toml) for ``--steps`` steps in bf16 and in
                 FP8 (hybrid, delayed scaling) on the Transformer Engine spec: both loss curves, their
                 smoothed relative difference, and the FP8 speed-up (median step time)
    faults       deterministic runs killed with SIGKILL after a checkpoint, and stopped with SIGTERM,
                 then resumed: each final curve is compared bit for bit with an uninterrupted run
    ckpt-stall   the training stall of a checkpoint save, asynchronous against synchronous: the spec
                 (default the one-H200 spec) saving every ``--every`` steps; a save's stall is the
                 interval between the metrics lines around it minus the median interval of the
                 steps without a save. Saves must lie further apart than one synchronous save
                 takes, or an asynchronous save waits for the one before it (2026-11-30: 5 steps of
                 0.37 s against a 2 s write)
    mcx-run      ``mcx run SPEC ARGS`` itself (the product path: plan, fingerprint, smoke, full),
                 collecting its --json summary, both stages' curves and the system metrics, and a
                 tarball of the run directory without checkpoints (for ``mcx sync`` elsewhere)

    python3 benchmarks/gpu_validation.py layouts --gpus 0,1 --only ref,dp2 --out $OUT
    python3 benchmarks/gpu_validation.py fp8-curve --gpus 1 --steps 300 --out $OUT
    python3 benchmarks/gpu_validation.py faults --gpus 0 --out $OUT
    python3 benchmarks/gpu_validation.py ckpt-stall --gpus 0 --spec dense --steps 101 --every 20 --out $OUT
    python3 benchmarks/gpu_validation.py mcx-run --gpus 0,1 --out $OUT -- experiments/h200_2gpu.toml --yes

``--cpu`` runs the same code on CPU with a tiny model and one process (the script's own check).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from mcx.contract.files import METRICS_FILE
from mcx.launch.env import worker_env
from mcx.ops.plan import te_available
from mcx.plan.layout_rules import resolve_layout
from mcx.spec import load_spec, spec_to_dict
from mcx.train.metrics import read_records
from throughput import vocab_size  # benchmarks/throughput.py: the vocabulary mcx's worker uses

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 10  # steps averaged at the end of a curve for the layout comparison
TOLERANCE = 0.02  # relative difference of those means allowed between a layout and its reference

# The small models of the layout runs (spec keys as data).
DENSE = ['hardware.gpu="H200"', "train.deterministic=false", "parallel.tensor=1", "parallel.pipeline=1",
         "parallel.context=1", "model.num_layers=8", "model.hidden_size=1024", "model.num_attention_heads=16", "model.num_query_groups=4",
         "model.ffn_hidden_size=2816", "model.seq_length=2048", "model.max_position_embeddings=16384",
         "model.rotary_base=500000", "train.micro_batch_size=2", "train.global_batch_size=16",
         "train.train_iters=40", "train.lr=3e-4", "train.min_lr=3e-5", "train.lr_warmup_iters=5",
         "train.eval_interval=20", "train.eval_iters=2", 'train.precision="bf16"', "checkpoint.interval=20",
         "checkpoint.async_save=true", 'data.path="data/quickstart"', 'data.split="969,30,1"']
MOE = ["parallel.expert=1", "model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1408",
       'model.moe_token_dispatcher_type="alltoall"']
LONG = ["model.seq_length=16384", "train.micro_batch_size=1", "train.global_batch_size=4"]
TINY_CPU = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=2",
            "model.ffn_hidden_size=128", "model.seq_length=64", "model.max_position_embeddings=64",
            "train.train_iters=12", "train.eval_interval=6", "checkpoint.interval=6", 'train.precision="fp32"',
            "checkpoint.async_save=false", "train.micro_batch_size=2", "train.global_batch_size=4",
            "model.moe_ffn_hidden_size=128"]

# name: (overrides, GPUs, reference run or None). "det-" runs are run twice and compared bitwise.
LAYOUTS: dict[str, tuple[list[str], int, str | None]] = {
    "ref": ([], 1, None),
    "ref-long": (LONG, 1, None),
    "ref-moe": (MOE, 1, None),
    "ref-local": (['model.transformer_impl="local"'], 1, "ref"),
    "det-1gpu": (["train.deterministic=true"], 1, None),
    "dp2": (["hardware.gpus_per_node=2"], 2, "ref"),
    "det-dp2": (["hardware.gpus_per_node=2", "train.deterministic=true"], 2, None),
    "tp2-sp": (["hardware.gpus_per_node=2", "parallel.tensor=2", "parallel.sequence_parallel=true"], 2, "ref"),
    "pp2": (["hardware.gpus_per_node=2", "parallel.pipeline=2"], 2, "ref"),
    "pp2-vpp2": (["hardware.gpus_per_node=2", "parallel.pipeline=2", "parallel.virtual_pipeline=2"], 2, "ref"),
    "cp2-16k": ([*LONG, "hardware.gpus_per_node=2", "parallel.context=2"], 2, "ref-long"),
    "ep2": ([*MOE, "hardware.gpus_per_node=2", "parallel.expert=2"], 2, "ref-moe"),
    # MoE in deterministic mode, once each: does the smoke stage's bitwise resume hold there?
    "ref-moe-det": ([*MOE, "train.deterministic=true"], 1, None),
    "ep2-det": ([*MOE, "hardware.gpus_per_node=2", "parallel.expert=2", "train.deterministic=true"], 2, "ref-moe-det"),
    # FP8 (delayed scaling): its checkpoints carry TE's pickled amax histories (D25); round trip and resume.
    "fp8": (['train.precision="fp8-hybrid"', "train.deterministic=true"], 1, None),
    "fp8-dp2": (['train.precision="fp8-hybrid"', "train.deterministic=true", "hardware.gpus_per_node=2"], 2, "fp8"),
    # train.te_op_fuser (D29): the fused MLP's ops carry their own FP8 state, which mcx checkpoints; on DP 2
    # the overlapped parameter gather's hooks must reach them.
    "fp8-fuser": (['train.precision="fp8-hybrid"', "train.deterministic=true", "train.te_op_fuser=true"], 1, "fp8"),
    "fp8-fuser-dp2": (['train.precision="fp8-hybrid"', "train.deterministic=true", "train.te_op_fuser=true",
                       "hardware.gpus_per_node=2"], 2, "fp8-fuser"),
}


def say(text: str) -> None:
    print(f"gpu_validation: {text}", file=sys.stderr, flush=True)


def build_job(stage_dir: Path, spec_path: str, overrides: list[str], *, stage: str, cpu: bool) -> dict[str, Any]:
    """job.json for ``spec_path`` + ``overrides``, laid out as the control plane lays it out (the
    worker's environment, from the spec, under the private key ``_env``)."""
    if cpu:
        overrides = [*overrides, 'hardware.gpu="cpu"', "hardware.gpus_per_node=1", "train.deterministic=true"]
    spec = load_spec(spec_path, overrides)
    vocab = vocab_size(spec, ROOT)
    layout, _, _ = resolve_layout(spec, te_available=False if cpu else te_available(spec), vocab_size=vocab)
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    job = {"run_id": stage_dir.name, "stage": stage, "spec": spec_to_dict(spec), "layout": layout.job_dict(),
           "data_dir": str((ROOT / spec.data.path).resolve()), "checkpoint_dir": str(stage_dir / "checkpoints"),
           "train_samples_limit": None,
           "checks": {"resume_check_iters": 3, "loss_window": 5, "min_loss_drop": 0.01},
           "device": "cpu" if cpu else "cuda", "output": "quiet"}
    (stage_dir / "job.json").write_text(json.dumps(job, indent=1))
    return {**job, "_env": worker_env(spec)}


def start_worker(stage_dir: Path, job: dict[str, Any], gpus: list[str]) -> subprocess.Popen:
    env = {**os.environ, **job["_env"]}
    world = job["layout"]["world_size"]
    if job["device"] == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:world])
    if world == 1:
        argv = [sys.executable, "-m", "mcx.train", str(stage_dir)]
    else:
        env.setdefault("OMP_NUM_THREADS", "8")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                "-m", "mcx.train", str(stage_dir)]
    log = open(stage_dir / "launch.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def records(stage_dir: Path, kind: str = "train") -> list[dict[str, Any]]:
    return [r for r in read_records(stage_dir / METRICS_FILE) if r.get("kind") == kind]


def summary(stage_dir: Path, rc: int | None, wall: float) -> dict[str, Any]:
    result = json.loads((stage_dir / "result.json").read_text()) if (stage_dir / "result.json").is_file() else {}
    lines = read_records(stage_dir / METRICS_FILE)
    train = [r for r in lines if r.get("kind") == "train"]
    log = (stage_dir / "worker.log").read_text(errors="replace") if (stage_dir / "worker.log").is_file() else ""
    launch = (stage_dir / "launch.log").read_text(errors="replace") if (stage_dir / "launch.log").is_file() else ""
    failed = rc not in (0, None) or result.get("status") != "finished"
    return {"rc": rc, "wall_s": round(wall, 1), "status": result.get("status"), "error": result.get("error"),
            "checks": {k: {"passed": v.get("passed"), "detail": v.get("detail")} for k, v in result.get("checks", {}).items()},
            "final": result.get("final"), "details": result.get("details"), "layer_spec": result.get("layer_spec"),
            "losses": [r["loss"] for r in train], "grad_norms": [r["grad_norm"] for r in train],
            "step_times": [r["step_time_s"] for r in train],
            "valid": [(r["step"], r["loss"]) for r in lines if r.get("kind") == "valid"],
            "log_tail": (log[-2500:] + "\n--- launch ---\n" + launch[-2500:]) if failed else ""}


def run_job(stage_dir: Path, job: dict[str, Any], gpus: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.time()
    proc = start_worker(stage_dir, job, gpus)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    return summary(stage_dir, rc, time.time() - t0)


def tail_mean(losses: list[float], n: int = WINDOW) -> float | None:
    vals = [x for x in losses[-n:] if x is not None]
    return statistics.fmean(vals) if vals else None


def save(out: Path, name: str, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(data, indent=1, default=str))


# -- tasks -------------------------------------------------------------------------------------------

def task_layouts(args: argparse.Namespace) -> None:
    work, gpus = Path(args.work_dir) / "layouts", args.gpus
    names = [n for n in LAYOUTS if not args.only or n in args.only]
    if args.cpu:
        names = [n for n in names if LAYOUTS[n][1] == 1 and n != "ref-long"]
    results: dict[str, Any] = {}
    out_name = f"layouts{('-' + args.tag) if args.tag else ''}.json"
    base = TINY_CPU if args.cpu else []
    for name in names:
        overrides, world, ref = LAYOUTS[name]
        reps = ("a", "b") if name.startswith("det-") else ("",)
        for rep in reps:
            key = f"{name}{'-' + rep if rep else ''}"
            say(f"layout {key} on {world} GPU(s)")
            try:
                job = build_job(work / key, "experiments/tiny.toml", [*DENSE, *overrides, *base, *args.set],
                                stage="smoke", cpu=args.cpu)
            except Exception as exc:  # noqa: BLE001 - a spec the rules refuse is a result too
                results[key] = {"status": "refused", "error": f"{exc.__class__.__name__}: {exc}"}
                continue
            results[key] = {**run_job(work / key, job, gpus, args.timeout), "layout": job["layout"]}
            say(f"  {key}: {results[key]['status']} final loss {tail_mean(results[key]['losses'], 1)} "
                f"checks {[(k, v['passed']) for k, v in results[key]['checks'].items()]}")
            save(Path(args.out), out_name, results)
        if name.startswith("det-"):
            a, b = results.get(f"{name}-a", {}), results.get(f"{name}-b", {})
            results[f"{name}-bitwise"] = bool(a.get("losses")) and a.get("losses") == b.get("losses") and \
                a.get("grad_norms") == b.get("grad_norms") and a.get("valid") == b.get("valid")
        elif ref and results[name].get("losses") and (reference := _reference(results, ref, Path(args.out))):
            mine, theirs = tail_mean(results[name]["losses"]), tail_mean(reference)
            rel = abs(mine - theirs) / abs(theirs)
            results[name]["vs_reference"] = {"reference": ref, "window": WINDOW, "mean": mine, "reference_mean": theirs,
                                             "relative_difference": rel, "tolerance": TOLERANCE,
                                             "within": rel <= TOLERANCE}
        save(Path(args.out), out_name, results)


def _reference(results: dict[str, Any], ref: str, out: Path) -> list[float] | None:
    """The reference run's losses: from this invocation, else from an earlier one's layouts*.json."""
    if results.get(ref, {}).get("losses"):
        return results[ref]["losses"]
    for f in sorted(out.glob("layouts*.json")):
        found = json.loads(f.read_text()).get(ref) or {}
        if found.get("losses"):
            return found["losses"]
    return None


def task_fp8_curve(args: argparse.Namespace) -> None:
    work, steps = Path(args.work_dir) / "fp8curve", args.steps
    common = [f"train.train_iters={steps}", "train.global_batch_size=2", "train.micro_batch_size=2",
              f"train.lr_warmup_iters={max(1, steps // 10)}", f"train.eval_interval={max(1, steps // 3)}",
              "checkpoint.final=false", 'model.transformer_impl="transformer_engine"']
    if args.cpu:
        common = [*TINY_CPU, f"train.train_iters={steps}", "train.lr_warmup_iters=2", 'model.transformer_impl="local"', "checkpoint.final=false",
                  "model.vocab_size=4096"]
    common += args.set  # e.g. the fusions off, as on 2026-11-30 (d003192), to find what moved FP8 out of its band
    variants = {"bf16": ['train.precision="bf16"'], "fp8-hybrid": ['train.precision="fp8-hybrid"']}
    if args.cpu:
        variants = {"fp32": []}
    results: dict[str, Any] = {"steps": steps, "spec": args.spec, "overrides": args.set}
    for name, extra in variants.items():
        say(f"fp8-curve {name}")
        job = build_job(work / name, args.spec, [*common, *extra], stage="full", cpu=args.cpu)
        results[name] = run_job(work / name, job, args.gpus, args.timeout)
        r = results[name]
        say(f"  {name}: {r['status']} loss {r['losses'][:1]} -> {tail_mean(r['losses'])}, "
            f"median step {statistics.median(r['step_times']) if r['step_times'] else None}")
        save(Path(args.out), "fp8_curve.json", results)
    if all(results.get(k, {}).get("losses") for k in ("bf16", "fp8-hybrid")):
        a, b = results["bf16"]["losses"], results["fp8-hybrid"]["losses"]
        smooth = 20
        ma = [statistics.fmean(a[max(0, i - smooth + 1): i + 1]) for i in range(len(a))]
        mb = [statistics.fmean(b[max(0, i - smooth + 1): i + 1]) for i in range(len(b))]
        rel = [abs(x - y) / abs(x) for x, y in zip(ma, mb, strict=False)]
        warm = len(a) // 10
        results["comparison"] = {
            "smoothing_steps": smooth, "max_relative_difference_after_warmup": max(rel[warm:]),
            "final_relative_difference": rel[-1],
            # what tests/gpu holds FP8 to: the signed gap of the mean loss over the second half, at each seed
            "late_mean_gap": statistics.fmean(b[len(b) // 2:]) / statistics.fmean(a[len(a) // 2:]) - 1,
            "speedup_median_step": statistics.median(results["bf16"]["step_times"][5:]) /
            statistics.median(results["fp8-hybrid"]["step_times"][5:]),
            "valid": {"bf16": results["bf16"]["valid"], "fp8-hybrid": results["fp8-hybrid"]["valid"]}}
        say(f"comparison: {results['comparison']}")
    save(Path(args.out), "fp8_curve.json", results)


def _wait_for_step(stage_dir: Path, proc: subprocess.Popen, step: int, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        if any(r["step"] >= step for r in records(stage_dir)):
            return True
        time.sleep(0.2)
    return False


def task_faults(args: argparse.Namespace) -> None:
    """SIGKILL after the step-20 checkpoint, and SIGTERM mid-run, each then resumed, against one
    uninterrupted deterministic run (same job)."""
    work = Path(args.work_dir) / "faults"
    base = [*DENSE, "train.deterministic=true", "checkpoint.interval=10", "checkpoint.async_save=true",
            *(TINY_CPU if args.cpu else [])]
    results: dict[str, Any] = {}
    ref_dir = work / "uninterrupted"
    job = build_job(ref_dir, "experiments/tiny.toml", base, stage="full", cpu=args.cpu)
    results["uninterrupted"] = run_job(ref_dir, job, args.gpus, args.timeout)
    reference = results["uninterrupted"]["losses"]
    total = len(reference)
    cases = (("sigkill", signal.SIGKILL, max(2, total * 5 // 8)), ("sigterm", signal.SIGTERM, max(2, total // 3)))
    for name, sig, at in (c for c in cases if not args.only or c[0] in args.only):
        d = work / name
        job = build_job(d, "experiments/tiny.toml", base, stage="full", cpu=args.cpu)
        t0 = time.time()
        proc = start_worker(d, job, args.gpus)
        reached = _wait_for_step(d, proc, at, args.timeout)
        os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        t_signal = time.time()
        rc1 = proc.wait(timeout=args.timeout)
        first = {"reached_step": reached and at, "rc": rc1, "exit_after_signal_s": round(time.time() - t_signal, 2),
                 "status": (json.loads((d / "result.json").read_text()).get("status")
                            if (d / "result.json").is_file() else None),
                 "latest": (d / "checkpoints" / "latest").read_text().strip()
                 if (d / "checkpoints" / "latest").is_file() else None,
                 "steps_written": len(records(d))}
        (d / "result.json").unlink(missing_ok=True)
        resumed = run_job(d, job, args.gpus, args.timeout)
        results[name] = {"first": first, "resumed": {k: resumed[k] for k in ("rc", "status", "error", "log_tail")},
                         "bitwise_equal_to_uninterrupted": resumed["losses"] == reference and
                         resumed["grad_norms"] == results["uninterrupted"]["grad_norms"],
                         "wall_s": round(time.time() - t0, 1)}
        say(f"{name}: {results[name]['first']} bitwise={results[name]['bitwise_equal_to_uninterrupted']}")
        save(Path(args.out), "faults.json", results)
    save(Path(args.out), "faults.json", results)


def _save_stalls(stage_dir: Path, every: int) -> dict[str, Any]:
    """Per save: the time the loop lost to it. Everything a save costs the loop (an async save's
    finalisation lands at a later step) is the sum of the intervals beyond the median of the
    intervals that hold no save step, divided by the number of saves."""
    times = {r["step"]: r["time"] for r in records(stage_dir)}
    gaps = {s: times[s + 1] - times[s] for s in times if s + 1 in times}
    plain = [g for s, g in gaps.items() if s % every]
    base = statistics.median(plain) if plain else None
    saves = [s for s in gaps if s % every == 0]
    if base is None or not saves:
        return {"median_step_interval_s": base, "saves": len(saves), "stall_per_save_s": None}
    excess = [gaps[s] - base for s in sorted(saves)]
    others = sorted(((gaps[s] - base, s) for s in gaps if s % every), reverse=True)
    return {"median_step_interval_s": base, "saves": len(saves), "save_step_excess_s": excess,
            "other_steps_excess_s": sum(e for e, _ in others if e > 0),  # what the stall per save adds to them
            "largest_other_excess": [[s, round(e, 3)] for e, s in others[:8]],
            "median_save_excess_s": statistics.median(excess),
            "stall_per_save_s": (sum(gaps.values()) - base * len(gaps)) / len(saves)}


def task_ckpt_stall(args: argparse.Namespace) -> None:
    work, every, steps = Path(args.work_dir) / "ckptstall", args.every, args.steps
    common = [f"train.train_iters={steps}", f"train.lr_warmup_iters={max(1, steps // 5)}",
              f"train.eval_interval={steps}", f"checkpoint.interval={every}", "checkpoint.keep=1",
              "checkpoint.final=false"]
    spec, model = args.spec, []
    if spec == "dense":  # the layout runs' small LLaMA-style model: seconds per save, not minutes
        spec, model = "experiments/tiny.toml", DENSE
    if args.cpu:
        model = [*model, *TINY_CPU, "model.vocab_size=4096", 'model.transformer_impl="local"']
    common = [*model, *common, *args.set]
    results: dict[str, Any] = {"spec": args.spec, "every": every, "steps": steps, "overrides": args.set}
    for name, flag in (("sync", "false"), ("async", "true")):
        if name not in args.modes.split(","):
            continue
        say(f"ckpt-stall {name}")
        job = build_job(work / name, spec, [*common, f"checkpoint.async_save={flag}"], stage="full", cpu=args.cpu)
        run = run_job(work / name, job, args.gpus, args.timeout)
        log_file = work / name / "worker.log"
        phases = [line.partition("mcx.train: ")[2] for line in log_file.read_text(errors="replace").splitlines()
                  if "paused training" in line or "in the writer" in line] if log_file.exists() else []  # gpu.py, writer.py
        results[name] = {**{k: run[k] for k in ("rc", "status", "error", "log_tail")}, **_save_stalls(work / name, every),
                         "save_phases": phases}
        shutil.rmtree(work / name / "checkpoints", ignore_errors=True)  # tens of GB for the H200 spec
        say(f"  {name}: {results[name]['stall_per_save_s']} s lost per save over {results[name]['saves']} saves")
        save(Path(args.out), "ckpt_stall.json", results)
    a, b = results["async"].get("stall_per_save_s"), results["sync"].get("stall_per_save_s")
    if a is not None and b:
        results["async_over_sync"] = a / b
        results["async_over_sync_median"] = results["async"]["median_save_excess_s"] / results["sync"]["median_save_excess_s"]
        say(f"async stall / sync stall = {a / b:.3f}, of the median save {results['async_over_sync_median']:.3f} "
            "(target < 0.10)")
    save(Path(args.out), "ckpt_stall.json", results)


def task_mcx_run(args: argparse.Namespace) -> None:
    """`mcx run ARGS --json` as a user runs it; the run directory's records come back with it."""
    env = {**os.environ}
    if not args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(args.gpus)
    t0 = time.time()
    argv = [sys.executable, "-m", "mcx", "run", *args.rest, "--json"]
    say(" ".join(argv))
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = None, exc.stdout or "", exc.stderr or ""
        stdout, stderr = (x.decode() if isinstance(x, bytes) else x for x in (stdout, stderr))
    summary_line = next((json.loads(l) for l in reversed(stdout.splitlines()) if l.startswith("{")), None)
    result: dict[str, Any] = {"argv": argv, "rc": rc, "wall_s": round(time.time() - t0, 1), "summary": summary_line,
                              "stderr_tail": stderr[-4000:]}
    run_id = (summary_line or {}).get("run_id")
    if run_id:
        rdir = ROOT / ".mcx" / "runs" / run_id
        for stage in ("smoke", "full"):
            sdir = rdir / stage
            if sdir.is_dir():
                sys_lines = []
                for f in sorted(sdir.glob("system*.jsonl")):
                    sys_lines += [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
                lines = read_records(sdir / METRICS_FILE)
                train = [r for r in lines if r.get("kind") == "train"]
                result[stage] = {"losses": [r["loss"] for r in train],
                                 "grad_norms": [r["grad_norm"] for r in train],
                                 "mfu": [r.get("mfu") for r in train],
                                 "valid": [(r["step"], r["loss"]) for r in lines if r.get("kind") == "valid"],
                                 "test": [(r["step"], r["loss"]) for r in lines if r.get("kind") == "test"],
                                 "system_samples": len(sys_lines), "system_last": sys_lines[-1] if sys_lines else None,
                                 "worker_log_tail": (sdir / "worker.log").read_text(errors="replace")[-2000:]
                                 if (sdir / "worker.log").is_file() else ""}
        tag = args.tag or run_id
        with tarfile.open(Path(args.out) / f"run-{tag}.tar.gz", "w:gz") as tar:
            tar.add(rdir, arcname=run_id, filter=lambda ti: None if "/checkpoints" in ti.name or ti.name.endswith(
                "/checkpoints") or "/cache" in ti.name else ti)
    save(Path(args.out), f"mcx_run{('-' + args.tag) if args.tag else ''}.json", result)
    say(f"mcx run: rc {rc}, {result['wall_s']} s, status {(summary_line or {}).get('status')}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("task", choices=["layouts", "fp8-curve", "faults", "ckpt-stall", "mcx-run"])
    p.add_argument("--gpus", default="0,1", help="CUDA device indices this task may use, in order")
    p.add_argument("--only", default="", help="layouts, faults: comma-separated names (default: all)")
    p.add_argument("--spec", default="experiments/h200_1gpu.toml", help='ckpt-stall: "dense" for the layout runs\' small model')
    p.add_argument("--steps", type=int, default=300, help="fp8-curve: steps per run; ckpt-stall: steps per run")
    p.add_argument("--every", type=int, default=5, help="ckpt-stall: save every this many steps")
    p.add_argument("--modes", default="sync,async", help="ckpt-stall: which runs, of sync,async")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--work-dir", default="/tmp/mcx-gpu-validation")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="")
    p.add_argument("--cpu", action="store_true", help="a tiny model on CPU: checks this script, not the GPU")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="layouts, ckpt-stall, fp8-curve: another spec override for every run (e.g. checkpoint.async_save=true)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.rest = argv[cut + 1:]  # mcx-run: the arguments of `mcx run`
    args.gpus = args.gpus.split(",")
    args.only = [x for x in args.only.split(",") if x]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    {"layouts": task_layouts, "fp8-curve": task_fp8_curve, "faults": task_faults, "ckpt-stall": task_ckpt_stall,
     "mcx-run": task_mcx_run}[args.task](args)


if __name__ == "__main__":
    main()
