"""mcx's runner against a bare Megatron-Core loop: same spec, GPU, data shapes and micro-batch.

One process runs, one after the other (in ``--runners`` order):

    bare   benchmarks/bare_mcore.py: Megatron-Core 0.19.2 wired by hand (no mcx.train), synthetic tokens
    mcx    mcx's worker, ``python -m mcx.train STAGE_DIR``, started by mcx's own launcher for the spec
           (local, or torchrun for several GPUs) on a job.json built here as the control plane builds
           it (spec with the same overrides, ``mcx.plan.layout_rules.resolve_layout``: the full stage trains the
           spec as written), reading the spec's real dataset
    graphs mcx's worker as above with ``train.cuda_graphs = true`` (each step's forward and backward replayed as
           one CUDA graph after the eager warm-up steps, D75; one GPU): ``ratio_graphs_bare`` and
           ``ratio_graphs_mcx`` beside it

Both train ``--warmup`` untimed steps, then ``--steps`` timed optimizer steps of the spec's global
batch. A timed step lasts from the end of the previous step to its own end, so the whole loop
iteration counts, whatever a runner does between steps: the bare loop measures this itself
(``perf_counter`` after ``torch.cuda.synchronize``), mcx's comes from the ``time`` stamps of
consecutive lines in its metrics.jsonl (each written right after its step; the worker's own
``step_time_s``, which leaves out the work between steps, is scored too, as ``self_timed``).
mcx's worker is stopped (SIGKILL) as soon as the last timed line is written: the final checkpoint
of a multi-billion-parameter model (tens of GB) and the evaluation passes are not measured. Both
runs are scored by one function, :func:`score`: tokens per second per GPU = global-batch tokens x
steps / the summed step times / GPUs (the time-weighted mean; median-step figures beside it).

The bare loop keeps Megatron-Core's own choices where apex is absent (no gradient-accumulation
fusion, unfused cross entropy); mcx turns both fusions on by default (docs/decisions.md, D17), so its
overhead is measured like for like with ``--set train.gradient_accumulation_fusion=false --set
train.cross_entropy_fusion=false``, and the fusions' gain with mcx's defaults.

Printed (and written to ``--out``) as one JSON object: both runs, ``ratio`` = mcx tokens/s over
bare tokens/s (target >= 0.99), the ratio of the medians, both MFUs and peak memories.

``--preset`` names the small shapes of issue 41 (:data:`PRESETS`: the quickstart, the layout runs' model,
a 350M and a 1B LLaMA-style model), each a spec and its overrides, instead of ``--spec``. ``--profile N``:
after the timed steps, each runner trains N more steps under torch.profiler, untimed, and writes their
Chrome trace and the table of their ops by self CPU time into the work directory (the bare loop's
``profile/ops-bare.txt``; mcx's, written by its worker as `mcx run --profile` writes it,
``mcx/full/profile/ops-rank0.txt``; each table's text also in the result's ``runs.<runner>.profile.table``),
so where each millisecond of a step goes reads off side by side.
The bare loop needs CUDA; on a machine without a GPU, ``--runners mcx --set hardware.gpu='"cpu"'``
measures mcx's CPU backend alone (docs/benchmarks.md marks such figures CPU).

    PYTHONPATH=/tmp/site:$PWD python benchmarks/throughput.py --spec experiments/h200_1gpu.toml --impl local --mbs 2
    PYTHONPATH=/tmp/site:$PWD python benchmarks/throughput.py --spec experiments/h200_2gpu.toml --gpus 2 --impl te
    python benchmarks/throughput.py --preset 350m --impl te --profile 3 --out /tmp/throughput-350m.json

This module is also where the benchmark is defined for both runners (:func:`spec_overrides`,
:func:`load_benchmark_spec`, :func:`score`): pure Python on ``mcx.spec`` and ``mcx.plan``, no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attrs import evolve

from mcx.data.dataset import read_manifest
from mcx.errors import McxError
from mcx.hashing import digest, short_id
from mcx.launch import Placement, launcher_for, worker_env
from mcx.launch.env import omp_threads
from mcx.plan.flops import flops_per_iteration
from mcx.plan.fusions import GRAPH_WARMUP_STEPS
from mcx.plan.gpus import gpu_from_name, mfu_peak_flops
from mcx.plan.layout_rules import Layout, resolve_layout
from mcx.plan.memory import estimate_memory
from mcx.plan.params import padded_vocab_size
from mcx.plan.steptime import predict_worker
from mcx.spec import ExperimentSpec, load_spec, spec_to_dict
from mcx.train.metrics import read_records

HERE = Path(__file__).resolve().parent
TARGET_RATIO = 0.99
IMPLS = {"local": "local", "te": "transformer_engine"}
# bare: bare_mcore.py's loop; mcx: mcx's worker on the spec; graphs: mcx's worker with train.cuda_graphs = true (D75)
RUNNERS = ("bare", "mcx", "graphs")
FP8 = {"hybrid": "fp8-hybrid", "e4m3": "fp8-e4m3"}

# Issue 41's small shapes: (spec, overrides, what). The GPU ones train bf16 without deterministic mode;
# the quickstart as shipped (fp32, deterministic), as docs/steptime.md measured its 63 ms step.
_SMALL = ["train.deterministic=false", 'train.precision="bf16"', "model.seq_length=2048",
          "model.max_position_embeddings=2048", "model.rotary_base=500000"]
PRESETS: dict[str, tuple[str, list[str], str]] = {
    "quickstart": ("experiments/tiny.toml", [], "experiments/tiny.toml as shipped: 4 layers, hidden 128, seq 128, fp32"),
    "layout": ("experiments/tiny.toml",
               [*_SMALL, "model.num_layers=8", "model.hidden_size=1024", "model.num_attention_heads=16",
                "model.num_query_groups=4", "model.ffn_hidden_size=2816", "train.micro_batch_size=2",
                "train.global_batch_size=16"],
               "the layout runs' model (benchmarks/gpu_validation.py DENSE): 8 layers, hidden 1024, seq 2048, "
               "8 micro-batches of 2"),
    "350m": ("experiments/tiny.toml",
             [*_SMALL, "model.num_layers=24", "model.hidden_size=1024", "model.num_attention_heads=16",
              "model.num_query_groups=4", "model.ffn_hidden_size=3072", "model.vocab_size=32000",
              "train.micro_batch_size=4", "train.global_batch_size=32"],
             "LLaMA-style 355M: 24 layers, hidden 1024, GQA 16/4, SwiGLU 3072, vocabulary 32000, seq 2048, "
             "8 micro-batches of 4"),
    "1b": ("experiments/tiny.toml",
           [*_SMALL, "model.num_layers=16", "model.hidden_size=2048", "model.num_attention_heads=32",
            "model.num_query_groups=8", "model.ffn_hidden_size=8192", "model.vocab_size=32000",
            "train.micro_batch_size=4", "train.global_batch_size=32"],
           "LLaMA-3.2-1B's layers (16, hidden 2048, GQA 32/8, SwiGLU 8192), vocabulary 32000 untied (1.1B), "
           "seq 2048, 8 micro-batches of 4"),
}


# -- the benchmark, for both runners ----------------------------------------------------------------

def spec_overrides(*, impl: str, fp8: str | None = None, mbs: int | None = None, seq: int | None = None,
                   layers: int | None = None, gpus: int | None = None, deterministic: bool = False,
                   extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The ``--set`` overrides that turn a shipped spec into the benchmarked one. ``fp8``: None
    keeps the spec's ``train.precision``; "none" is resolved by :func:`load_benchmark_spec`."""
    out = [f'model.transformer_impl="{IMPLS[impl]}"']
    if fp8 in FP8:
        out.append(f'train.precision="{FP8[fp8]}"')
    if mbs is not None:
        out.append(f"train.micro_batch_size={mbs}")
    if seq is not None:
        out.append(f"model.seq_length={seq}")
    if layers is not None:
        out.append(f"model.num_layers={layers}")
    if gpus is not None:
        out += ["hardware.nodes=1", f"hardware.gpus_per_node={gpus}"]
    if deterministic:
        out.append("train.deterministic=true")
    return out + list(extra)


