"""The training worker (mcx.train) against real Megatron-Core on CPU.

Tiny shapes (2 layers, hidden 64, sequence 64, BPE vocabulary 512) on a small indexed dataset built
with mcx.data from Megatron-Core's own source files, so each in-process stage takes seconds; the
tests that need a separate process (SIGTERM, SIGKILL, torchrun) pay one interpreter start each.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcx.spec.load import load_spec, spec_to_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
SMALL = [
    "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=2",
    "model.ffn_hidden_size=128", "model.seq_length=64", "model.max_position_embeddings=64",
    "train.micro_batch_size=4", "train.global_batch_size=8", "train.train_iters=20", "train.lr_warmup_iters=2",
    "train.eval_interval=10", "train.eval_iters=2", "checkpoint.interval=10", 'data.split="90,5,5"',
]
LONG = ["train.train_iters=60", "train.eval_interval=20", "checkpoint.interval=10"]  # resume tests


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Megatron-Core indexed dataset (BPE 512) from 40 of Megatron-Core's own source files."""
    import megatron.core

    from mcx.data.corpus import jsonl_corpus
    from mcx.data.prepare import prepare
    from mcx.spec.schema import TokenizerSpec

    base = tmp_path_factory.mktemp("train-data")
    sources = sorted((Path(megatron.core.__file__).parent / "transformer").rglob("*.py"))[:40]
    corpus = base / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n" for p in sources))
    prepare(jsonl_corpus([corpus]), TokenizerSpec(kind="bpe", vocab_size=512), base / "ds")
    return base / "ds"


def make_stage(stage_dir: Path, data_dir: Path, stage: str = "full", overrides: list[str] = (), *,
               checks: dict | None = None, world_size: int = 1) -> Path:
    """A stage directory with the job.json the control plane would write (tiny.toml + overrides)."""
    spec = load_spec(TINY, [*SMALL, *overrides])
    stage_dir.mkdir(parents=True, exist_ok=True)
    job = {
        "run_id": "t" * 12, "stage": stage, "spec": spec_to_dict(spec),
        "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": world_size, "world_size": world_size,
                   "sequence_parallel": False},
        "data_dir": str(data_dir), "checkpoint_dir": str(stage_dir / "checkpoints"), "train_samples_limit": None,
        "checks": {"resume_check_iters": 3, "loss_window": 5, "min_loss_drop": 0.0, **(checks or {})},
        "device": "cpu", "output": "quiet",
    }
    (stage_dir / "job.json").write_text(json.dumps(job, indent=1))
    return stage_dir


def run(stage_dir: Path) -> dict:
    from mcx.contract.status import WORKER_STATUSES, parse_status
    from mcx.train import train_stage

    result = train_stage(stage_dir)
    assert json.loads((stage_dir / "result.json").read_text()) == json.loads(json.dumps(result))
    assert parse_status(json.loads((stage_dir / "result.json").read_text())["status"]) in WORKER_STATUSES
    return result


