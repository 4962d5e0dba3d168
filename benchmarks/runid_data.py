"""How long a run ID takes on a big DVC-tracked dataset, next to hashing the data itself.

Creates (or reuses) under ``--dir`` a DVC repository (``dvc init --no-scm``) with a dataset of
``--gb`` GB of random bytes (``data/quickstart/corpus.bin`` + ``corpus.idx``), tracked by ``dvc add``
(hard-linked cache, so the data lies on disk once), and a spec pointing at it. Then times, in one
run:

    run_id_cold   a fresh Python process that loads the spec, fingerprints it and prints the run ID
                  (interpreter start and imports included; median of --repeats)
    run_id_warm   the same fingerprint in this process (median of --repeats)
    sha256_data   sha256 of every byte of the dataset, streamed (what a fingerprint would cost if it
                  re-read the data); the page cache state is whatever creation left

and prints one JSON object with the ratio sha256_data / run_id_cold.

    .venv/bin/python benchmarks/runid_data.py [--dir /tmp/mcx-bench-data] [--gb 10] [--repeats 5]

Creating 10 GB takes minutes (random bytes, then `dvc add` reads them once); later runs reuse it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 << 20
GB = 10**9


def _dvc(repo: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, check=True, capture_output=True)


def _dataset_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*") if p.is_file())


def ensure_repo(base: Path, gb: float) -> tuple[Path, dict[str, float]]:
    """The benchmark repository for ``gb`` GB: reused when complete, else built from scratch."""
    repo = base / f"repo-{gb:g}gb"
    data = repo / "data" / "quickstart"
    size = int(gb * GB)
    ready = (repo / "data.dvc").is_file() and data.is_dir() and _dataset_bytes(data) == size + 4096
    if ready:
        return repo, {"reused": 1.0}
    if repo.exists():
        shutil.rmtree(repo)
    data.mkdir(parents=True)
    timings: dict[str, float] = {"reused": 0.0}
    _dvc(repo, "init", "--no-scm", "-q")
    _dvc(repo, "config", "cache.type", "hardlink")
    t0 = time.perf_counter()
    with open(data / "corpus.bin", "wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    (data / "corpus.idx").write_bytes(os.urandom(4096))
    timings["write_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _dvc(repo, "add", "-q", "data")
    timings["dvc_add_s"] = time.perf_counter() - t0
    shutil.copy(REPO / "experiments" / "tiny.toml", repo / "tiny.toml")  # data.path = "data/quickstart"
    return repo, timings


def fingerprint(spec_path: Path, root: Path) -> dict[str, str]:
    from mcx.fingerprint import collect, run_id
    from mcx.spec import load_spec

    record = collect(load_spec(spec_path), root)
    return {"run_id": run_id(record), "data_source": record.data["id"]["dataset"]["source"]}


def sha256_tree(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(p.relative_to(path).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mcx-bench-data"))
    ap.add_argument("--gb", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--run-id", nargs=2, metavar=("SPEC", "ROOT"), help=argparse.SUPPRESS)  # the cold process
    args = ap.parse_args(argv)
    if args.run_id:
        print(json.dumps(fingerprint(Path(args.run_id[0]), Path(args.run_id[1]))))
        return 0

    repo, setup = ensure_repo(args.dir, args.gb)
    spec = repo / "tiny.toml"
    cold, answers = [], set()
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run-id", str(spec), str(repo)],
                             check=True, capture_output=True, text=True).stdout
        cold.append(time.perf_counter() - t0)
        answers.add(out.strip())
    parsed = [json.loads(a) for a in answers]
    if any(a["data_source"] != "dvc" for a in parsed):
        raise SystemExit(f"the dataset was not found through DVC ({parsed}); the benchmark measures nothing")
    warm = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        answers.add(json.dumps(fingerprint(spec, repo)))
        warm.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    sha256_tree(repo / "data" / "quickstart")
    sha = time.perf_counter() - t0
    result = {
        "dataset_bytes": _dataset_bytes(repo / "data" / "quickstart"),
        "run_id": parsed[0]["run_id"],
        # Every process and repeat gave the same ID (false only if mcx's sources changed meanwhile).
        "same_id_everywhere": len(answers) == 1,
        "run_id_cold_s": statistics.median(cold),
        "run_id_cold_all_s": cold,
        "run_id_warm_s": statistics.median(warm),
        "sha256_data_s": sha,
        "ratio_sha256_over_run_id_cold": sha / statistics.median(cold),
        "setup": setup,
        "cpu": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    ratio = result["ratio_sha256_over_run_id_cold"]
    print(f"run ID (cold process) {result['run_id_cold_s']:.3f} s, in process {result['run_id_warm_s']:.3f} s; "
          f"sha256 of {result['dataset_bytes'] / GB:.2f} GB {sha:.1f} s; ratio {ratio:.1f}x", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
