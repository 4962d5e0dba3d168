"""Plan for the target, check where it runs: what depends on the machine a spec is typed on
(Transformer Engine, the dataset and tokenizer files, writable directories) is a warning in `mcx plan`
and one report of problems at `mcx run` before anything starts; on a cluster the worker checks the
same in its first seconds. Real CLI, real files, the real worker entry point.

The checks run wherever the tests do: on a machine without Transformer Engine (CI, a login node, a
laptop), its absence is one of the problems named; on the GPU machine, where it is installed
(benchmarks/gpu/suite.py, task "site"), the same reports come without it (TE_HERE)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import IN_CI

from mcx.data.vocab import hf_vocab_size, sentencepiece_vocab_size, tokenizer_vocab_size
from mcx.ops.plan import plan_loaded
from mcx.spec import loads_spec

ROOT = Path(__file__).resolve().parents[1]
TE_HERE = importlib.util.find_spec("transformer_engine") is not None  # as mcx.launch.preflight decides it

# A LLaMA-style 70B as imported from a Megatron-LM script: TP 4 x PP 4 with sequence parallel on
# Transformer Engine, 2 nodes x 8 GPUs, its data and tokenizer on the cluster's file system.
CLUSTER_SPEC = """
name = "llama70b"
[model]
num_layers = 80
hidden_size = 8192
num_attention_heads = 64
num_query_groups = 8
ffn_hidden_size = 28672
seq_length = 4096
transformer_impl = "transformer_engine"
[parallel]
tensor = 4
pipeline = 4
context = 1
sequence_parallel = true
distributed_optimizer = false
overlap_grad_reduce = false
overlap_param_gather = false
[train]
global_batch_size = 512
train_iters = 1000
lr = 1.5e-4
[data]
path = "/nonexistent-lustre/data"
prefix = "corpus_text_document"
[data.tokenizer]
kind = "huggingface"
path = "/nonexistent-lustre/tok/tokenizer.json"
[hardware]
nodes = 2
gpus_per_node = 8
[launch]
kind = "torchrun"
"""


def mcx(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcx", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "MCX_PROJECT": str(project)}, timeout=300)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "llama70b.toml").write_text(CLUSTER_SPEC)
    return root


def test_plan_describes_the_target_and_warns_about_this_machine(project: Path) -> None:
    proc = mcx(project, "plan", "llama70b.toml", "--set", "model.vocab_size=128256", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["transformer_impl"] == "transformer_engine" and plan["layout"]["sequence_parallel"]
    assert plan["run_id"] is None  # the data's content is part of the ID, and it is not here
    warnings = "\n".join(plan["warnings"])
    assert ("Transformer Engine is not importable on this machine" in warnings) is not TE_HERE
    assert "data.path: '/nonexistent-lustre/data'" in warnings and "data.tokenizer.path:" in warnings
    assert "GiB free on its file system, but one checkpoint of this model" in warnings  # ~1 TB into this machine's .mcx/
    assert warnings.count("checked again when the job starts") == 3  # data, tokenizer, free space: TE is not a site check
    text = mcx(project, "plan", "llama70b.toml", "--set", "model.vocab_size=128256")
    assert text.returncode == 0 and "ID unknown here" in text.stdout
    assert not (project / ".mcx").exists()


def test_run_checks_this_machine_before_anything_starts_and_says_everything_at_once(project: Path) -> None:
    proc = mcx(project, "run", "llama70b.toml", "--set", "model.vocab_size=128256")
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    keys = ["data.path:", "data.tokenizer.path:", "checkpoint.dir (unset: the run directory, .mcx/ in the project):",
            "launch.kind:", *([] if TE_HERE else ["model.transformer_impl:", "parallel.sequence_parallel:"])]
    assert err.startswith(f"mcx: error: {len(keys)} problems:") and "Traceback" not in err, err
    for key in keys:
        assert f"  {key}" in err, (key, err)
    assert ("model.transformer_impl:" in err) is not TE_HERE
    assert not (project / ".mcx").exists()


def test_the_vocabulary_and_the_rules_come_in_one_report(project: Path) -> None:
    proc = mcx(project, "plan", "llama70b.toml", "--set", "parallel.tensor=3")
    assert proc.returncode == 2
    assert "model.vocab_size: unset" in proc.stderr and "neither readable on this machine" in proc.stderr
    assert "parallel.tensor" in proc.stderr  # 3 divides no head count: found with a stand-in vocabulary


def _quickstart_project(tmp_path: Path) -> Path:
    """A git repository with the quickstart spec and data.dvc, but not its dataset."""
    root = tmp_path / "project"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copyfile(ROOT / "data.dvc", root / "data.dvc")
    (root / ".dvc").mkdir()
    (root / "tiny.toml").write_text((ROOT / "experiments" / "tiny.toml").read_text())
    return root


def test_an_unwritable_checkpoint_directory_is_a_warning_in_the_plan_and_refused_at_launch(tmp_path: Path) -> None:
    root = _quickstart_project(tmp_path)
    (root / "blocker").write_text("a file where a directory would go\n")
    setting = "checkpoint.dir=\"blocker/ckpt\""
    plan = mcx(root, "plan", "tiny.toml", "--set", setting, "--json")
    assert plan.returncode == 0, plan.stderr
    assert any(w.startswith("checkpoint.dir:") and "is a file, not a directory" in w
               for w in json.loads(plan.stdout)["warnings"])
    run = mcx(root, "run", "tiny.toml", "--set", setting)
    assert run.returncode == 2 and "checkpoint.dir:" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (root / ".mcx").exists()


def test_a_spec_without_te_features_plans_as_it_would_run_here(tmp_path: Path) -> None:
    spec = loads_spec(CLUSTER_SPEC.replace('transformer_impl = "transformer_engine"', 'transformer_impl = "auto"')
                      .replace("sequence_parallel = true", "sequence_parallel = false")
                      .replace("nodes = 2", "nodes = 1").replace("tensor = 4", "tensor = 8").replace(
                          "pipeline = 4", "pipeline = 1").replace("seq_length = 4096", "seq_length = 4096\nvocab_size = 128256"))
    pr = plan_loaded(spec, tmp_path, probe_hardware=False)
    assert pr.plan.transformer_impl == ("transformer_engine" if TE_HERE else "local") and pr.te_available is TE_HERE
    assert not any("Transformer Engine is not importable" in w for w in pr.plan_json()["warnings"])


# ---- the vocabulary from the tokenizer's own files, against the tokenizer libraries


def test_tokenizer_json_vocabulary_is_what_the_library_counts(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from mcx.data.tokenizer import train_bpe

    tok = train_bpe([f"document {i} about megatron and transformers, words words" for i in range(200)], 300)
    backend = Tokenizer.from_buffer(tok.payload["tokenizer.json"])
    backend.add_special_tokens(["<|extra_one|>", "<|extra_two|>"])
    raw = backend.to_str().encode()
    assert hf_vocab_size(raw) == backend.get_vocab_size(with_added_tokens=True) == tok.vocab_size + 2
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    path.write_bytes(raw)
    spec = loads_spec(CLUSTER_SPEC.replace("/nonexistent-lustre/tok/tokenizer.json", str(path)))
    assert tokenizer_vocab_size(spec.data, tmp_path) == tok.vocab_size + 2
    # Megatron-LM's --tokenizer-model names the directory; the file inside is read
    spec_dir = loads_spec(CLUSTER_SPEC.replace("/nonexistent-lustre/tok/tokenizer.json", str(path.parent)))
    assert tokenizer_vocab_size(spec_dir.data, tmp_path) == tok.vocab_size + 2
    pr = plan_loaded(spec, tmp_path, probe_hardware=False)
    assert pr.plan.vocab_size == tok.vocab_size + 2


def test_sentencepiece_vocabulary_is_what_the_library_counts(tmp_path: Path) -> None:
    import sentencepiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(300)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=97,
                                             model_type="bpe", minloglevel=2)
    raw = (tmp_path / "sp.model").read_bytes()
    sp = sentencepiece.SentencePieceProcessor(model_proto=raw)
    assert sentencepiece_vocab_size(raw) == sp.get_piece_size() == 97
    assert sentencepiece_vocab_size(raw[: len(raw) // 2]) is None  # a truncated file is not a size
    assert hf_vocab_size(b"not json") is None


# ---- the worker checks its node before it imports torch (the smoke stage on a cluster fails fast)


def test_the_worker_refuses_a_node_that_lacks_what_the_job_needs(tmp_path: Path) -> None:
    from mcx.spec.load import load_spec, spec_to_dict

    spec = load_spec(ROOT / "experiments" / "tiny.toml", ['model.transformer_impl="transformer_engine"'])
    data = tmp_path / "megatron-data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        (data / f"corpus{ext}").write_bytes(b"")  # Megatron-LM's files, not prepared by mcx
    (tmp_path / "blocker").write_text("")
    stage = tmp_path / "stage"
    stage.mkdir()
    job = {"run_id": "a" * 12, "stage": "smoke", "spec": spec_to_dict(spec),
           "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1, "world_size": 1,
                      "sequence_parallel": False},
           "data_dir": str(data), "checkpoint_dir": str(tmp_path / "blocker" / "ckpt"), "train_samples_limit": None,
           "device": "cuda", "output": "quiet"}
    (stage / "job.json").write_text(json.dumps(job))
    probe = textwrap.dedent(f"""
        import sys
        from mcx.train.worker import train_stage
        result = train_stage({str(stage)!r})
        print(result["exit_code"], "torch" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], proc.stderr  # refused before torch was imported
    result = json.loads((stage / "result.json").read_text())
    assert result["status"] == "failed" and result["exit_code"] == 2
    err = result["error"]
    assert f"{2 if TE_HERE else 3} problems in the smoke stage's job on " in err
    assert "data.path: " in err and "no manifest.json" in err
    assert "checkpoint.dir: " in err and "is a file, not a directory" in err
    assert ("model.transformer_impl: " in err and "not importable on " in err) is not TE_HERE
    # and the entry point exits 2, as the Slurm job records it
    cli = subprocess.run([sys.executable, "-m", "mcx.train", str(stage)], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "checkpoint.dir" in cli.stderr
    # a rank other than 0 that refuses its node writes the result too: torchrun stops rank 0 when it exits
    (stage / "result.json").unlink()
    other = subprocess.run([sys.executable, "-m", "mcx.train", str(stage)], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "RANK": "1"})
    assert other.returncode == 2 and json.loads((stage / "result.json").read_text())["error"] == err