def vocab_size(spec: ExperimentSpec, project: Path) -> int:
    """What mcx's worker uses: ``model.vocab_size``, else the dataset tokenizer's vocabulary."""
    if spec.model.vocab_size is not None:
        return spec.model.vocab_size
    return int(read_manifest(project / spec.data.path)["tokenizer"]["vocab_size"])


def load_benchmark_spec(path: str, overrides: list[str], *, impl: str, fp8: str | None,
                        project: Path) -> tuple[ExperimentSpec, list[str], Layout, int]:
    """(spec, the overrides applied, the layout mcx plans for it, vocabulary size)."""
    spec = load_spec(path, overrides)
    if fp8 == "none" and spec.train.precision.startswith("fp8"):
        overrides = [*overrides, 'train.precision="bf16"']
        spec = load_spec(path, overrides)
    vocab = vocab_size(spec, project)
    layout, _, _ = resolve_layout(spec, te_available=impl == "te", vocab_size=vocab)
    return spec, overrides, layout, vocab


def score(spec: ExperimentSpec, world_size: int, padded_vocab: int, step_times: list[float],
          peak_flops: float | None) -> dict[str, Any]:
    """Tokens/s and TFLOP/s per GPU over timed optimizer steps of ``spec``'s global batch.

    Primary: total tokens / total time (the time-weighted mean: what a long run sustains);
    ``*_median``: the same from the median step time. MFU against ``peak_flops`` (None: unknown).
    """
    t, seq = spec.train, spec.model.seq_length
    tokens = t.global_batch_size * seq / world_size  # per step and GPU
    flops = flops_per_iteration(spec.model, padded_vocab=padded_vocab, global_batch_size=t.global_batch_size,
                                seq_length=seq) / world_size
    mean, median = sum(step_times) / len(step_times), statistics.median(step_times)

    def rates(step_time: float) -> dict[str, float | None]:
        tflops = flops / step_time / 1e12
        return {"tokens_per_s_per_gpu": tokens / step_time, "tflops_per_gpu": tflops,
                "mfu": tflops * 1e12 / peak_flops if peak_flops else None}

    return {**rates(mean), **{f"{k}_median": v for k, v in rates(median).items()},
            "step_time_s_mean": mean, "step_time_s_median": median, "step_time_s_min": min(step_times),
            "step_time_s_max": max(step_times), "steps_timed": len(step_times),
            "tokens_per_step_per_gpu": tokens, "flops_per_step_per_gpu": flops}


