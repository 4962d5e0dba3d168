"""A data mixture (D60) trained by `mcx run` on the GPU and reproduced bitwise by `mcx reproduce`.

The CPU suite (tests/test_mixture.py) checks the mixture's keys, IDs, shares and SIGKILL resume on the CPU
backend; here the same three components (mcx's own modules split three ways, one BPE tokenizer, prepared by
mcx) go through the CUDA backend in bf16 with the smoke stage, so Megatron-Core's BlendedDataset, the
realised shares in the record and the run's determinism are checked where users train.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import tomli_w

from gpuwork import ROOT, gpu_set, mcx

pytestmark = pytest.mark.gpu

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
ITERS, GLOBAL_BATCH = 60, 32
SPEC = {
    "name": "mix-gpu",
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256},
    "train": {"micro_batch_size": 8, "global_batch_size": GLOBAL_BATCH, "train_iters": ITERS, "lr": 1e-3,
              "precision": "bf16", "deterministic": True, "eval_interval": 30, "eval_iters": 2},
    "data": {"tokenizer": {"kind": "huggingface", "path": "tok/tokenizer.json"},
             "mix": {name: {"path": f"datasets/{name}", "weight": w} for name, w in WEIGHTS.items()}},
    "checkpoint": {"interval": 30, "async_save": False},
}


@pytest.fixture(scope="module")
def project(work: Path) -> Path:
    from mcx.data.corpus import text_corpus
    from mcx.data.prepare import prepare
    from mcx.data.tokenizer import train_bpe
    from mcx.spec.schema import TokenizerSpec

    root = work / "mixture"
    files = sorted(p for p in (ROOT / "mcx").rglob("*.py") if p.stat().st_size > 4000)
    sources = {name: [p.read_text(encoding="utf-8") for p in files[i::3]] for i, name in enumerate(WEIGHTS)}
    (root / "tok").mkdir(parents=True)
    train_bpe([t for texts in sources.values() for t in texts], 1024).save(root / "tok")
    for name, texts in sources.items():
        src = root / "texts" / name
        src.mkdir(parents=True)
        for i, text in enumerate(texts):
            (src / f"{i}.txt").write_text(text, encoding="utf-8")
        prepare(text_corpus([src], unit="paragraph"), TokenizerSpec(kind="huggingface", path="tok/tokenizer.json"),
                root / "datasets" / name, base_dir=root)
    (root / "mix.toml").write_text(tomli_w.dumps(SPEC), encoding="utf-8")
    shutil.copytree(ROOT / "lockfiles", root / "lockfiles")  # the environment `mcx reproduce` re-creates
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=mcx", "-c", "user.email=mcx@example.invalid", "commit", "-q", "-m", "mixture"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def run(project: Path) -> dict:
    res = mcx(project, "run", "mix.toml", "--yes", "--json", *gpu_set())
    assert res.code == 0, res
    return res.json()


def test_a_mixture_trains_on_the_gpu_and_draws_its_weights(project: Path, run: dict) -> None:
    record = json.loads((Path(run["run_dir"]) / "full" / "result.json").read_text())
    assert record["status"] == "finished" and record["passed"], record
    drawn = record["details"]["mixture"]
    consumed = ITERS * GLOBAL_BATCH
    assert sum(c["samples"] for c in drawn.values()) == consumed, drawn
    for name, weight in WEIGHTS.items():
        part = drawn[f"mix.{name}"]
        band = 3 * math.sqrt(weight * (1 - weight) / consumed)  # three standard deviations of a binomial share
        assert part["requested"] == pytest.approx(weight) and abs(part["share"] - weight) <= band, drawn
    smoke = json.loads((Path(run["run_dir"]) / "smoke" / "result.json").read_text())
    assert smoke["status"] == "finished" and smoke["passed"] and "mixture" in smoke["details"], smoke


def test_mcx_reproduce_of_the_mixture_run_is_bitwise(project: Path, run: dict) -> None:
    res = mcx(project, "reproduce", run["run_id"], "--json")
    assert res.code == 0, res
    verdict = res.json()
    assert verdict["run_id"] == run["run_id"] and verdict["verdict"] == "bitwise", verdict
    assert verdict["data_identical"] is True and verdict["first_difference"] is None, verdict