# ---- on Slurm: the smoke stage's job refuses its node in its first seconds, and mcx run says why


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("sbatch") is None and not IN_CI,  # in CI: runs, and fails without Slurm
                    reason="no Slurm cluster here: start the local one with `bash .ci/slurm.sh start` (as root)")
def test_a_slurm_smoke_stage_fails_fast_naming_the_key(tmp_path: Path) -> None:
    from conftest import make_e2e_project, mcx_subprocess

    project = make_e2e_project(tmp_path / "project")
    for name in ("tiny_ddp.toml", "tiny_slurm.toml"):
        shutil.copyfile(ROOT / "experiments" / name, project / "experiments" / name)
    (project / "blocker").write_text("a file where the checkpoint directory would go\n")
    args = ["experiments/tiny_slurm.toml", "--set", "launch.slurm.partition=debug",
            "--set", "smoke.gpu=cpu", "--set", 'checkpoint.dir="blocker/ckpt"']
    plan = mcx_subprocess(project, "plan", *args, "--json")
    assert plan.code == 0 and any(w.startswith("checkpoint.dir:") for w in plan.json()["warnings"]), plan
    res = mcx_subprocess(project, "run", *args, "--json", timeout=600)
    assert res.code == 2, res  # the worker's word: bad input where the job runs
    summary = res.json()
    smoke = summary["stages"]["smoke"]
    assert smoke["status"] == "failed" and smoke["steps"] in (0, None), smoke
    assert "checkpoint.dir: " in summary["error"] and "is a file, not a directory" in summary["error"]
    assert "full" not in summary["stages"]  # nothing more was submitted
    log = (project / ".mcx" / "runs" / summary["run_id"] / "smoke" / "worker.log").read_text()
    assert "Megatron" not in log and "torch" not in log  # refused before the worker imported them


