"""What checking a 10 GB DVC-tracked dataset by content costs: unchanged, fully re-hashed, one file changed.

Creates (or reuses) under ``--dir`` a DVC repository (``dvc init --no-scm``) with a dataset of
``--gb`` GB of random bytes in ``--files`` equal files (``data/quickstart/part-NNNNN.bin``), tracked
by ``dvc add`` (hard-linked cache, so the data lies on disk once), a spec pointing at it and a
``.mcx/`` directory (as a first ``mcx run`` leaves it: the per-file hashes are kept there). Then, in
one run, each check being ``mcx.fingerprint.data.collect_data`` (what ``mcx plan`` and ``mcx run``
call: walk, ``stat``, hash what changed, DVC's directory md5, compare with ``data.dvc``):

    full_rehash          every file read and hashed (``mcx run --verify-data``, ``mcx reproduce``)
    unchanged            nothing changed since the last check: the kept hashes are used (median of --repeats)
    one_file_change      64 bytes of one file overwritten in place (same size): refused, naming the file
    one_file_hash        md5 of that one file alone, for comparison with the change's extra cost
    run_id_cold          a fresh Python process that loads the spec, fingerprints it (code, environment,
                         data, hardware) and prints the run ID: interpreter start and imports included

The changed bytes are put back afterwards (the next check re-hashes that file once more). Page
cache: whatever creation and earlier checks left (on a 24 GiB machine, most of the 10 GB).

    .venv/bin/python benchmarks/runid_data.py [--dir /tmp/mcx-bench-data] [--gb 10] [--files 1000] [--repeats 5]

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

from mcx.fingerprint.filehashes import RACY_NS

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 << 20
GB = 10**9


def _dvc(repo: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, check=True, capture_output=True)


def _dataset_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*") if p.is_file())


def ensure_repo(base: Path, gb: float, files: int) -> tuple[Path, dict[str, float]]:
    """The benchmark repository for ``gb`` GB in ``files`` files: reused when complete, else built from scratch."""
    repo = base / f"repo-{gb:g}gb-{files}files"
    data = repo / "data" / "quickstart"
    each = int(gb * GB) // files
    ready = (repo / "data.dvc").is_file() and data.is_dir() and _dataset_bytes(data) == each * files
    if ready:
        return repo, {"reused": 1.0}
    if repo.exists():
        shutil.rmtree(repo)
    data.mkdir(parents=True)
    timings: dict[str, float] = {"reused": 0.0}
    _dvc(repo, "init", "--no-scm", "-q")
    _dvc(repo, "config", "cache.type", "hardlink")
    t0 = time.perf_counter()
    for i in range(files):
        with open(data / f"part-{i:05d}.bin", "wb") as f:
            left = each
            while left:
                n = min(CHUNK, left)
                f.write(os.urandom(n))
                left -= n
    os.sync()
    timings["write_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _dvc(repo, "add", "-q", "data")
    timings["dvc_add_s"] = time.perf_counter() - t0
    shutil.copy(REPO / "experiments" / "tiny.toml", repo / "tiny.toml")  # data.path = "data/quickstart"
    (repo / ".mcx").mkdir(exist_ok=True)
    return repo, timings


def check(spec_path: Path, root: Path, rehash: bool = False) -> tuple[float, dict]:
    """Seconds for one data check and what it returned (or the refusal's message)."""
    from mcx.errors import DataError
    from mcx.fingerprint.data import collect_data
    from mcx.spec import load_spec

    spec = load_spec(spec_path)
    t0 = time.perf_counter()
    try:
        data = collect_data(spec, root, rehash=rehash)
    except DataError as exc:
        return time.perf_counter() - t0, {"refused": str(exc)}
    return time.perf_counter() - t0, {"id": data["id"]["dataset"], "content": data["info"]["dataset"]["content"],
                                      "verified": data["info"]["dataset"]["verified"]}


def fingerprint(spec_path: Path, root: Path) -> dict[str, str]:
    from mcx.fingerprint import collect, run_id
    from mcx.spec import load_spec

    record = collect(load_spec(spec_path), root)
    return {"run_id": run_id(record), "data_source": record.data.paths["dataset"].source}


def flip(path: Path, offset: int, n: int = 64) -> None:
    """Overwrite ``n`` bytes in place with their complement (twice puts them back)."""
    os.chmod(path, 0o644)  # DVC leaves hard-linked files read-only
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))
    os.chmod(path, 0o444)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mcx-bench-data"))
    ap.add_argument("--gb", type=float, default=10.0)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--run-id", nargs=2, metavar=("SPEC", "ROOT"), help=argparse.SUPPRESS)  # the cold process
    args = ap.parse_args(argv)
    if args.run_id:
        print(json.dumps(fingerprint(Path(args.run_id[0]), Path(args.run_id[1]))))
        return 0

    repo, setup = ensure_repo(args.dir, args.gb, args.files)
    spec = repo / "tiny.toml"
    data = repo / "data" / "quickstart"
    full_s, full = check(spec, repo, rehash=True)
    if full.get("id", {}).get("source") != "dvc":
        raise SystemExit(f"the dataset was not checked through DVC ({full}); the benchmark measures nothing")
    unchanged = []
    for _ in range(args.repeats):
        seconds, got = check(spec, repo)
        assert got["id"] == full["id"] and got["content"]["read"] == 0, got
        unchanged.append(seconds)

    victim = sorted(data.glob("*.bin"))[len(list(data.glob("*.bin"))) // 2]
    flip(victim, offset=victim.stat().st_size // 2)
    try:
        change_s, changed = check(spec, repo)
    finally:
        flip(victim, offset=victim.stat().st_size // 2)
    if victim.name not in changed.get("refused", ""):
        raise SystemExit(f"the changed file was not named: {changed}")
    t0 = time.perf_counter()
    with open(victim, "rb") as f:
        hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False))
    one_hash_s = time.perf_counter() - t0
    restore_s, restored = check(spec, repo)  # re-hashes the file put back
    assert restored.get("id") == full["id"] and restored["content"]["read"] == 1, restored
    time.sleep(RACY_NS / 1e9 + 0.5)  # the file put back is kept only once it is older than the racy window
    check(spec, repo)

    cold, answers = [], set()
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run-id", str(spec), str(repo)],
                             check=True, capture_output=True, text=True).stdout
        cold.append(time.perf_counter() - t0)
        answers.add(out.strip())
    unchanged_s = statistics.median(unchanged)
    result = {
        "dataset_bytes": _dataset_bytes(data),
        "files": len(list(data.glob("*.bin"))),
        "full_rehash_s": full_s,
        "full_rehash_content": full["content"],
        "unchanged_s": unchanged_s,
        "unchanged_all_s": unchanged,
        "ratio_full_rehash_over_unchanged": full_s / unchanged_s,
        "one_file_change_s": change_s,
        "one_file_change_refusal": changed["refused"],
        "one_file_hash_s": one_hash_s,
        "one_file_change_extra_s": change_s - unchanged_s,
        "changed_back_s": restore_s,
        "run_id_cold_s": statistics.median(cold),
        "run_id_cold_all_s": cold,
        # Every fresh process gave the same ID (false only if mcx's sources changed meanwhile).
        "same_id_everywhere": len(answers) == 1,
        "setup": setup,
        "cpu": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg": os.getloadavg(),
    }
    print(f"{result['dataset_bytes'] / GB:.2f} GB in {result['files']} files: unchanged {unchanged_s:.3f} s, "
          f"full re-hash {full_s:.1f} s ({result['ratio_full_rehash_over_unchanged']:.0f}x), one file changed "
          f"{change_s:.3f} s (that file's md5 alone {one_hash_s:.3f} s); run ID in a fresh process "
          f"{result['run_id_cold_s']:.3f} s", file=sys.stderr)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
