"""What the always-on batch hash costs a step (issue 40, D69): on the CPU quickstart here, and what it would
cost a GPU step of the layout-runs model.

1. CPU quickstart: trains experiments/tiny.toml's full stage for ``--steps`` steps in process (the worker,
   batch hashes on), reads its step times from metrics.jsonl, and times ``batch_digests`` over the same
   steps' micro-batches (read again from the same sampler): the hash's share of the median step.
2. GPU estimate: micro-batches of the layout-runs model's shape (8 micro-batches of 1 x 2048 tokens a step:
   tokens, labels, position ids int64, loss mask float32) hashed on this host, against the 0.36 s step that
   model measured on one H200 (docs/benchmarks.md); the hash runs on the host before the copy to the
   device, so this host time is what a step pays. mcx's ``batch_digests`` (xxh3_64) and blake2b (the
   standard library's) over the same bytes, for the choice (D69).

    .venv/bin/python benchmarks/batch_hash_cost.py --steps 30 --repeat 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
GPU_STEP_S = 0.36  # the layout-runs model's step on one H200 (8 layers, hidden 1024, seq 2048, 8 x 1 micro-batches)
GPU_SHAPE = (8, 1, 2048)  # micro-batches a step, micro-batch size, sequence length


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def cpu_quickstart(steps: int, repeat: int) -> dict:
    from mcx.contract.job import num_microbatches, read_job
    from mcx.spec.load import load_spec, spec_to_dict
    from mcx.train import train_stage
    from mcx.train.batch_hash import batch_digests
    from mcx.train.datasets import datasets_from_spec, iterate_batches

    spec = load_spec(ROOT / "experiments" / "tiny.toml", [f"train.train_iters={steps}", f"train.eval_interval={steps}",
                                                          "train.eval_iters=1", "checkpoint.interval=0",
                                                          "checkpoint.final=false", "train.lr_warmup_iters=1"])
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "full"
        stage.mkdir()
        job = {"run_id": "b" * 12, "stage": "full", "spec": spec_to_dict(spec),
               "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1, "world_size": 1,
                          "sequence_parallel": False},
               "data_dir": str(ROOT / spec.data.path), "checkpoint_dir": str(stage / "checkpoints"),
               "train_samples_limit": None, "checks": {"resume_check_iters": 1, "loss_window": 3, "min_loss_drop": 0.0},
               "device": "cpu", "output": "quiet"}
        (stage / "job.json").write_text(json.dumps(job))
        result = train_stage(stage)
        assert result["status"] == "finished", result
        times = [r["step_time_s"] for r in map(json.loads, (stage / "metrics.jsonl").read_text().splitlines())
                 if r["kind"] == "train"][2:]  # the first steps warm up
        data = datasets_from_spec(spec, ROOT / spec.data.path, stage / "cache")
        n = num_microbatches(read_job(stage))
        it = iterate_batches(data.train, 0, spec.train.micro_batch_size, 0, 1)
        mbs = [[next(it) for _ in range(n)] for _ in range(steps)]
    hash_s = best_of(lambda: [batch_digests(s) for s in mbs], repeat) / steps
    step_s = statistics.median(times)
    nbytes = sum(t.numel() * t.element_size() for t in mbs[0][0].values() if t is not None) * n
    return {"micro_batches_a_step": n, "bytes_a_step": nbytes, "median_step_s": step_s, "hash_s_a_step": hash_s,
            "share_of_step": hash_s / step_s}


def gpu_estimate(repeat: int) -> dict:
    import torch

    from mcx.train.batch_hash import batch_digests

    n, mbs, seq = GPU_SHAPE
    g = torch.Generator().manual_seed(0)
    step = [{"tokens": torch.randint(0, 128256, (mbs, seq), generator=g), "labels": torch.randint(0, 128256, (mbs, seq), generator=g),
             "loss_mask": torch.ones(mbs, seq), "position_ids": torch.arange(seq).expand(mbs, seq).contiguous(),
             "attention_mask": None} for _ in range(n)]
    nbytes = sum(t.numel() * t.element_size() for mb in step for t in mb.values() if t is not None)
    rounds = 50
    used = best_of(lambda: [batch_digests(step) for _ in range(rounds)], repeat) / rounds

    def blake() -> None:  # the standard library's alternative, over the same bytes and prefixes (D69)
        for mb in step:
            h = hashlib.blake2b(digest_size=8)
            for name, t in mb.items():
                if t is not None:
                    h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
                    h.update(t.reshape(-1).view(torch.uint8).numpy())
            h.hexdigest()

    b = best_of(lambda: [blake() for _ in range(rounds)], repeat) / rounds
    return {"bytes_a_step": nbytes, "gpu_step_s": GPU_STEP_S, "xxh3_64_s_a_step": used,
            "xxh3_64_gb_per_s": nbytes / used / 1e9, "xxh3_64_share_of_gpu_step": used / GPU_STEP_S,
            "blake2b_s_a_step": b, "blake2b_gb_per_s": nbytes / b / 1e9, "blake2b_share_of_gpu_step": b / GPU_STEP_S}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    out = {"cpu": os.cpu_count(), "load_average": os.getloadavg(), "cpu_quickstart": cpu_quickstart(args.steps, args.repeat),
           "gpu_layout_runs_estimate": gpu_estimate(args.repeat)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