def test_a_checkpoint_directory_without_room_for_a_checkpoint_is_refused_at_launch(tmp_path: Path) -> None:
    # 80 layers of width 8192 (a 70B model): one checkpoint is about 14 bytes a parameter, ~900 GiB, far
    # more than this machine's disk holds; the tiny quickstart's checkpoints fit anywhere.
    root = _quickstart_project(tmp_path)
    big = ["--set", "model.num_layers=80", "--set", "model.hidden_size=8192", "--set", "model.num_attention_heads=64",
           "--set", "model.num_query_groups=8", "--set", "model.ffn_hidden_size=28672"]
    free = shutil.disk_usage(tmp_path).free
    assert free < 900 * (1 << 30), "this test needs a disk smaller than one 70B checkpoint"
    plan = mcx(root, "plan", "tiny.toml", *big, "--json")
    assert plan.returncode == 0, plan.stderr
    assert any("GiB free on its file system, but one checkpoint of this model" in w
               for w in json.loads(plan.stdout)["warnings"])
    run = mcx(root, "run", "tiny.toml", *big)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "checkpoint.dir (unset: the run directory, .mcx/ in the project): " in run.stderr
    assert not (root / ".mcx").exists()
    assert mcx(root, "plan", "tiny.toml", "--json").returncode == 0
    assert not any("GiB free" in w for w in json.loads(mcx(root, "plan", "tiny.toml", "--json").stdout)["warnings"])