def records(stage_dir: Path, kind: str = "train") -> list[dict]:
    lines = (stage_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def losses(stage_dir: Path) -> list[float]:
    return [r["loss"] for r in records(stage_dir)]


def worker(stage_dir: Path, *args: str, nproc: int = 1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if nproc == 1:
        cmd = [sys.executable, "-m", "mcx.train", str(stage_dir)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "mcx.train", str(stage_dir)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(stage_dir: Path, proc: subprocess.Popen, n: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    path = stage_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and sum('"train"' in line for line in path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, f"worker exited early: {proc.communicate()}"
        time.sleep(0.02)
    raise AssertionError(f"no {n} steps within {timeout}s")


# -- whole stages ----------------------------------------------------------------------------------

def test_smoke_stage_passes_every_check_on_a_dense_model(tmp_path, dataset):
    stage = make_stage(tmp_path / "smoke", dataset, "smoke")
    result = run(stage)
    assert result["status"] == "finished" and result["passed"] and result["exit_code"] == 0, result["error"]
    assert set(result["checks"]) == {"loss_finite", "loss_falling", "checkpoint_roundtrip", "resume_bitwise", "throughput"}
    assert result["out_of_memory"] is None
    assert all(c["passed"] for c in result["checks"].values())
    assert result["checks"]["resume_bitwise"]["steps"] == [18, 19, 20]
    assert result["layer_spec"] == "local" and result["details"]["core_attention"] == "torch_sdpa"
    assert result["details"]["cpu_patches"] == ["get_emb"]
    assert result["details"]["gradient_accumulation_fusion"] == "off" and result["details"]["cross_entropy_fusion"] is False
    # What was built is in the log as soon as it exists (benchmarks stop workers before result.json).
    line = next(l for l in (stage / "worker.log").read_text().splitlines() if "built: {" in l)
    built = json.loads(line[line.index("{"):])
    assert built.items() <= result["details"].items()
    assert result["versions"]["megatron-core"] == "0.19.2"
    train = records(stage)
    assert [r["step"] for r in train] == list(range(1, 21))
    assert train[0]["lr"] == 0.0 and train[2]["lr"] == pytest.approx(3e-3)  # Megatron's warmup from 0
    assert all(r["mfu"] is None and r["tokens_per_s_per_gpu"] > 0 and r["tflops_per_gpu"] > 0 for r in train)
    assert [(r["kind"], r["step"]) for r in records(stage, "valid") + records(stage, "test")] == \
        [("valid", 10), ("valid", 20), ("test", 20)]
    final = result["final"]
    assert final["valid_ppl"] == pytest.approx(math.exp(final["valid_loss"]))
    assert final["train_loss"] == pytest.approx(math.fsum(r["loss"] for r in train[-10:]) / 10, rel=1e-12)
    assert final["train_loss"] < train[0]["loss"]
    ckpts = stage / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "iter_0000020"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_0000017", "iter_0000020", "latest"]
    meta = json.loads((ckpts / "iter_0000020" / "meta.json").read_text())
    assert meta["step"] == 20 and meta["consumed_samples"] == 160 and meta["format"] == 2
    # Every file with its size and CRC-32, meta.json included; the ranks' part files merged away.
    sums = json.loads((ckpts / "iter_0000020" / "checksums.json").read_text())
    assert sums["algorithm"] == "crc32" and set(sums["files"]) == {"meta.json", "state.pt", "rng_rank0.pt"}
    assert sorted(p.name for p in (ckpts / "iter_0000020").iterdir()) == \
        ["checksums.json", "meta.json", "rng_rank0.pt", "state.pt"]
    assert sums["files"]["state.pt"]["size"] == (ckpts / "iter_0000020" / "state.pt").stat().st_size
    assert result["warnings"] == []
    # Started again (say the control plane died before reading the result): it resumes at the end,
    # reruns only the final evaluations, and the history is unchanged.
    before = (stage / "metrics.jsonl").read_text()
    again = run(stage)
    assert again["status"] == "finished" and again["passed"] and again["steps"] == 20
    assert (stage / "metrics.jsonl").read_text().splitlines()[:-2] == before.splitlines()[:-2]
    assert [(r["kind"], r["step"]) for r in records(stage, "valid") + records(stage, "test")] == \
        [("valid", 10), ("valid", 20), ("test", 20)]
    assert again["final"]["test_loss"] == final["test_loss"]


def test_moe_model_trains_and_records_what_ran(tmp_path, dataset):
    stage = make_stage(tmp_path / "moe", dataset, "full", ["model.num_experts=4", "model.moe_router_topk=2",
                                                           "model.moe_ffn_hidden_size=64"])
    result = run(stage)
    assert result["status"] == "finished", result["error"]
    values = losses(stage)
    assert sum(values[-5:]) / 5 < sum(values[:5]) / 5 - 0.3
    assert result["details"]["moe_token_dispatcher_type"] == "allgather"  # all-to-all needs CUDA streams
    assert result["details"]["cpu_patches"] == ["gating", "get_emb"]
    # The routing each step (mcx.train.routing): the busiest of 4 experts between balanced (1) and every token's
    # pick (4 / top-2), Megatron-Core's load-balancing loss near 1 (balanced); validation forwards are not counted.
    train = records(stage)
    assert all(1.0 <= r["moe_expert_load"] <= 2.0 and 0.9 < r["moe_balance_loss"] < 2.0 for r in train)
    assert len({r["moe_expert_load"] for r in train}) > 1 and "moe_expert_load" not in records(stage, "valid")[0]


def test_two_identical_runs_are_bitwise_identical(tmp_path, dataset):
    with_dropout = ["model.hidden_dropout=0.1", "model.attention_dropout=0.1"]
    a = make_stage(tmp_path / "a", dataset, "full", with_dropout)
    b = make_stage(tmp_path / "b", dataset, "full", with_dropout)
    assert run(a)["status"] == run(b)["status"] == "finished"
    strip = [{k: v for k, v in r.items() if k in ("step", "loss", "grad_norm", "lr")} for r in records(a)]
    assert strip == [{k: v for k, v in r.items() if k in ("step", "loss", "grad_norm", "lr")} for r in records(b)]
    assert [r["loss"] for r in records(a, "valid")] == [r["loss"] for r in records(b, "valid")]
    from mcx.metrics.batches import compare_batches, read_batches

    check = compare_batches(read_batches(a), read_batches(b))  # the same batches: nothing to report (D69)
    assert check is not None and check.same and check.steps == len(strip) and check.first is None


def test_a_batch_digest_is_over_the_exact_tensors_the_model_is_given():
    """Any token, the label, the mask or a dtype changes the digest; the same tensors give the same one."""
    import torch

    from mcx.train.batch_hash import batch_digest

    def mb(**change):
        tokens = torch.arange(64).view(1, 64) % 50
        return {"tokens": tokens, "labels": torch.roll(tokens, -1, 1), "loss_mask": torch.ones(1, 64),
                "position_ids": torch.arange(64).view(1, 64), "attention_mask": None, **change}

    base = batch_digest(mb())
    assert re.fullmatch(r"[0-9a-f]{16}", base) and batch_digest(mb()) == base
    flipped = mb()["tokens"].clone()
    flipped[0, 63] = 49
    others = [mb(tokens=flipped), mb(loss_mask=torch.ones(1, 64).index_fill(1, torch.tensor([0]), 0.0)),
              mb(labels=mb()["tokens"]), mb(position_ids=torch.arange(64, dtype=torch.int32).view(1, 64)),
              mb(attention_mask=torch.ones(1, 1, 64, 64, dtype=torch.bool))]
    assert len({base, *map(batch_digest, others)}) == 1 + len(others)


def test_smoke_fails_when_the_model_cannot_learn(tmp_path, dataset):
    stage = make_stage(tmp_path / "lr0", dataset, "smoke", ["train.lr=0.0", "train.min_lr=0.0"],
                       checks={"min_loss_drop": 0.05})
    result = run(stage)
    assert result["status"] == "failed" and not result["passed"] and result["exit_code"] == 1
    falling = result["checks"]["loss_falling"]
    assert not falling["passed"] and "not learning" in falling["detail"]
    assert "loss_falling" in result["error"]
    # Everything else about the stage still worked.
    assert result["checks"]["checkpoint_roundtrip"]["passed"] and result["checks"]["resume_bitwise"]["passed"]


def test_smoke_names_the_tensor_a_faulty_load_gets_wrong(tmp_path, dataset, monkeypatch):
    """A backend whose load does not restore what its save wrote (here: one weight nudged after the
    real load, in this test process only) fails the round trip, naming the tensor."""
    from mcx.train.cpu import CpuBackend

    real_load = CpuBackend.load

    def faulty_load(self, directory):
        real_load(self, directory)
        self.model.embedding.word_embeddings.weight.data.add_(1e-3)

    monkeypatch.setattr(CpuBackend, "load", faulty_load)
    result = run(make_stage(tmp_path / "faulty", dataset, "smoke"))
    assert result["status"] == "failed" and result["exit_code"] == 1
    roundtrip = result["checks"]["checkpoint_roundtrip"]
    assert not roundtrip["passed"]
    assert roundtrip["first_mismatch"] == "model/embedding.word_embeddings.weight"
    assert "model/embedding.word_embeddings.weight differs" in result["error"]


def test_smoke_names_the_file_of_a_checkpoint_damaged_after_its_save(tmp_path, dataset, monkeypatch):
    """The final checkpoint's state.pt cut short on disk after its commit (in this test process): the
    round trip does not load it, it names the file with the size recorded and the size found."""
    from mcx.train.checkpoint import CheckpointStore

    real_commit = CheckpointStore.commit

    def commit_then_truncate(self, tmp, meta, pinned=frozenset()):
        final = real_commit(self, tmp, meta, pinned)
        if meta["step"] == 20:
            with open(final / "state.pt", "r+b") as f:
                f.truncate(1000)
        return final

    monkeypatch.setattr(CheckpointStore, "commit", commit_then_truncate)
    result = run(make_stage(tmp_path / "damaged", dataset, "smoke"))
    assert result["status"] == "failed" and result["exit_code"] == 1
    roundtrip = result["checks"]["checkpoint_roundtrip"]
    assert not roundtrip["passed"] and len(roundtrip["damaged"]) == 1
    assert re.fullmatch(r"state\.pt: 1000 B, expected \d+ B", roundtrip["damaged"][0]), roundtrip
    assert "checkpoint iter_0000020 is damaged: state.pt: 1000 B, expected" in result["error"]
    assert result["checks"]["resume_bitwise"]["passed"]  # the pinned checkpoint of step 17 is intact
    assert (tmp_path / "damaged" / "checkpoints" / "iter_0000020" / "state.pt").stat().st_size == 1000  # left alone


def test_divergence_guard_stops_an_absurd_learning_rate(tmp_path, dataset):
    stage = make_stage(tmp_path / "diverge", dataset, "full", ["train.lr=1000.0", "checkpoint.interval=1"])
    result = run(stage)
    assert result["status"] == "diverged" and result["exit_code"] == 1 and not result["passed"]
    assert result["error"].startswith("Training diverged:") and "lower train.lr" in result["error"]
    step = result["steps"]
    assert step < 20
    # The checkpoints end at the last good step; nothing from the diverged step was saved.
    latest = (stage / "checkpoints" / "latest").read_text().strip()
    assert latest == f"iter_{step - 1:07d}"
    assert records(stage)[-1]["step"] == step


# -- resume ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, dataset) -> Path:
    stage = make_stage(tmp_path_factory.mktemp("ref") / "stage", dataset, "full", LONG)
    assert run(stage)["status"] == "finished"
    return stage


def _same_history(stage: Path, reference: Path) -> None:
    keep = ("step", "loss", "grad_norm", "lr")
    assert [{k: r[k] for k in keep} for r in records(stage)] == [{k: r[k] for k in keep} for r in records(reference)]
    for kind in ("valid", "test"):
        assert [(r["step"], r["loss"]) for r in records(stage, kind)] == [(r["step"], r["loss"]) for r in records(reference, kind)]
    # The same batches in the same order, each step's hashes once: a resumed worker cut its batch-hash file
    # back to the checkpoint's step, as metrics.jsonl (D69).
    hashes, want = (batch_hashes(s) for s in (stage, reference))
    assert hashes == want and [s for s, _ in hashes] == list(range(1, len(want) + 1)), (hashes, want)


def batch_hashes(stage: Path, dp_rank: int = 0) -> list[tuple[int, list[str]]]:
    path = stage / "ranks" / f"batches.dp{dp_rank}.jsonl"
    return [(r["step"], r["batches"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_resumed_run_matches_an_uninterrupted_one(tmp_path, dataset, uninterrupted):
    stage = make_stage(tmp_path / "term", dataset, "full", LONG)
    proc = worker(stage)
    wait_for_steps(stage, proc, 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((stage / "result.json").read_text())
    assert result["status"] == "preempted" and result["details"]["stop_signal"] == signal.SIGTERM
    stopped = result["steps"]
    assert 5 <= stopped < 60
    assert (stage / "checkpoints" / "latest").read_text().strip() == f"iter_{stopped:07d}"
    assert run(stage)["status"] == "finished"
    _same_history(stage, uninterrupted)


@pytest.mark.slow
def test_a_killed_worker_resumes_from_latest_and_matches_an_uninterrupted_run(tmp_path, dataset, uninterrupted):
    stage = make_stage(tmp_path / "kill", dataset, "full", LONG)
    proc = worker(stage)
    wait_for_steps(stage, proc, 25)
    proc.kill()
    proc.communicate(timeout=60)
    latest = int((stage / "checkpoints" / "latest").read_text().strip()[len("iter_"):])
    assert latest % 10 == 0 and latest >= 20
    assert len(records(stage)) > latest or not (stage / "result.json").exists()
    result = run(stage)
    assert result["status"] == "finished" and result["steps"] == 60
    _same_history(stage, uninterrupted)  # lines past the checkpoint were cut and replayed


# -- damaged checkpoints ------------------------------------------------------------------------------

def copy_stage(src: Path, dst: Path) -> Path:
    """A copy of a stage directory (its checkpoints, metrics and results; not its log), its job.json
    pointing at its own checkpoints."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("worker.log"))
    job = json.loads((dst / "job.json").read_text())
    job["checkpoint_dir"] = str(dst / "checkpoints")
    (dst / "job.json").write_text(json.dumps(job, indent=1))
    return dst


def truncate(path: Path) -> tuple[int, int]:
    """Cut ``path`` to half its size; (size before, size after)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return size, size // 2


def flip_byte(path: Path) -> None:
    """Flip one bit in the middle of ``path``: same size, other content."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(data)


def tensors(obj):
    """The tensors in a nested state dict, in order."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors(value)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_truncated_latest_checkpoint_is_set_aside_and_the_one_before_replays_the_same_curve(
        tmp_path, uninterrupted):
    """The issue's failure: the latest checkpoint's state.pt cut short (resume used to fail with
    "OSError: [Errno 22] Invalid argument" naming no file, on every rerun). Now the worker names the
    file, the size recorded and the size found, keeps the damaged checkpoint aside, resumes from the
    one before and trains the steps after it again: the curve is the uninterrupted one, each step once."""
    from mcx.weights import checksums

    stage = copy_stage(uninterrupted, tmp_path / "stage")
    ckpts = stage / "checkpoints"
    size, cut = truncate(ckpts / "iter_0000060" / "state.pt")
    result = run(stage)
    assert result["status"] == "finished" and result["exit_code"] == 0, result["error"]
    warning = (f"checkpoint iter_0000060 is damaged (state.pt: {cut} B, expected {size} B); kept as "
               "iter_0000060.damaged. Resuming from iter_0000050, the newest intact checkpoint: the steps after 50 "
               "are trained again")
    assert result["warnings"] == [warning]
    log = (stage / "worker.log").read_text()
    assert f"WARNING mcx.train: {warning}" in log and "resumed from iter_0000050" in log
    _same_history(stage, uninterrupted)  # steps 51-60 and the final evaluations ran again, each recorded once
    assert [r["step"] for r in records(stage)] == list(range(1, 61))
    # The damaged checkpoint is kept as it was; `latest` names a new, intact step 60.
    assert (ckpts / "iter_0000060.damaged" / "state.pt").stat().st_size == cut
    assert (ckpts / "latest").read_text().strip() == "iter_0000060"
    assert checksums.verify(ckpts / "iter_0000060")[0] == []
    assert run(stage)["warnings"] == []  # and the next start finds nothing wrong


def test_latest_naming_a_deleted_checkpoint_resumes_from_the_newest_intact_one(tmp_path, uninterrupted):
    """The issue's report: the newest checkpoint directory deleted while `latest` still named it stopped
    the stage with exit 2 and advised deleting `latest`, which trained again from step 1 and threw the
    intact checkpoints away. Now the resume passes over it as over a damaged one: it resumes from the
    newest intact checkpoint, metrics.jsonl keeps steps 1-50 as they were and continues from step 50, the
    curve is the uninterrupted one, and every checkpoint that was there is still there."""
    stage = copy_stage(uninterrupted, tmp_path / "stage")
    ckpts = stage / "checkpoints"
    shutil.rmtree(ckpts / "iter_0000060")
    assert (ckpts / "latest").read_text().strip() == "iter_0000060"
    there = {p.name: snapshot(p) for p in ckpts.glob("iter_*")}
    first = records(stage)
    result = run(stage)
    assert result["status"] == "finished" and result["exit_code"] == 0, result["error"]
    warning = ("checkpoint iter_0000060, which `latest` named, is missing. Resuming from iter_0000050, the newest "
               "intact checkpoint: the steps after 50 are trained again")
    assert result["warnings"] == [warning]
    log = (stage / "worker.log").read_text()
    assert f"WARNING mcx.train: {warning}" in log and "resumed from iter_0000050" in log
    assert records(stage)[:50] == first[:50]  # not trained again: the very lines, their times included
    assert [r["step"] for r in records(stage)] == list(range(1, 61))
    _same_history(stage, uninterrupted)
    assert all(snapshot(ckpts / name) == files for name, files in there.items()), "an intact checkpoint changed"
    assert (ckpts / "latest").read_text().strip() == "iter_0000060" and run(stage)["warnings"] == []


def test_a_flipped_byte_is_found_by_its_checksum(tmp_path, uninterrupted):
    """One bit flipped inside a tensor of state.pt: the size is right and torch.load reads the file
    without complaint (the weight is silently wrong); the CRC-32 does not match, so the checkpoint is
    set aside and the one before it used."""
    import torch

    stage = copy_stage(uninterrupted, tmp_path / "stage")
    state = stage / "checkpoints" / "iter_0000060" / "state.pt"
    before = torch.load(state, weights_only=True)
    flip_byte(state)
    after = torch.load(state, weights_only=True)  # loads: only the checksum tells
    assert any(not torch.equal(a, b) for a, b in zip(tensors(before), tensors(after), strict=True))
    result = run(stage)
    assert result["status"] == "finished", result["error"]
    (warning,) = result["warnings"]
    size = (stage / "checkpoints" / "iter_0000060.damaged" / "state.pt").stat().st_size
    assert re.match(rf"checkpoint iter_0000060 is damaged \(state\.pt: crc32 [0-9a-f]{{8}}, expected [0-9a-f]{{8}} "
                    rf"at the recorded size of {size} B\); kept as iter_0000060\.damaged\. Resuming from iter_0000050", warning)
    _same_history(stage, uninterrupted)


def test_no_intact_checkpoint_is_an_input_error_that_names_them_and_deletes_nothing(tmp_path, uninterrupted):
    """Every checkpoint damaged (the latest cut short, the one before with a flipped byte): exit 2, one
    paragraph naming each checkpoint with its file, what was recorded and what was found, and the fix;
    nothing deleted or moved, metrics.jsonl untouched."""
    stage = copy_stage(uninterrupted, tmp_path / "stage")
    ckpts = stage / "checkpoints"
    size, cut = truncate(ckpts / "iter_0000060" / "state.pt")
    flip_byte(ckpts / "iter_0000050" / "rng_rank0.pt")
    (ckpts / "iter_0000060.dvc").write_text("outs:\n- md5: 0123456789abcdef0123456789abcdef.dir\n")  # recorded in DVC
    before, metrics = snapshot(ckpts), (stage / "metrics.jsonl").read_bytes()
    result = run(stage)
    assert result["status"] == "failed" and result["exit_code"] == 2 and not result["passed"]
    error = result["error"]
    assert error.startswith(f"no intact checkpoint to resume from in {ckpts}: iter_0000060 (state.pt: {cut} B, "
                            f"expected {size} B); iter_0000050 (rng_rank0.pt: crc32 "), error
    assert "Nothing was deleted; " in error and f"move the directory aside (`mv {ckpts} {ckpts}.old`)" in error
    assert "delete" not in error.split("Nothing was deleted; ")[1]  # no advice that throws a checkpoint away
    assert f"restore iter_0000060 from DVC, which recorded it (`dvc pull --force {ckpts / 'iter_0000060.dvc'}`" in error
    assert "\n" not in error  # one paragraph
    assert snapshot(ckpts) == before and (stage / "metrics.jsonl").read_bytes() == metrics
    assert f"ERROR mcx.train: {error}" in (stage / "worker.log").read_text()


def test_a_checkpoint_without_checksums_still_loads_with_a_warning(tmp_path, uninterrupted):
    """A checkpoint written before checkpoints carried checksums (format 1, no checksums.json) is
    resumed from as before, with a warning saying its files were not checked."""
    stage = copy_stage(uninterrupted, tmp_path / "stage")
    ckpt = stage / "checkpoints" / "iter_0000060"
    (ckpt / "checksums.json").unlink()
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    result = run(stage)
    assert result["status"] == "finished", result["error"]
    assert result["warnings"] == ["checkpoint iter_0000060 has no checksums (written before mcx recorded them, D36): "
                                  "loaded without checking its files"]
    assert "resumed from iter_0000060" in (stage / "worker.log").read_text()
    _same_history(stage, uninterrupted)
    # Without checksums but of the new format, it is damaged: a lost checksums.json is not an old checkpoint.
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert run(stage)["warnings"][0].startswith("checkpoint iter_0000060 is damaged (checksums.json: missing)")


def test_moe_routing_of_every_token_to_every_expert_is_balanced(tmp_path, dataset):
    """Top-4 of 4 experts: each expert gets every token, so the load is 1 exactly and Megatron-Core's
    load-balancing loss (tokens x probability per expert, scaled by E / (topk x tokens^2)) is 1 whatever the
    router's probabilities; no auxiliary loss in the spec: no balance loss recorded."""
    every = ["model.num_experts=4", "model.moe_router_topk=4", "model.moe_ffn_hidden_size=64", "train.train_iters=2", "train.lr_warmup_iters=1",
             "train.eval_interval=2", "checkpoint.interval=0", "checkpoint.final=false"]
    stage = make_stage(tmp_path / "all", dataset, "full", every)
    assert run(stage)["status"] == "finished"
    assert [(r["moe_expert_load"], round(r["moe_balance_loss"], 6)) for r in records(stage)] == [(1.0, 1.0)] * 2
    # A deeper model next in the same process: Megatron-Core's process-wide tracker starts afresh at its length.
    stage = make_stage(tmp_path / "deeper", dataset, "full", [*every, "model.num_layers=3"])
    assert run(stage)["status"] == "finished"
    assert [(r["moe_expert_load"], round(r["moe_balance_loss"], 6)) for r in records(stage)] == [(1.0, 1.0)] * 2
    stage = make_stage(tmp_path / "none", dataset, "full", [*every, 'model.moe_router_load_balancing_type="none"'])
    assert run(stage)["status"] == "finished"
    assert [("moe_balance_loss" in r, r["moe_expert_load"]) for r in records(stage)] == [(False, 1.0)] * 2


@pytest.mark.slow
def test_moe_routing_is_the_global_batch_s_under_data_parallel(tmp_path, dataset):
    """Two data-parallel ranks route one micro-batch each; reduced, they give one process's two micro-batches:
    the same tokens per expert (counts: exact at step 1, same weights) and the same load-balancing loss."""
    moe = ["model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64", "train.train_iters=3",
           "train.eval_interval=3", "checkpoint.interval=0", "checkpoint.final=false"]
    single = make_stage(tmp_path / "one", dataset, "full", moe)
    assert run(single)["status"] == "finished"
    stage = make_stage(tmp_path / "dp2", dataset, "full", moe, world_size=2)
    proc = worker(stage, nproc=2)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    one, two = records(single), records(stage)
    assert two[0]["moe_expert_load"] == one[0]["moe_expert_load"] != 1.0
    for a, b in zip(one, two):
        assert b["moe_balance_loss"] == pytest.approx(a["moe_balance_loss"], rel=1e-5)


@pytest.mark.slow
def test_torchrun_data_parallel_over_gloo_matches_one_process(tmp_path, dataset):
    single = make_stage(tmp_path / "one", dataset, "full")
    assert run(single)["status"] == "finished"
    stage = make_stage(tmp_path / "dp2", dataset, "full", world_size=2)
    proc = worker(stage, nproc=2)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((stage / "result.json").read_text())
    assert result["status"] == "finished" and result["details"]["world_size"] == 2
    assert result["details"]["num_microbatches"] == 1
    # Same global batches, gradients averaged over ranks instead of accumulated: equal up to rounding.
    assert losses(stage) == pytest.approx(losses(single), rel=2e-4)
    # Each rank recorded the checksums of its own files; at a resume each checks its share (rank 1 reads
    # state.pt, the second half of the sorted names) and all agree the checkpoint is damaged.
    ckpts = stage / "checkpoints"
    assert set(json.loads((ckpts / "iter_0000020" / "checksums.json").read_text())["files"]) == \
        {"meta.json", "state.pt", "rng_rank0.pt", "rng_rank1.pt"}
    first = records(stage)
    size, cut = truncate(ckpts / "iter_0000020" / "state.pt")
    proc = worker(stage, nproc=2)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((stage / "result.json").read_text())
    assert result["status"] == "finished" and result["warnings"] == [
        f"checkpoint iter_0000020 is damaged (state.pt: {cut} B, expected {size} B); kept as iter_0000020.damaged. "
        "Resuming from iter_0000010, the newest intact checkpoint: the steps after 10 are trained again"]
    keep = ("step", "loss", "grad_norm", "lr")
    assert [{k: r[k] for k in keep} for r in records(stage)] == [{k: r[k] for k in keep} for r in first]


# -- profiling -----------------------------------------------------------------------------------------

def test_profiled_steps_train_bitwise_the_same_and_leave_a_trace_and_an_op_table(tmp_path, uninterrupted):
    """`mcx run --profile 52:53` (D73): the job's profile puts steps 52 and 53 under torch.profiler. Resumed
    from step 50 of the unprofiled run, steps 51-60 (two of them profiled) and the evaluations are bitwise
    the unprofiled run's; the trace holds exactly the named steps, and the op table ranks host ops."""
    import gzip

    stage = copy_stage(uninterrupted, tmp_path / "stage")
    shutil.rmtree(stage / "checkpoints" / "iter_0000060")
    (stage / "checkpoints" / "latest").write_text("iter_0000050\n")
    job = json.loads((stage / "job.json").read_text())
    (stage / "job.json").write_text(json.dumps({**job, "profile": {"first": 52, "last": 53}}, indent=1))
    result = run(stage)
    assert result["status"] == "finished" and result["warnings"] == [], result["error"]
    _same_history(stage, uninterrupted)
    trace = json.loads(gzip.decompress((stage / "profile" / "trace-rank0.json.gz").read_bytes()))
    steps = sorted(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("mcx.step "))
    assert steps == ["mcx.step 52", "mcx.step 53"]
    assert any(str(e.get("name", "")).startswith("aten::mm") for e in trace["traceEvents"])
    table = (stage / "profile" / "ops-rank0.txt").read_text()
    assert table.startswith("# run tttttttttttt, full stage, rank 0, cpu: steps 52-53 (2 profiled,")
    assert "Self CPU %" in table and "aten::" in table
    assert sorted(p.name for p in (stage / "profile").iterdir()) == ["ops-rank0.txt", "trace-rank0.json.gz"]
    # Resumed past the range (here: at its last step, so only the final evaluations run), nothing is
    # profiled, and the stage says so instead of leaving the user to look for a profile.
    shutil.rmtree(stage / "profile")
    result = run(stage)
    assert result["status"] == "finished" and not (stage / "profile").exists()
    assert result["warnings"] == ["--profile 52:53: no step was profiled, as this attempt of the stage trained none "
                                  "of them (it resumed from a checkpoint past them); `mcx run --force` trains the run "
                                  "again from step 1"]


# -- input errors ------------------------------------------------------------------------------------

def test_a_bad_job_file_is_an_input_error_naming_the_key(tmp_path, dataset):
    stage = make_stage(tmp_path / "bad", dataset)
    job = json.loads((stage / "job.json").read_text())
    job["layout"]["tensr"] = 2
    (stage / "job.json").write_text(json.dumps(job))
    result = run(stage)
    assert result["status"] == "failed" and result["exit_code"] == 2
    assert "layout.tensr: unknown key" in result["error"]


def test_an_output_fault_at_a_module_the_model_lacks_stops_before_the_first_step(tmp_path, dataset):
    """debug.perturb_output names a module path; one the model does not have (or a micro-batch a step does not
    have) is an input error listing what it has, before any step trains (D70)."""
    stage = make_stage(tmp_path / "nomod", dataset, "full",
                       ['debug.perturb_output={step=4, module="decoder.layers.7.mlp.linear_fc2"}'])
    result = run(stage)
    assert result["exit_code"] == 2 and result["status"] == "failed" and result["steps"] == 0
    assert "'decoder.layers.7.mlp.linear_fc2' is not a module of this model" in result["error"]
    assert "decoder.layers.1.mlp.linear_fc2" in result["error"] and not (stage / "metrics.jsonl").exists()
    stage = make_stage(tmp_path / "nomb", dataset, "full",
                       ['debug.perturb_output={step=4, micro_batch=2, module="decoder.layers.1.mlp.linear_fc2"}'])
    assert "has 2 micro-batch(es)" in run(stage)["error"]


def test_cpu_rejects_gpu_only_settings_by_key(tmp_path, dataset):
    stage = make_stage(tmp_path / "bf16", dataset, "full", ["train.precision=\"bf16\"",
                                                            "train.recompute_granularity=\"full\""])
    result = run(stage)
    assert result["exit_code"] == 2 and result["status"] == "failed"
    assert "train.precision" in result["error"] and "train.recompute_granularity" in result["error"]


def test_command_line_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mcx.train"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: python -m mcx.train STAGE_DIR" in proc.stderr


# -- pieces --------------------------------------------------------------------------------------------

def test_sdpa_core_attention_matches_the_softmax_reference():
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mcx.train.attention import SDPAttention

    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=8, num_query_groups=2,
                                attention_dropout=0.5, use_cpu_initialization=True)
        attn = SDPAttention(cfg, 1, AttnMaskType.causal, "self")
        s, b, heads, groups, hn = 16, 3, 8, 2, 8
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(s, b, n, hn, generator=gen) for n in (heads, groups, groups))
        assert not torch.equal(attn(q, k, v, None), attn(q, k, v, None))  # training: dropout on the probabilities
        out = attn.eval()(q, k, v, None)
        # Reference: repeat each key/value group for its heads, masked softmax(q k^T / sqrt(d)) v.
        kr, vr = (x.repeat_interleave(heads // groups, dim=2) for x in (k, v))
        scores = torch.einsum("sbnd,tbnd->bnst", q, kr) / math.sqrt(hn)
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
        ref = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), vr).reshape(s, b, heads * hn)
        assert out.shape == (s, b, heads * hn)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    finally:
        parallel_state.destroy_model_parallel()
        if owns:
            dist.destroy_process_group()


def test_checkpoint_store_commits_atomically_and_keeps_the_newest(tmp_path):
    from mcx.errors import InputError
    from mcx.train.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path / "ck", keep=2)
    assert store.latest() is None
    for step in (10, 20, 30):
        tmp = store.begin(step)
        (tmp / "state.pt").write_bytes(b"x")
        assert store.latest() is None or store.latest().name != f"iter_{step:07d}"  # not visible before commit
        store.commit(tmp, {"step": step, "consumed_samples": step * 8}, pinned={10})
    assert store.steps() == [10, 20, 30] and store.latest().name == "iter_0000030"  # 10 is pinned
    assert store.prune() == [10] and store.steps() == [20, 30]  # renamed out of the store at once
    store.settle()  # the background deletion is over
    assert not (store.root / "iter_0000010.retired").exists()
    store.begin(40)  # a save that never finished
    (store.root / "iter_0000005.retired").mkdir()  # a deletion a crash cut short
    store.clean_partial()
    assert sorted(p.name for p in store.root.iterdir()) == ["iter_0000020", "iter_0000030", "latest"]
    assert store.read_meta(store.latest())["consumed_samples"] == 240
    (store.root / "latest").write_text("iter_0000099\n")  # gone: named, and check() says so (the resume falls back)
    assert store.latest() == store.root / "iter_0000099" and store.check(store.latest()) == ["the directory is missing"]
    assert [p.name for p in store.candidates(store.latest())] == ["iter_0000099", "iter_0000030", "iter_0000020"]
    (store.root / "latest").write_text("iter_0000020 \n")
    assert store.latest().name == "iter_0000020"
    (store.root / "latest").write_text("checkpoint-30\n")  # not a checkpoint's name: said, with the newest one
    with pytest.raises(InputError, match=r"names 'checkpoint-30', which is not a checkpoint \(iter_NNNNNNN\);") as info:
        store.latest()
    assert f"`echo iter_0000030 > {store.root / 'latest'}`" in info.value.hint


def test_checksums_record_seal_and_name_what_changed(tmp_path):
    """Each rank's part file, merged at the commit with what no rank recorded; then every kind of damage
    named with the file, what was recorded and what is there, by whichever rank checks that file."""
    import zlib

    from mcx.weights import checksums

    d = tmp_path / "iter_0000010.tmp"
    d.mkdir()
    big = os.urandom((9 << 20) + 5)  # more than one read
    (d / "__0_0.distcp").write_bytes(big)
    (d / "__1_0.distcp").write_bytes(b"rank one's shard")
    (d / "meta.json").write_text("{}")  # written by rank 0 at the commit, recorded by no rank
    assert checksums.record(d, 0, [d / "__0_0.distcp"])["bytes"] == len(big)
    assert checksums.record(d, 1, [str(d / "__1_0.distcp")])["files"] == 1
    assert {"checksums.rank0.json", "checksums.rank1.json"} <= set(os.listdir(d))
    sealed = checksums.seal(d)
    assert (sealed["files"], sealed["hashed"], sealed["hashed_bytes"]) == (3, 1, 2)
    assert sorted(os.listdir(d)) == ["__0_0.distcp", "__1_0.distcp", "checksums.json", "meta.json"]
    files = json.loads((d / "checksums.json").read_text())["files"]
    assert files["__0_0.distcp"] == {"size": len(big), "crc32": f"{zlib.crc32(big):08x}"}
    total = len(big) + 16 + 2
    assert checksums.verify(d) == ([], total)
    shares = [checksums.verify(d, rank, 2) for rank in (0, 1)]  # two ranks, each its half
    assert [s[0] for s in shares] == [[], []] and sum(s[1] for s in shares) == total

    with open(d / "__1_0.distcp", "r+b") as f:
        f.truncate(7)
    flip_byte(d / "__0_0.distcp")
    (d / "meta.json").unlink()
    expected = [f"__0_0.distcp: crc32 {zlib.crc32(bytearray((d / '__0_0.distcp').read_bytes())):08x}, expected "
                f"{zlib.crc32(big):08x} at the recorded size of {len(big)} B", "__1_0.distcp: 7 B, expected 16 B",
                "meta.json: missing, expected 2 B"]
    assert checksums.verify(d)[0] == expected
    assert sorted(checksums.verify(d, 0, 2)[0] + checksums.verify(d, 1, 2)[0]) == expected
    (d / "checksums.json").write_text('{"algorithm": "crc32", "files": {"x": {"size": 1')
    assert checksums.verify(d)[0][0].startswith("checksums.json: unreadable (JSONDecodeError: ")


def test_damaged_checkpoints_are_set_aside_and_old_ones_are_told_apart(tmp_path):
    """The store's side of a damaged checkpoint: where a resume may start, newest first; a checkpoint of
    format 1 (no checksums) against one that lost them; set aside under a free name, never deleted."""
    from mcx.train.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path / "ck", keep=3)
    for step in (10, 20, 30):
        tmp = store.begin(step)
        (tmp / "state.pt").write_bytes(b"x" * step)
        store.commit(tmp, {"step": step, "consumed_samples": step * 8})
    latest = store.latest()
    assert [p.name for p in store.candidates(latest)] == ["iter_0000030", "iter_0000020", "iter_0000010"]
    assert [p.name for p in store.candidates(store.path(20))] == ["iter_0000020", "iter_0000010"]
    assert store.check(latest) == [] and store.check(latest, 1, 2) == []
    (latest / "checksums.json").unlink()
    assert store.check(latest) == ["checksums.json: missing"]
    meta = json.loads((latest / "meta.json").read_text())
    (latest / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    assert store.check(latest) is None and store.read_meta(latest)["step"] == 30  # before checksums: unchecked
    assert store.set_aside(latest).name == "iter_0000030.damaged"
    (store.root / "iter_0000030").mkdir()
    assert store.set_aside(store.root / "iter_0000030").name == "iter_0000030.damaged.2"
    # A resume stopped between setting a damaged checkpoint aside and pointing `latest` past it: `latest`
    # names a missing checkpoint, and the next start passes over it to the ones before (checking each in turn).
    assert (store.root / "latest").read_text() == "iter_0000030\n" and store.latest().name == "iter_0000030"
    assert store.check(store.latest()) == ["the directory is missing"]
    assert [p.name for p in store.candidates(store.latest())] == ["iter_0000030", "iter_0000020", "iter_0000010"]
    store.point("iter_0000020")
    store.clean_partial()
    assert store.steps() == [10, 20] and store.latest().name == "iter_0000020"
    assert sorted(p.name for p in store.root.iterdir()) == [
        "iter_0000010", "iter_0000020", "iter_0000030.damaged", "iter_0000030.damaged.2", "latest"]


def test_metrics_truncation_keeps_the_surviving_timeline(tmp_path):
    from mcx.train.metrics import MetricsFile

    m = MetricsFile(tmp_path / "metrics.jsonl", enabled=True)
    for step in (1, 2, 3):
        m.append({"kind": "train", "step": step, "loss": 1.0 / step})
    m.append({"kind": "valid", "step": 3, "loss": float("nan")})
    m.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # torn line from a crash
    assert [r["loss"] for r in m.history("valid")] == [None]  # NaN is written as null
    m.truncate_after(3, final=True)
    assert [(r["kind"], r["step"]) for r in m.history("train") + m.history("valid")] == [("train", 1), ("train", 2), ("train", 3)]
    m.truncate_after(2, final=False)
    assert [r["step"] for r in m.history("train")] == [1, 2]


def test_divergence_guard_rules():
    from mcx.train.guard import DivergenceGuard, advice

    guard = DivergenceGuard(factor=3.0, window=3, history=[5.0, None, 4.0])
    assert guard.check(3, 4.5, 1.0) is None
    assert guard.check(4, 4.4, None, skipped=True) is None  # fp16 skipped update: loss only
    assert "spiked" in guard.check(5, 20.0, 1.0)
    assert "is nan" in guard.check(6, float("nan"), 1.0)
    assert "gradient norm is inf" in guard.check(7, 4.0, float("inf"))
    spec = load_spec(TINY, ["train.clip_grad=0.0", "model.hidden_dropout=0.1"])
    text = advice(spec)
    assert "lower train.lr" in text and "train.clip_grad" in text and "dropout" in text


def test_vocabulary_padding_and_layer_spec_choice():
    from mcx.errors import SpecError
    from mcx.plan.layout import Layout
    from mcx.train.model import choose_layer_spec, padded_vocab_size

    assert padded_vocab_size(50257, 128, 1) == 50304 and padded_vocab_size(50257, 128, 8) == 51200
    assert padded_vocab_size(512, 128, 1) == 512
    spec = load_spec(TINY)
    assert choose_layer_spec(spec, Layout(), "cpu") == "local"
    fp8 = load_spec(TINY, ['train.precision="fp8-hybrid"'])
    with pytest.raises(SpecError, match="train.precision"):
        choose_layer_spec(fp8, Layout(), "cuda")  # no Transformer Engine here
    fused = load_spec(TINY, ["train.te_op_fuser=true"])  # Transformer Engine's fused MLP, asked for where TE is not
    with pytest.raises(SpecError, match="train.te_op_fuser") as exc:
        choose_layer_spec(fused, Layout(), "cpu")
    assert [key for key, _ in exc.value.problems] == ["train.te_op_fuser"]



def test_fusions_follow_the_spec_the_device_and_the_precision():
    from mcx.plan.layout import Layout
    from mcx.train.model import cross_entropy_fusion, describe, transformer_config

    fast = ["train.deterministic=false"]  # tiny.toml is deterministic and fp32
    bf16 = load_spec(TINY, [*fast, 'train.precision="bf16"'])
    assert cross_entropy_fusion(bf16, "cuda") and not cross_entropy_fusion(bf16, "cpu")
    assert cross_entropy_fusion(load_spec(TINY, [*fast, 'train.precision="fp8-hybrid"']), "cuda")
    assert not cross_entropy_fusion(load_spec(TINY, ['train.precision="bf16"']), "cuda")  # deterministic
    assert not cross_entropy_fusion(load_spec(TINY, [*fast, 'train.precision="bf16"', "train.cross_entropy_fusion=false"]), "cuda")
    for precision in ("fp16", "fp32"):  # Megatron's fused backward casts the gradient to bf16
        assert not cross_entropy_fusion(load_spec(TINY, [*fast, f'train.precision="{precision}"']), "cuda")
    config = transformer_config(load_spec(TINY), Layout(), "cpu", "local")
    assert not config.gradient_accumulation_fusion and not config.cross_entropy_loss_fusion
    assert config.cross_entropy_fusion_impl == "native"
    details = describe(config, "local", 512)
    assert details["gradient_accumulation_fusion"] == "off" and details["cross_entropy_fusion"] is False
    assert not config.apply_rope_fusion and details["rope_fusion"] == "off"  # TE's kernel only


def test_rope_fusion_compiles_mcore_rope_on_the_local_spec_and_keeps_its_values(monkeypatch):
    """train.rope_fusion on the local spec: MCore's own RoPE, torch.compile'd (here by inductor on
    CPU), gives MCore's values; the Transformer Engine spec and rope_fusion = false leave it alone."""
    import torch
    from megatron.core.models.common.embeddings import rope_utils

    from mcx.train import model

    eager = rope_utils._apply_rotary_pos_emb_bshd
    monkeypatch.setattr(rope_utils, "_apply_rotary_pos_emb_bshd", eager)  # restored after the test
    monkeypatch.setattr(model, "_ROPE_COMPILED", False)
    spec = load_spec(TINY)
    assert not model.compiled_rope(spec, "transformer_engine")
    assert not model.compiled_rope(load_spec(TINY, ["train.rope_fusion=false"]), "local")
    assert rope_utils._apply_rotary_pos_emb_bshd is eager
    assert model.compiled_rope(spec, "local") and model.compiled_rope(spec, "local")  # once per process
    compiled = rope_utils._apply_rotary_pos_emb_bshd
    assert compiled is not eager
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(16, 2, 4, 8, generator=gen, requires_grad=True)
    freqs = torch.randn(16, 1, 1, 8, generator=gen)
    want = eager(t, freqs)
    got = compiled(t, freqs)
    assert torch.allclose(got, want, atol=1e-6)
    g = torch.randn(want.shape, generator=gen)
    (want_grad,), (got_grad,) = torch.autograd.grad(want, t, g), torch.autograd.grad(got, t, g)
    assert torch.allclose(got_grad, want_grad, atol=1e-6)


def test_wgrad_accumulation_is_the_fp32_reference_and_stays_off_without_a_gpu(monkeypatch):
    import torch
    from megatron.core.tensor_parallel import layers

    from mcx.train import wgrad

    gen = torch.Generator().manual_seed(3)
    inp, out = torch.randn(40, 12, generator=gen), torch.randn(40, 20, generator=gen)
    main_grad = torch.randn(20, 12, generator=gen)
    want = main_grad + out.t() @ inp
    pointer = main_grad.data_ptr()
    wgrad._accumulate(inp, out, main_grad)  # same dtype: an in-place addmm
    assert main_grad.data_ptr() == pointer and torch.allclose(main_grad, want, atol=1e-5)
    # The mixed-precision GEMM (bf16 in, fp32 out) is torch's CUDA-only out_dtype path: the check
    # refuses it on this machine, and MCore's layers keep apex's absence as it is.
    assert not wgrad._works(torch.device("cpu"))
    monkeypatch.setattr(wgrad, "_state", {})
    assert layers._grad_accum_fusion_available is False
    assert wgrad.enable(torch.device("cpu")) == "unavailable" == wgrad.current()
    assert layers._grad_accum_fusion_available is False and not hasattr(layers, "fused_weight_gradient_mlp_cuda")

# -- system metrics (mcx.train.system_metrics) -------------------------------------------------------------

SMI_FIXTURE = ROOT / "tests" / "fixtures" / "nvidia_smi" / "query_h200.csv"
H200_GPU0 = {"gpu_0_utilization_percentage": 97.0, "gpu_0_memory_usage_megabytes": 62000 * 1.048576,
             "gpu_0_memory_usage_percentage": 100 * 62000 / 143771, "gpu_0_power_usage_watts": 612.45,
             "gpu_0_temperature_celsius": 55.0, "gpu_0_sm_clock_mhz": 1980.0}
HOST_KEYS = {"cpu_utilization_percentage", "system_memory_usage_megabytes", "system_memory_usage_percentage",
             "process_rss_megabytes"}


def fake_nvidia_smi(tmp_path: Path, body: str) -> Path:
    """An executable named nvidia-smi (this machine has no GPU) that logs its argv and runs ``body``."""
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/argv.log"\n{body}\n')
    exe.chmod(0o755)
    return exe


def test_system_nvidia_smi_output_parses_to_mlflow_names():
    from mcx.train.system_metrics import parse_nvidia_smi

    text = SMI_FIXTURE.read_text()
    every = parse_nvidia_smi(text, None)
    assert every == pytest.approx({**H200_GPU0, **{k.replace("gpu_0", "gpu_1"): v for k, v in {
        "gpu_0_utilization_percentage": 95.0, "gpu_0_memory_usage_megabytes": 61876 * 1.048576,
        "gpu_0_memory_usage_percentage": 100 * 61876 / 143771, "gpu_0_power_usage_watts": 598.12,
        "gpu_0_temperature_celsius": 53.0, "gpu_0_sm_clock_mhz": 1980.0}.items()}})
    # Numbered as CUDA numbers them for this process: CUDA_VISIBLE_DEVICES by index or UUID prefix, in order.
    second = parse_nvidia_smi(text, "1")
    assert set(second) == set(H200_GPU0)
    assert second["gpu_0_power_usage_watts"] == 598.12
    assert parse_nvidia_smi(text, "GPU-a7e04b19,0")["gpu_1_power_usage_watts"] == 612.45
    assert parse_nvidia_smi(text, "") == {}
    # What a GPU cannot report is left out, not guessed; a line that is not a GPU row is skipped.
    na = parse_nvidia_smi("0, GPU-x, [N/A], 1024, 143771, [Not Supported], 40, 1755\nNo devices were found\n", None)
    assert na == pytest.approx({"gpu_0_memory_usage_megabytes": 1024 * 1.048576,
                                "gpu_0_memory_usage_percentage": 100 * 1024 / 143771,
                                "gpu_0_temperature_celsius": 40.0, "gpu_0_sm_clock_mhz": 1755.0})


def test_system_sampler_writes_gpu_and_host_lines_and_stops_cleanly(tmp_path):
    from mcx.train.system_metrics import SMI_FIELDS, SmiProbe, SystemSampler, host_probe

    exe = fake_nvidia_smi(tmp_path, f'cat "{SMI_FIXTURE}"')
    path = tmp_path / "system.jsonl"
    sampler = SystemSampler(path, [SmiProbe("0", executable=str(exe)), host_probe()], interval_s=0.05, node=0,
                            nodes=1, host="h200-node")
    steps = iter(range(1000))
    sampler.step_of = lambda: next(steps)
    sampler.start()
    deadline = time.monotonic() + 30
    while sampler.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert not sampler._thread.is_alive()  # stopped and joined, not left sampling
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == sampler.samples >= 4  # three or more while running, one more on stop
    assert sampler.failures == 0
    for line in lines:
        assert set(line) == {"time", "node", "nodes", "host", "step", *H200_GPU0, *HOST_KEYS}
        assert {k: line[k] for k in H200_GPU0} == pytest.approx(H200_GPU0)
        assert line["node"] == 0 and line["nodes"] == 1 and line["host"] == "h200-node"
        assert 0 <= line["cpu_utilization_percentage"] <= 100 and line["process_rss_megabytes"] > 1
    assert [line["step"] for line in lines] == sorted(line["step"] for line in lines)
    assert [line["time"] for line in lines] == sorted(line["time"] for line in lines)
    argv = (tmp_path / "argv.log").read_text().splitlines()
    assert argv[0] == f"--query-gpu={','.join(SMI_FIELDS)} --format=csv,noheader,nounits"
    size = path.stat().st_size
    time.sleep(0.2)
    assert path.stat().st_size == size  # stopped means stopped


def test_system_sampler_never_raises(tmp_path, caplog):
    from mcx.train.system_metrics import SmiProbe, SystemSampler, gpu_probe, host_probe, system_metrics

    broken = SmiProbe(None, executable=str(fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2; exit 9')))
    sampler = SystemSampler(tmp_path / "system.jsonl", [broken, host_probe()], interval_s=0.05)
    sampler.step_of = lambda: 1 / 0  # even a step that cannot be read
    sampler.start()
    time.sleep(0.4)
    sampler.stop()
    lines = [json.loads(line) for line in (tmp_path / "system.jsonl").read_text().splitlines()]
    assert lines and all(set(line) == {"time", "node", "nodes", "host", "step", *HOST_KEYS} for line in lines)
    assert all(line["step"] is None for line in lines)
    assert sampler.failures >= 2 * len(lines)
    said = [r.getMessage() for r in caplog.records if "system metrics" in r.getMessage()]
    assert len(said) == 2 and any("NVIDIA-SMI has failed" in m for m in said)  # each kind said once

    # Nowhere to write: the thread ends, nothing raises.
    lost = SystemSampler(tmp_path / "no-such-dir" / "system.jsonl", [host_probe()], interval_s=0.05).start()
    time.sleep(0.2)
    lost.stop()
    assert lost.failures == 1 and lost.samples == 0 and not lost._thread.is_alive()

    # Nothing to read: no thread, no file.
    class Empty:
        name = "empty"

        def sample(self):
            return {}

        def close(self):
            pass

    empty = SystemSampler(tmp_path / "empty.jsonl", [Empty()], interval_s=0.05).start()
    time.sleep(0.15)
    empty.stop()
    assert empty.samples == 0 and not (tmp_path / "empty.jsonl").read_text()
    import importlib.util
    import shutil

    if importlib.util.find_spec("pynvml") is None and shutil.which("nvidia-smi") is None:
        assert gpu_probe(None) is None  # neither NVML nor nvidia-smi: said in the log, not raised
    with system_metrics(tmp_path, 0, "cpu") as off:
        assert off is None


def test_system_sampler_runs_on_each_nodes_local_rank_zero(tmp_path, monkeypatch):
    from mcx.contract.files import system_file
    from mcx.train.system_metrics import node_place, system_metrics

    torchrun = {"RANK": "9", "LOCAL_RANK": "1", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "16",
                "SLURM_NODEID": "0", "SLURM_NNODES": "2"}
    assert node_place(torchrun) == (1, 2, 1)
    assert node_place({"SLURM_NODEID": "3", "SLURM_NNODES": "4", "SLURM_LOCALID": "0"}) == (3, 4, 0)
    assert node_place({}) == (0, 1, 0)
    assert system_file(0) == "system.jsonl" and system_file(3) == "system.3.jsonl"
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    with system_metrics(tmp_path, 1.0, "cpu") as sampler:
        assert sampler is None  # local rank 1: the node's local rank 0 samples
    monkeypatch.setenv("LOCAL_RANK", "0")
    with system_metrics(tmp_path, 1.0, "cpu") as sampler:
        assert sampler is not None and sampler.node == 1 and sampler.nodes == 2
    assert [json.loads(x)["node"] for x in (tmp_path / "system.1.jsonl").read_text().splitlines()] == [1]


def test_system_metrics_of_a_real_cpu_stage(tmp_path, dataset):
    stage = make_stage(tmp_path / "full", dataset, "full", ["tracking.system_metrics_interval_s=1.0"])
    result = run(stage)
    assert result["status"] == "finished", result["error"]
    lines = [json.loads(x) for x in (stage / "system.jsonl").read_text().splitlines()]
    assert len(lines) >= 1 and all(set(x) == {"time", "node", "nodes", "host", "step", *HOST_KEYS} for x in lines)
    assert lines[-1]["step"] == 20  # the last sample is taken when the stage ends
    steps = [x["step"] for x in lines if x["step"] is not None]
    assert steps == sorted(steps) and all(0 <= s <= 20 for s in steps)
    log = (stage / "worker.log").read_text()
    assert "system metrics every 1s from psutil into system.jsonl" in log


def test_system_metrics_interval_is_checked_by_key():
    from mcx.errors import SpecError

    assert load_spec(TINY).tracking.system_metrics_interval_s == 10.0
    assert load_spec(TINY, ["tracking.system_metrics_interval_s=0"]).tracking.system_metrics_interval_s == 0
    for bad in ("0.01", "-5", "1e9"):
        with pytest.raises(SpecError, match="tracking.system_metrics_interval_s"):
            load_spec(TINY, [f"tracking.system_metrics_interval_s={bad}"])


def test_checkpoint_final_false_saves_only_at_the_interval(tmp_path, dataset):
    stage = make_stage(tmp_path / "s", dataset, "full", ["checkpoint.final=false", "checkpoint.interval=4",
                                                         "train.train_iters=6", "train.lr_warmup_iters=1"])
    assert run(stage)["status"] == "finished"
    ck = stage / "checkpoints"
    assert (ck / "latest").read_text().strip() == "iter_0000004"  # step 4, not the last step (6)
    assert sorted(p.name for p in ck.glob("iter_*")) == ["iter_0000004"]



def test_an_out_of_memory_crash_reports_what_the_allocator_held(tmp_path, dataset):
    """A real allocation failure (a 64 GiB embedding on this 24 GiB machine) fails the stage with
    the out-of-memory facts the control plane turns into advice; other crashes carry none."""
    import torch

    from mcx.train.worker import out_of_memory

    stage = make_stage(tmp_path / "oom", dataset, overrides=["model.hidden_size=33554432"])
    result = run(stage)
    assert result["status"] == "failed" and result["exit_code"] == 1
    facts = result["out_of_memory"]
    assert facts["device"] == "cpu" and "can't allocate memory" in facts["message"]
    assert "allocated_bytes" not in facts  # CUDA's counters only on a CUDA job
    cuda = out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 15.66 GiB."), "cuda")
    assert cuda == {"device": "cuda", "message": "CUDA out of memory. Tried to allocate 15.66 GiB."}  # no CUDA here
    assert out_of_memory(ValueError("shapes do not match"), "cpu") is None


def test_te_extra_state_is_allowed_for_the_load_only(monkeypatch):
    """TE >= 2.20 unpickles FP8 delayed-scaling state only with NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1
    (on H200 an FP8 round trip failed without it, 2026-11-30). The GPU backend sets it around its
    own loads and puts back whatever the process had, also when the load raises."""
    import os

    from mcx.train.gpu import _TE_PICKLE_ENV, _own_te_extra_state

    monkeypatch.delenv(_TE_PICKLE_ENV, raising=False)
    with _own_te_extra_state():
        assert os.environ[_TE_PICKLE_ENV] == "1"
    assert _TE_PICKLE_ENV not in os.environ
    monkeypatch.setenv(_TE_PICKLE_ENV, "0")
    with pytest.raises(RuntimeError), _own_te_extra_state():
        assert os.environ[_TE_PICKLE_ENV] == "1"
        raise RuntimeError("the load failed")
    assert os.environ[_TE_PICKLE_ENV] == "0"


def _serve(requests, n: int) -> None:
    """What MCore's persistent checkpoint writer does with ``n`` requests (async_utils.async_loop)."""
    for _ in range(n):
        request = requests.get()
        args = list(request.async_fn_args)
        if request.preload_fn is not None:
            args[1] = request.preload_fn()
        request.async_fn(*args, **request.async_fn_kwargs)


def _write_buckets(rank, buckets, results_queue) -> None:
    """MCore's write function's arguments: each bucket's tensors to its file."""
    import torch

    for path, _, (_, tensors) in buckets:
        torch.save(dict(tensors), path)


def test_the_checkpoint_writer_says_where_a_saves_time_went(tmp_path):
    """A rehearsal and a timed, checksummed save cross into a spawned process, as MCore's persistent
    writer receives them; MCore's own copy to host runs there (for the rehearsal, as its write), then the
    save's write and the checksums of the file it wrote, and the writer appends a line for each to worker.log."""
    import multiprocessing
    import re
    from functools import partial

    import torch
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    from mcx.train import writer

    tensors = [("a", torch.arange(2 ** 18, dtype=torch.float32)), ("b", torch.ones(512, 512))]  # 2 MiB
    buckets = [(str(tmp_path / "out.pt"), "key", ([], tensors))]
    request = AsyncRequest(_write_buckets, (0, buckets, None), [],
                           preload_fn=partial(FileSystemWriterAsync.preload_tensors, buckets, non_blocking=False))
    (tmp_path / "worker.log").write_text("the trainer's lines\n")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_serve, args=(queue, 2))
    process.start()
    queue.put(writer.rehearsal(request.preload_fn, tmp_path, 0))
    queue.put(writer.timed(writer.checksummed(request, tmp_path, 0), 3, tmp_path, 0))
    process.join(120)
    assert process.exitcode == 0
    saved = torch.load(tmp_path / "out.pt")
    assert torch.equal(saved["a"], tensors[0][1]) and torch.equal(saved["b"], tensors[1][1])
    lines = (tmp_path / "worker.log").read_text().splitlines()
    assert lines[0] == "the trainer's lines" and len(lines) == 3
    assert re.search(r"\[rank 0\] INFO mcx.train.writer: the rehearsed copy \(D30\) in the writer: waited [\d.]+ s "
                     r"for it, received it in [\d.]+ s, copied 2 MiB to host in [\d.]+ s \(new pinned buffers: 0, "
                     r"0 MiB in 0.00 s\), kept nothing$", lines[1]), lines[1]
    m = re.search(r"\[rank 0\] INFO mcx.train.writer: checkpoint save 3 in the writer: waited ([\d.]+) s for it, "
                  r"received it in ([\d.]+) s, copied 2 MiB to host in ([\d.]+) s \(new pinned buffers: 0, 0 MiB "
                  r"in 0.00 s\), wrote it in ([\d.]+) s, checksums of 1 file \(2 MiB\) in ([\d.]+) s$", lines[2])
    assert m, lines[2]
    assert float(m[1]) < 60 and float(m[4]) < 60 and float(m[5]) < 60
    # The checksums of the file the write produced, in the rank's part file for the commit to merge.
    from mcx.weights import checksums

    part = json.loads((tmp_path / "checksums.rank0.json").read_text())
    assert part["files"] == {"out.pt": checksums.file_sum(tmp_path / "out.pt")}


def test_the_checkpoint_results_queue_warms_up_and_is_left_empty(tmp_path, caplog):
    """MCore's results queue (a real multiprocessing Manager) takes one write result at start-up and
    gives it back, so the Manager process imports torch's checkpoint types before the first save; a save
    waits for that round trip, and finds the queue empty."""
    import logging

    from megatron.core.dist_checkpointing.strategies.filesystem_async import get_write_results_queue

    from mcx.train import writer

    with caplog.at_level(logging.INFO, logger="mcx.train.writer"):
        writer.start(0, persistent=False)
        writer.results_queue_ready()
    assert get_write_results_queue().empty()
    assert any("checkpoint results queue ready" in r.getMessage() for r in caplog.records)
    first = writer._results_warm_up
    writer.start(0, persistent=False)  # once per process
    assert writer._results_warm_up is first


def test_stage_result_reads_what_the_worker_writes_and_gives_it_back(tmp_path: Path):
    """The launch seam's StageResult: the worker's result.json (mcx.train.result_writer) read into one typed
    record and written back key for key; a missing ``passed`` is no failure, a false one is."""
    from mcx.contract.result import StageResult, read_stage_result
    from mcx.train.result_writer import make_result, write_result

    made = make_result(status="failed", passed=False, checks={"loss_finite": {"passed": False, "detail": "nan"}},
                       final={"train_loss": 4.5}, error="diverged at step 3", steps=3, layer_spec="local",
                       details={"device": "cpu"}, out_of_memory=None, warnings=["a damaged checkpoint set aside"])
    write_result(tmp_path, made)
    on_disk = json.loads((tmp_path / "result.json").read_text())
    result = read_stage_result(tmp_path)
    assert result is not None and result.to_json() == on_disk
    assert (result.status, result.passed, result.exit_code, result.steps, result.warnings) == (
        "failed", False, 1, 3, ("a damaged checkpoint set aside",))
    assert result.extra == {"versions": on_disk["versions"]} and not result.ok
    assert StageResult.from_json({"status": "finished"}).ok and not StageResult.from_json({"status": "finished",
                                                                                         "passed": False}).ok
    assert read_stage_result(tmp_path / "none") is None