def runner_spec(runner: str, spec: ExperimentSpec) -> ExperimentSpec:
    """The spec a runner trains: the graphs runner's with train.cuda_graphs on."""
    return evolve(spec, train=evolve(spec.train, cuda_graphs=True)) if runner == "graphs" else spec


def plan_beside(spec: ExperimentSpec, layout: Layout, *, vocab: int, padded_vocab: int, impl: str,
                gpu_name: str | None) -> dict[str, Any] | None:
    """What `mcx plan` says of this spec on the GPU that runs it (step time and peak memory), for the result to
    put beside the measured ones: a configuration outside the model's calibration is a held-out check of it.
    None where the GPU is not in the table."""
    gpu = gpu_from_name(gpu_name) if gpu_name else None
    if gpu is None:
        return None
    ran = evolve(spec, hardware=evolve(spec.hardware, gpu=gpu))
    st = predict_worker(ran, layout, padded_vocab=padded_vocab, impl=impl)
    mem = estimate_memory(ran, layout, vocab_size=vocab, transformer_impl=impl, suggest_fixes=False)
    # compute_bound_s: the step without the per-layer and per-step host costs (the "compute-bound prediction")
    return {"gpu": gpu, "step_s": st.step_s if st else None,
            "compute_bound_s": (st.step_s - st.host_wait_s - st.overhead_s) if st else None,
            "overhead_s": st.overhead_s if st else None, "mem_bytes": mem.total, "mem_verdict": mem.verdict,
            "mem_breakdown": mem.breakdown()}


