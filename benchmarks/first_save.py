"""Where a process's first Megatron-Core checkpoint save goes, against its later ones (issue 7, D31).

One rank on one GPU (NCCL process group of one), a sharded state dict of CUDA tensors (``--mib`` in
``--tensors`` pieces, like one rank's model and optimizer state), saved synchronously with mcx's own
save strategy (``mcx.train.gpu.save_strategy``) ``--saves`` times into fresh directories, the previous
one deleted, as a run's checkpoint directory rotates. Every save is timed; the first and the second
are profiled (cProfile), and the functions whose cumulative time differs most between the two are
listed: what only the first save pays.

    python3 benchmarks/first_save.py --mib 1316 --tensors 212 --dir /tmp/first_save --out $OUT/first_save.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import time
from pathlib import Path


def _cumulative(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    return {f"{Path(f).name}:{line} {name}": ct for (f, line, name), (_, _, _, ct, _) in stats.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=float, default=1316)
    p.add_argument("--tensors", type=int, default=212)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--dir", type=Path, default=Path("/tmp/first_save"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from mcx.train.gpu import save_strategy

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    numel = int(args.mib * 2 ** 20 / 4 / args.tensors)
    state = {f"t{i}": ShardedTensor.from_rank_offsets(f"t{i}", torch.randn(numel, device="cuda"))
             for i in range(args.tensors)}
    strategy = save_strategy()
    shutil.rmtree(args.dir, ignore_errors=True)
    seconds, profiles, previous = [], [], None
    for i in range(args.saves):
        directory = args.dir / f"save_{i}"
        directory.mkdir(parents=True)
        profile = cProfile.Profile() if i < 2 else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if profile:
            profile.enable()
        dist_checkpointing.save(state, str(directory), sharded_strategy=strategy, validate_access_integrity=i == 0)
        if profile:
            profile.disable()
            profiles.append(_cumulative(profile))
        seconds.append(time.perf_counter() - t0)
        print(f"save {i + 1}: {seconds[-1]:.2f} s", flush=True)
        if previous:
            shutil.rmtree(previous)
        previous = directory
    first, second = profiles
    extra = sorted(((first[k] - second.get(k, 0.0), first[k], second.get(k, 0.0), k) for k in first), reverse=True)
    lines = [f"{d:8.3f} s more  (first {a:7.3f}, second {b:7.3f})  {k}" for d, a, b, k in extra[:args.top]]
    print("what the first save paid beyond the second (cumulative):", *lines, sep="\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"mib": args.mib, "tensors": args.tensors, "seconds": seconds,
                                        "first_extra": lines}, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
