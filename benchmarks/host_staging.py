"""What the first asynchronous checkpoint save pays for on this machine, apart from mcx (issue 7, D31).

Two measurements, each side by side in one run:

* pinned host memory, the buffers a save's copy to host lands in: the time to create them the first
  time and to get them again from torch's cache, with torch's default (``cudaHostAlloc``) and with
  ``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:N``
  (``malloc``, pages touched by N threads, then ``cudaHostRegister``). Each setting runs in a fresh
  process, since the allocator reads its settings once;
* the disk: the same bytes written and fsynced twice into one directory, the first file deleted
  before the second is written, as a checkpoint directory is rotated.

    python3 benchmarks/host_staging.py --gib 1.3 --tensors 64 --dir /tmp/hs --out $OUT/host_staging.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

GIB = 1024 ** 3


def _pin(gib: float, tensors: int) -> dict:
    """In this process: create ``tensors`` pinned buffers holding ``gib`` in all, free them, create them again."""
    import torch

    torch.cuda.init()
    sizes = [int(gib * GIB / tensors)] * tensors
    rounds = []
    for _ in range(2):
        t0 = time.perf_counter()
        held = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
        rounds.append(time.perf_counter() - t0)
        del held
    stats = torch.cuda.host_memory_stats()
    return {"first_s": rounds[0], "again_s": rounds[1], "buffers": stats.get("num_host_alloc"),
            "pinned_gib": stats.get("allocated_bytes.current", 0) / GIB}


def _disk(directory: Path, gib: float) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(64 * 1024 ** 2)
    times = []
    for i in range(2):
        path = directory / f"write_{i}.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(max(1, int(gib * GIB / len(block)))):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
        path.unlink()
    return {"first_s": times[0], "second_s": times[1], "gib": gib}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.3, help="bytes of one save's tensors on one rank")
    p.add_argument("--tensors", type=int, default=64, help="how many buffers they come in")
    p.add_argument("--threads", type=int, default=8, help="pinned_num_register_threads")
    p.add_argument("--dir", type=Path, default=Path("/tmp/host_staging"), help="where the disk test writes")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_pin(args.gib, args.tensors)))
        return
    settings = {"cudaHostAlloc (default)": "",
                f"cudaHostRegister, {args.threads} threads":
                    f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{args.threads}"}
    results: dict = {"gib": args.gib, "tensors": args.tensors, "pinned": {}}
    for name, conf in settings.items():
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf}
        out = subprocess.run([sys.executable, __file__, "--child", "--gib", str(args.gib), "--tensors", str(args.tensors)],
                             env=env, capture_output=True, text=True, timeout=300)
        results["pinned"][name] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
            "error": out.stderr[-2000:]}
        print(name, results["pinned"][name], flush=True)
    results["disk"] = _disk(args.dir, args.gib)
    print("disk", results["disk"], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
