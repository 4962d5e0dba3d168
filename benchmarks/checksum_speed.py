"""Which content hash a checkpoint's files should carry (issue 22, D36): sha256, blake2b and CRC-32 over one
large file, against reading it alone.

The file is written once (random bytes, so nothing compresses) and read back through the page cache, as a
rank hashing the files it has just written reads them; CRC-32 is timed through mcx's own
``checksums.file_sum``, the others with the same 8 MiB reads into ``hashlib``. Best of ``--repeat`` runs.

    .venv/bin/python benchmarks/checksum_speed.py --gib 1 --dir /tmp/checksum_speed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcx.weights.checksums import CHUNK, file_sum  # noqa: E402


def read_only(path: Path) -> None:
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def hashlib_sum(name: str):
    def run(path: Path) -> str:
        h = hashlib.new(name)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        return h.hexdigest()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--dir", default="/tmp/checksum_speed")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    path = Path(args.dir) / "data.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    size = int(args.gib * 2**30)
    with open(path, "wb") as f:
        for _ in range(0, size, 64 << 20):
            f.write(os.urandom(min(64 << 20, size - f.tell())))
    out = {"bytes": size, "cpu": os.cpu_count(), "load_average": os.getloadavg(), "results": {}}
    for name, fn in (("read only", read_only), ("sha256", hashlib_sum("sha256")),
                     ("blake2b", hashlib_sum("blake2b")), ("crc32 (checksums.file_sum)", file_sum)):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn(path)
            times.append(time.perf_counter() - t0)
        out["results"][name] = {"best_s": min(times), "gib_per_s": size / min(times) / 2**30, "all_s": times}
    path.unlink()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