def against_plan(plan: dict[str, Any] | None, run: dict[str, Any]) -> dict[str, float] | None:
    """predicted / measured - 1 of the median step and of the peak allocated memory (above zero: the plan is
    slower or larger than what ran)."""
    if plan is None or not plan["step_s"]:
        return None
    return {"step": plan["step_s"] / run["step_time_s_median"] - 1, "mem": plan["mem_bytes"] / run["mem_peak_bytes"] - 1}


# -- the mcx run ------------------------------------------------------------------------------------

def run_length_overrides(spec: ExperimentSpec, warmup: int, steps: int, profiled: int = 0) -> list[str]:
    """Enough iterations for the measurement and the profiled steps plus one (the worker is stopped during
    the last), no evaluation before the end, a launcher that can start the layout's processes."""
    iters = warmup + steps + profiled + 1
    out = [f"train.train_iters={iters}", f"train.eval_interval={iters}",
           f"train.lr_warmup_iters={min(spec.train.lr_warmup_iters, iters - 1)}"]
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    if spec.launch.kind == "slurm" or (world > 1 and spec.launch.kind == "local"):
        out.append(f'launch.kind="{"local" if world == 1 else "torchrun"}"')
    return out


def job_dict(spec: ExperimentSpec, layout: Layout, stage_dir: Path, data_dir: Path,
             profile: tuple[int, int] | None = None) -> dict[str, Any]:
    """job.json of the full stage, per the job contract in docs/stage-directory.md; ``profile``: the (first,
    last) steps the worker profiles (`mcx run --profile`)."""
    job = {"stage": "full", "spec": spec_to_dict(spec), "layout": layout.job_dict(),
           "data_dir": str(data_dir), "checkpoint_dir": str(stage_dir / "checkpoints"), "train_samples_limit": None,
           "checks": {"resume_check_iters": spec.smoke.resume_check_iters, "loss_window": spec.smoke.loss_window,
                      "min_loss_drop": spec.smoke.min_loss_drop},
           "device": "cpu" if spec.hardware.gpu == "cpu" else "cuda", "output": "quiet",
           **({"profile": {"first": profile[0], "last": profile[1]}} if profile else {})}
    return {"run_id": "bench-" + short_id(digest(job), 8), **job}


def train_records(path: Path) -> list[dict[str, Any]]:
    """The complete ``train`` lines of metrics.jsonl (a line being written is skipped)."""
    return [r for r in read_records(path) if r.get("kind") == "train"]


