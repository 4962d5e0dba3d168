"""What tracing costs a step (issue 40, D70/D74): the same model's training step without a trace, with the
trace `mcx locate` replays (every module's output, gradient and update fingerprinted, the first 64 MiB of
tensors kept) and with the cross-layout trace (every layer-level output and parameter kept in full), in one
process, alternated step by step so that drift in the machine's speed falls on all three alike.

Off is the training loop itself: a run without a trace builds no Tracer and attaches no hook (mcx.train.loop
builds one only for a replay's job file), so the "off" step here is exactly a normal run's step. A traced step
includes writing the trace (records and kept tensors) to a temporary directory, as a replay does.

    .venv/bin/python benchmarks/trace_cost.py --steps 8                       # CPU, experiments/tiny.toml
    python benchmarks/trace_cost.py --device cuda --spec experiments/h200_1gpu.toml --set model.num_layers=8 \
        --steps 8                                                                 # one GPU (benchmarks/gpu/suite.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "trace", "layers")


def measure(spec_path: Path, sets: list[str], device: str, steps: int, warmup: int) -> dict:
    import torch

    from mcx.contract.job import Job, num_microbatches
    from mcx.contract.trace import TraceRequest
    from mcx.plan.layout import Layout
    from mcx.spec.load import load_spec
    from mcx.train.datasets import datasets_from_spec, iterate_batches
    from mcx.train.runtime import distributed
    from mcx.train.trace import Tracer
    from mcx.train.worker import make_backend

    spec = load_spec(spec_path, ["train.lr_warmup_iters=1", *sets])
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        job = Job(run_id="c" * 12, stage="full", spec=spec, layout=Layout(), data_dir=str(ROOT / spec.data.path),
                  checkpoint_dir=str(stage / "checkpoints"), device=device)
        data = datasets_from_spec(spec, ROOT / spec.data.path, stage / "cache")
        with distributed(job) as world:
            backend = make_backend(job, world, data.tokenizer.vocab_size, stage)
            n = num_microbatches(job)
            it = iterate_batches(data.train, 0, spec.train.micro_batch_size, 0, 1)
            tracers = {"trace": TraceRequest(step=0), "layers": TraceRequest(step=0, keep_bytes=0, layers=True)}
            times: dict[str, list[float]] = {m: [] for m in MODES}
            written: dict[str, int] = {}
            for i in range(warmup + steps):
                for mode in MODES:  # alternated: each round runs all three, in the same order
                    mbs = [next(it) for _ in range(n)]
                    sync()
                    t0 = time.perf_counter()
                    if mode == "off":
                        backend.train_step(mbs)
                    else:
                        out = stage / f"trace-{mode}"
                        tracer = Tracer(tracers[mode], backend.model, backend.optimizer, world, out)
                        with tracer.traced(i + 1, mbs):
                            backend.train_step(mbs)
                    sync()
                    if i >= warmup:
                        times[mode].append(time.perf_counter() - t0)
                        if mode != "off":
                            written[mode] = sum(p.stat().st_size for p in out.iterdir())
            details = {k: backend.details.get(k) for k in ("layer_spec", "padded_vocab_size", "core_attention")}
    off = statistics.median(times["off"])
    return {"device": device if device == "cpu" else torch.cuda.get_device_name(), "micro_batches_a_step": n,
            "layers": spec.model.num_layers, "hidden": spec.model.hidden_size, "seq": spec.model.seq_length,
            "micro_batch_size": spec.train.micro_batch_size, "details": details, "steps_each": steps,
            "median_step_s": {m: statistics.median(t) for m, t in times.items()},
            "ratio_to_off": {m: statistics.median(t) / off for m, t in times.items()},
            "trace_bytes_written": written}


def sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", type=Path, default=ROOT / "experiments" / "tiny.toml")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=8, help="timed steps of each mode")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    out = {"cpu": os.cpu_count(), "load_average": os.getloadavg(), "spec": str(args.spec), "sets": args.sets,
           **measure(args.spec, args.sets, args.device, args.steps, args.warmup)}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
