#!/bin/bash
# Checkpoint checksums on one H200 (issue 22, D36). mcx's worker on experiments/h200_1gpu.toml shrunk to 2 layers
# (and the quickstart's 4096-token vocabulary: 6.6 GB a checkpoint instead of 21 GB, so three fit the disk),
# Transformer Engine spec, deterministic mode:
#   1. smoke stage, synchronous saves: every checkpoint carries checksums.json matching its files; the smoke checks
#      (round trip and bitwise resume, both reading checked checkpoints) pass; each save's pause says what the
#      checksums cost it;
#   2. full stage, asynchronous saves every 30 steps: the same of every checkpoint; the checksums are taken in the
#      writer process, so the trainer's logged pause per save is the copy to host alone (printed with the writer's
#      line: its write and checksum times);
#   3. half of the largest file of the latest checkpoint cut off, the worker started again: the file is named with the
#      size recorded and found, the checkpoint kept as iter_N.damaged, the one before used, and steps and
#      evaluations after it equal the uninterrupted run's bit for bit;
#   4. every checkpoint damaged (a byte flipped in the older one): exit 2 with the paragraph naming both, no file
#      deleted, moved or changed.
# Run from the repository root on the GPU machine, carrying .whl (Megatron-Core and mcx's pure dependencies,
# benchmarks/README.md), .te (Transformer Engine 2.20.2 as one sm_90 wheel and its dependencies,
# docs/gpu.md) and data/quickstart. About 5-6 minutes. Prints "CHECK <name>: PASS|FAIL ..." lines and
# "ALL PASS" last when every check passed. CKPT_CPU=1 PYTHON=.venv/bin/python OUT=DIR runs the same on CPU with a
# tiny local-spec model (the script's own check; asynchronous saves are GPU-only, so check 2's pauses are skipped).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
if [ "${CKPT_CPU:-0}" != 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/te .te/*.whl || exit 1
  export PYTHONPATH=/tmp/te:/tmp/site:$PWD:$PWD/benchmarks
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
else
  export PYTHONPATH=$PWD:$PWD/benchmarks
fi
mkdir -p "$OUT"
timeout 470 $PY - <<'PY'
import json, os, re, shutil, sys
from pathlib import Path

from gpu_validation import TINY_CPU, build_job, records, run_job
from mcx.train import checksums

CPU = os.environ.get("CKPT_CPU") == "1"
OUT, WORK = Path(os.environ["OUT"]), Path("/tmp/ckpt_integrity")
SPEC = "experiments/h200_1gpu.toml"
MODEL = ([*TINY_CPU, 'model.transformer_impl="local"'] if CPU else
         ["model.num_layers=2", 'model.transformer_impl="transformer_engine"'])
BASE = [*MODEL, "model.vocab_size=4096", "train.deterministic=true", "train.lr_warmup_iters=2", "train.eval_iters=2",
        "checkpoint.keep=2", "checkpoint.final=true"]
SMOKE = [*BASE, "train.train_iters=20", "train.eval_interval=10", "checkpoint.interval=10", "checkpoint.async_save=false"]
FULL = [*BASE, "train.train_iters=90", "train.eval_interval=30", "checkpoint.interval=30", "checkpoint.async_save=true"]
failed = []


def check(name, ok, detail):
    print(f"CHECK {name}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    if not ok:
        failed.append(name)


def log_lines(stage, *keys):
    text = (stage / "worker.log").read_text(errors="replace") if (stage / "worker.log").is_file() else ""
    return [line.split(": ", 1)[-1] for line in text.splitlines() if any(k in line for k in keys)]


def intact(stage):
    """Every committed checkpoint: (name, its checksums' problems or a missing file), and nothing left unlisted."""
    out = []
    for ck in sorted((stage / "checkpoints").glob("iter_???????")):
        listed = set(json.loads((ck / "checksums.json").read_text())["files"])
        on_disk = {p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file()} - {"checksums.json"}
        out.append((ck.name, checksums.verify(ck)[0] + [f"{n}: not listed" for n in sorted(on_disk - listed)]))
    return out


def curve(stage):
    return ([(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(stage)],
            [(r["kind"], r["step"], r["loss"]) for k in ("valid", "test") for r in records(stage, k)])


def biggest(ck):
    return max((p for p in ck.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)


def finish(stage, r, name, expected=0):
    shutil.copy(stage / "worker.log", OUT / f"{name}_worker.log")
    print(f"-- {name}: rc {r['rc']}, {r['wall_s']} s, status {r['status']}", flush=True)
    if r["rc"] != expected:
        print(r["log_tail"][-2500:])


shutil.rmtree(WORK, ignore_errors=True)
# 1. Smoke stage, synchronous saves.
smoke = WORK / "smoke"
r = run_job(smoke, build_job(smoke, SPEC, SMOKE, stage="smoke", cpu=CPU), ["0"], 200)
finish(smoke, r, "smoke")
found = intact(smoke)
check("sync_checksums", r["status"] == "finished" and len(found) == 2 and all(not p for _, p in found), found)
check("smoke_checks", r["status"] == "finished" and all(c["passed"] for c in r["checks"].values()),
      {k: c["detail"] for k, c in r["checks"].items()})
for line in log_lines(smoke, "paused training", "checksums:", "checked against"):
    print("  ", line)
shutil.rmtree(smoke / "checkpoints", ignore_errors=True)

# 2. Full stage, asynchronous saves: the uninterrupted run.
full = WORK / "full"
job = build_job(full, SPEC, FULL, stage="full", cpu=CPU)
r = run_job(full, job, ["0"], 200)
finish(full, r, "full")
found = intact(full)
check("async_checksums", r["status"] == "finished" and [n for n, _ in found] == ["iter_0000060", "iter_0000090"]
      and all(not p for _, p in found), found)
pauses = [(int(m[1]), float(m[2]), m[3]) for m in (re.match(r"checkpoint save (\d+) paused training ([\d.]+) s: (.*)", l)
          for l in log_lines(full, "paused training")) if m]
writes = {int(m[1]): (float(m[2]), float(m[3]), float(m[4])) for m in (re.search(
    r"checkpoint save (\d+) in the writer: waited ([\d.]+) s .* wrote it in ([\d.]+) s, checksums of .* in ([\d.]+) s", l)
    for l in log_lines(full, "in the writer")) if m}
finals = [float(m[1]) for m in (re.match(r"checkpoint save finalized: paused training ([\d.]+) s$", l)
                                for l in log_lines(full, "finalized")) if m]
for line in log_lines(full, "paused training", "in the writer", "finalized", "checksums:"):
    print("  ", line)
if not CPU:
    later = [(n, p, writes.get(n)) for n, p, _ in pauses if n > 1]  # save 1 may wait for the writer to start (D31)
    ok = (len(pauses) == 3 and len(writes) == 3 and all("copy to host" in ph and "checksums" not in ph for _, _, ph in pauses)
          and all(w is not None and p < min(1.0, w[2]) for _, p, w in later) and all(f < 0.1 for f in finals))
    check("async_pause", ok, "per save: trainer pause s / writer (waited, write, checksums) s: "
          + ", ".join(f"{n}: {p:.2f} / {writes.get(n)}" for n, p, _ in pauses)
          + f"; non-blocking finalizations {finals}")
reference = curve(full)

# 3. The latest checkpoint's largest file cut in half: the one before is used, the curve continues exactly.
victim = biggest(full / "checkpoints" / "iter_0000090")
size = victim.stat().st_size
with open(victim, "r+b") as f:
    f.truncate(size // 2)
r = run_job(full, job, ["0"], 200)
finish(full, r, "damaged")
result = json.loads((full / "result.json").read_text())
said = f"checkpoint iter_0000090 is damaged ({victim.name}: {size // 2} B, expected {size} B); kept as iter_0000090.damaged"
check("damage_named", r["status"] == "finished" and len(result["warnings"]) == 1 and result["warnings"][0].startswith(said)
      and "Resuming from iter_0000060" in result["warnings"][0]
      and any(said in l for l in log_lines(full, "WARNING mcx.train")), result["warnings"])
check("replay_bitwise", curve(full) == reference and len(reference[0]) == 90,
      f"{len(curve(full)[0])} steps, evaluations {curve(full)[1]}; first difference: "
      + str(next(((a, b) for a, b in zip(curve(full)[0], reference[0]) if a != b), None)))
kept = full / "checkpoints" / "iter_0000090.damaged" / victim.name
check("damaged_kept", kept.is_file() and kept.stat().st_size == size // 2 and all(not p for _, p in intact(full)),
      intact(full))
for line in log_lines(full, "checked against", "resumed from"):
    print("  ", line)

# 4. Every checkpoint damaged: exit 2, nothing deleted, moved or changed.
flip = biggest(full / "checkpoints" / "iter_0000060")
with open(flip, "r+b") as f:
    f.seek(flip.stat().st_size // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 1]))
cut = biggest(full / "checkpoints" / "iter_0000090")
with open(cut, "r+b") as f:
    f.truncate(cut.stat().st_size - 1)
ckpts = full / "checkpoints"
before = {p.relative_to(ckpts).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in ckpts.rglob("*")}
r = run_job(full, job, ["0"], 200)
finish(full, r, "all_damaged", expected=2)
result = json.loads((full / "result.json").read_text())
after = {p.relative_to(ckpts).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in ckpts.rglob("*")}
error = result.get("error") or ""
check("none_intact", r["rc"] == 2 and result["exit_code"] == 2 and "iter_0000090 (" in error and "iter_0000060 (" in error
      and "Nothing was deleted" in error and after == before, error)
print("ALL PASS" if not failed else f"FAILED: {', '.join(failed)}")
PY
echo "rc=$?"