def run_mcx(spec: ExperimentSpec, layout: Layout, project: Path, stage_dir: Path, *, warmup: int, steps: int,
            timeout: float, profiled: int = 0) -> dict[str, Any]:
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    timed_end = warmup + steps
    profile = (timed_end + 1, timed_end + profiled) if profiled else None
    job = job_dict(spec, layout, stage_dir, (project / spec.data.path).resolve(), profile)
    ops = stage_dir / "profile" / "ops-rank0.txt"
    (stage_dir / "job.json").write_text(json.dumps(job, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    log = stage_dir / "launch.log"
    launcher = evolve(launcher_for(spec.launch), log=log)
    handle = launcher.start(stage_dir, Placement(world_size=job["layout"]["world_size"]), spec.launch, worker_env(spec))
    metrics, wanted, start = stage_dir / "metrics.jsonl", timed_end + profiled, time.monotonic()
    seen = 0
    try:
        while True:
            records = train_records(metrics)
            if len(records) > seen:
                seen = len(records)
                _say(f"mcx step {seen}/{wanted}: {records[-1]['step_time_s']:.3f} s, loss {records[-1]['loss']}")
            done = seen >= wanted and (not profiled or ops.is_file())  # the profile is written after its last line
            if done or handle.poll() != "running" or time.monotonic() - start > timeout:
                break
            time.sleep(0.25)
    finally:
        handle.kill()  # no final checkpoint or evaluation: they are not measured
        outcome = handle.wait()
    records = {r["step"]: r for r in train_records(metrics)}
    timed = [records[s] for s in range(warmup, timed_end + 1) if s in records]  # the last warm-up step starts
    if len(timed) < steps + 1:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.is_file() else ""
        worker = stage_dir / "worker.log"
        tail += worker.read_text(encoding="utf-8", errors="replace")[-3000:] if worker.is_file() else ""
        raise SystemExit(f"throughput: mcx's worker wrote {len(records)} of {wanted} steps "
                         f"({outcome.state}: {outcome.detail}); stage directory {stage_dir}\n{tail}")
    # A step's time: from the previous step's metrics line to its own (each written right after its
    # step, so the whole loop iteration counts); the worker's own step_time_s leaves out what the
    # loop does between steps (metrics line, checks), and is reported beside it.
    intervals = [b["time"] - a["time"] for a, b in zip(timed, timed[1:], strict=False)]
    measured = timed[1:]
    return {"runner": "mcx", "stage_dir": str(stage_dir), "job": {k: job[k] for k in ("run_id", "layout", "data_dir")},
            "built": built_details(stage_dir / "worker.log"),
            "step_times_s": intervals, "self_timed_step_times_s": [r["step_time_s"] for r in measured],
            "loss_first": records[min(records)]["loss"], "loss_last": measured[-1]["loss"],
            "mem_peak_bytes": max(r["mem_peak_bytes"] for r in measured),
            "self_reported_median": {k: statistics.median(r[k] for r in measured)
                                     for k in ("tokens_per_s_per_gpu", "tflops_per_gpu")},
            "profile": profile_files(ops.with_name("trace-rank0.json.gz"), ops) if profiled else None}


def profile_files(trace: Path, ops: Path) -> dict[str, str] | None:
    """Where a runner's profile is, and its op table's text (the result file carries it off the GPU machine)."""
    if not ops.is_file():
        return None
    return {"trace": str(trace), "ops": str(ops), "table": ops.read_text(encoding="utf-8")}


def built_details(worker_log: Path) -> dict[str, Any] | None:
    """What the worker built (layer spec, fusions), from its "built: {...}" log line."""
    text = worker_log.read_text(encoding="utf-8", errors="replace") if worker_log.is_file() else ""
    for line in text.splitlines():
        if "built: {" in line:
            return json.loads(line[line.index("built: {") + len("built: "):])
    return None


# -- the bare run -----------------------------------------------------------------------------------

def run_bare(spec: ExperimentSpec, overrides: list[str], impl: str, spec_path: str, project: Path, out: Path, *,
             warmup: int, steps: int, timeout: float, profiled: int = 0) -> dict[str, Any]:
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    script = [str(HERE / "bare_mcore.py"), "--spec", spec_path, "--impl", impl, "--project", str(project),
              "--warmup", str(warmup), "--steps", str(steps), "--out", str(out),
              *(["--profile", str(profiled), "--profile-dir", str(out.parent / "profile")] if profiled else []),
              *[arg for o in overrides for arg in ("--set", o)]]
    env = {**os.environ, **worker_env(spec)}  # what mcx's launcher gives its worker
    if world == 1:
        argv = [sys.executable, *script]
    else:
        env.setdefault("OMP_NUM_THREADS", omp_threads(world))  # as mcx's torchrun launcher
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), *script]
    out.unlink(missing_ok=True)
    done = subprocess.run(argv, cwd=project, env=env, stdout=subprocess.DEVNULL, timeout=timeout, check=False)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"throughput: the bare loop failed (exit {done.returncode}): {' '.join(argv)}")
    result = json.loads(out.read_text(encoding="utf-8"))
    if profiled:
        result["profile"] = profile_files(out.parent / "profile" / "trace-bare.json.gz",
                                          out.parent / "profile" / "ops-bare.txt")
    return result


# -- driver -----------------------------------------------------------------------------------------

def gpu_peak_flops() -> tuple[str | None, float | None]:
    """(device name, bf16 dense peak FLOP/s) of GPU 0 from nvidia-smi; None where unknown."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None, None
    name = names[0].strip() if names else None
    gpu = gpu_from_name(name) if name else None
    return name, (mfu_peak_flops(gpu) if gpu else None)


def chosen(only: str | None, known: dict[str, Any], tool: str) -> list[str]:
    """The names a driver's ``--only`` picks among ``known`` (all of them without it), unknown ones refused."""
    names = [n.strip() for n in only.split(",")] if only else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"{tool}: unknown name {unknown}; known: {', '.join(known)}")
    return names


def run_quietly(argv: list[str]) -> str | None:
    """:func:`main` on ``argv`` with its stdout kept back: None, or the tail of what the failed run said."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:  # the worker failed: keep what it said (an OOM's message is the point)
            return str(exc)[-4000:]
    return None


def failure_line(said: str) -> str:
    """A failed run's own exception line, not a library's warning above it."""
    lines = said.splitlines() or [""]
    return next((ln for ln in reversed(lines) if "Error" in ln.split(":")[0]), lines[-1]).strip()[:160]


def _say(text: str) -> None:
    sys.stderr.write(f"throughput: {text}\n")
    sys.stderr.flush()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="mcx's runner vs a bare Megatron-Core loop on one spec: tokens/s ratio "
                                f"(target >= {TARGET_RATIO}), MFU, peak memory.")
    p.add_argument("--spec", help="the spec to measure (default: experiments/h200_1gpu.toml)")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="one of issue 41's small shapes instead of --spec: " +
                        "; ".join(f"{k}: {v[2]}" for k, v in PRESETS.items()))
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, N more steps of each runner under torch.profiler (untimed): the "
                        "trace and the ops by self CPU time in the work directory")
    p.add_argument("--impl", choices=sorted(IMPLS), default="local")
    p.add_argument("--fp8", choices=["none", *FP8], default=None, help="default: the spec's precision")
    p.add_argument("--mbs", type=int, help="micro batch size (default: the spec's)")
    p.add_argument("--seq", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--gpus", type=int, help="GPUs on the node (default: the spec's); 2 starts torchrun")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other spec override")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps, both runners")
    p.add_argument("--warmup", type=int, default=5, help="untimed optimizer steps first, both runners")
    p.add_argument("--runners", default="bare,mcx", help="which runs, in this order, of bare (the bare loop), mcx (mcx's "
                   "worker) and graphs (mcx's worker with train.cuda_graphs = true, one GPU)")
    p.add_argument("--project", default=".", help="project root (the spec's data path is relative to it)")
    p.add_argument("--work-dir", help="where mcx's stage directory goes (default: a new temporary directory)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    p.add_argument("--out", help="also write the JSON result here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    if not runners or set(runners) - set(RUNNERS) or len(set(runners)) != len(runners):
        raise SystemExit(f"throughput: --runners takes {', '.join(RUNNERS)}, comma-separated")
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("throughput: --steps and --warmup must be >= 1 (a timed step starts where the previous ended)")
    if "graphs" in runners and args.warmup < GRAPH_WARMUP_STEPS + 1:
        raise SystemExit(f"throughput: the graphs runner needs --warmup >= {GRAPH_WARMUP_STEPS + 1} (its eager steps "
                         "and the capture must not be timed)")
    if args.preset and args.spec:
        raise SystemExit("throughput: give --spec or --preset, not both")
    if args.profile < 0:
        raise SystemExit("throughput: --profile takes a number of steps (0: none)")
    args.spec, preset = PRESETS[args.preset][:2] if args.preset else (args.spec or "experiments/h200_1gpu.toml", [])
    project = Path(args.project).resolve()
    base = spec_overrides(impl=args.impl, fp8=args.fp8, mbs=args.mbs, seq=args.seq, layers=args.layers,
                          gpus=args.gpus, deterministic=args.deterministic, extra=[*preset, *args.set])
    spec, overrides, _, _ = load_benchmark_spec(args.spec, base, impl=args.impl, fp8=args.fp8, project=project)
    overrides = [*overrides, *run_length_overrides(spec, args.warmup, args.steps, args.profile)]
    spec, overrides, layout, vocab = load_benchmark_spec(args.spec, overrides, impl=args.impl, fp8=None,
                                                         project=project)
    world = layout.world_size
    padded = padded_vocab_size(vocab, spec.model.make_vocab_size_divisible_by, layout.tp)
    gpu_name, peak = gpu_peak_flops()
    work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="mcx-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    _say(f"{args.spec} {' '.join(overrides)}; layout {layout.job_dict()}; work dir {work}")

    plan = plan_beside(spec, layout, vocab=vocab, padded_vocab=padded, impl=IMPLS[args.impl], gpu_name=gpu_name)
    runs: dict[str, dict[str, Any]] = {}
    for runner in runners:
        _say(f"running {runner}")
        if runner == "bare":
            run = run_bare(spec, overrides, args.impl, args.spec, project, work / "bare.json", warmup=args.warmup,
                           steps=args.steps, timeout=args.timeout, profiled=args.profile)
        else:
            run = run_mcx(runner_spec(runner, spec), layout, project, work / runner / "full", warmup=args.warmup,
                          steps=args.steps, timeout=args.timeout, profiled=args.profile)
        runs[runner] = {**run, **score(spec, world, padded, run["step_times_s"], peak),
                        "self_timed": score(spec, world, padded, run["self_timed_step_times_s"], peak)}
        # each runner against the plan of the spec it ran (the graphs' host floor has no per-layer part)
        own = plan if runner != "graphs" else plan_beside(runner_spec(runner, spec), layout, vocab=vocab,
                                                          padded_vocab=padded, impl=IMPLS[args.impl], gpu_name=gpu_name)
        runs[runner]["plan_error"] = against_plan(own, runs[runner])

    result: dict[str, Any] = {
        "spec": args.spec, "preset": args.preset, "overrides": overrides, "impl": IMPLS[args.impl], "precision": spec.train.precision,
        "layout": layout.job_dict(), "micro_batch_size": spec.train.micro_batch_size,
        "global_batch_size": spec.train.global_batch_size, "seq_length": spec.model.seq_length,
        "padded_vocab_size": padded, "gpu_name": gpu_name, "peak_flops": peak, "warmup": args.warmup,
        "steps": args.steps, "order": runners,
        "statistic": "tokens/s per GPU = global-batch tokens x timed steps / summed step times / GPUs "
                     "(time-weighted mean); *_median from the median step time",
        "runs": runs, "target": TARGET_RATIO, "plan": plan,
    }
    if "graphs" in runs:
        for other in ("bare", "mcx"):
            if other in runs:
                result[f"ratio_graphs_{other}"] = \
                    runs["graphs"]["tokens_per_s_per_gpu"] / runs[other]["tokens_per_s_per_gpu"]
    if {"bare", "mcx"} <= runs.keys():
        bare, mcx = runs["bare"], runs["mcx"]
        ratio = mcx["tokens_per_s_per_gpu"] / bare["tokens_per_s_per_gpu"]
        median = mcx["tokens_per_s_per_gpu_median"] / bare["tokens_per_s_per_gpu_median"]
        result.update(ratio=ratio, ratio_median=median, meets_target=ratio >= TARGET_RATIO,
                      mfu={"bare": bare["mfu"], "mcx": mcx["mfu"]},
                      mem_peak_gib={"bare": bare["mem_peak_bytes"] / 2**30, "mcx": mcx["mem_peak_bytes"] / 2**30})
    line = json.dumps(result, sort_keys=True)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except McxError as exc:  # a bad spec or override: the message names the key and the fix
        raise SystemExit(f"throughput: {exc}") from None
