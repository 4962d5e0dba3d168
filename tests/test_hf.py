"""Hugging Face models in and out (mcx.weights.hf_convert, mcx import-hf, mcx export-hf), checked against
transformers itself: tiny random LLaMA and Mixtral models built locally (no download), the same logits from
Megatron-Core and transformers, bitwise round trips, and every bad directory refused (exit 2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import attrs
import pytest

from conftest import E2E_ROOT, make_e2e_project, mcx_inprocess, mcx_subprocess

TINY = E2E_ROOT / "experiments" / "tiny.toml"
SHAPES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128)


def _save(model, directory: Path, **kwargs) -> Path:
    model.save_pretrained(directory, **kwargs)
    return directory


def llama(directory: Path, vocab: int = 256, seed: int = 0, **config) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, **{"rope_theta": 50000.0, "tie_word_embeddings": False, **SHAPES, **config})
    return _save(LlamaForCausalLM(cfg), directory)


def mixtral(directory: Path, vocab: int = 256, seed: int = 0, **kwargs) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    cfg = MixtralConfig(vocab_size=vocab, num_local_experts=4, num_experts_per_tok=2, **SHAPES)
    return _save(MixtralForCausalLM(cfg), directory, **kwargs)


@pytest.fixture(scope="module")
def mcore():
    """Megatron-Core's parallel state for one CPU process (gloo, world size 1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if owns:
        dist.destroy_process_group()


def mcore_model(directory: Path, seq: int = 64):
    """mcx's CPU model for the Hugging Face model in ``directory``, its weights read by mcx.weights.hf_convert."""
    import torch

    from mcx.spec import load_spec
    from mcx.train import cpu
    from mcx.train import model as model_lib
    from mcx.plan.layout import Layout
    from mcx.weights.canonical import check_fits, with_vocab_rows
    from mcx.weights.hf_convert import hf_weights
    from mcx.weights.hfconfig import as_model_spec, read_config

    hf = read_config(directory)
    spec = attrs.evolve(load_spec(TINY), model=as_model_spec(hf, seq))
    config = model_lib.transformer_config(spec, Layout(), "cpu", "local")
    padded = model_lib.padded_vocab_size(hf.vocab_size, spec.model.make_vocab_size_divisible_by, 1)
    model = model_lib.build_model_chunk(spec, config, model_lib.gpt_layer_spec(spec, "local"), padded)
    cpu.adapt_model(model)
    weights = with_vocab_rows(hf_weights(directory), padded, hf.vocab_size)
    own = model.state_dict()
    check_fits(weights, {k: tuple(v.shape) for k, v in own.items() if isinstance(v, torch.Tensor)}, str(directory))
    with torch.no_grad():
        for name, tensor in own.items():
            if not name.endswith("_extra_state"):
                tensor.copy_(weights[name])
    return model.eval(), hf


def logits_both(directory: Path, tokens):
    import torch
    from transformers import AutoModelForCausalLM

    model, hf = mcore_model(directory)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand(tokens.shape[0], -1)
    with torch.no_grad():
        return model(tokens, positions, None)[..., :hf.vocab_size], reference(tokens).logits


def relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("make, kwargs", [
    (llama, {}),
    (llama, {"vocab": 250}),  # Megatron pads the vocabulary to 256: the padding rows are added and cut
    (llama, {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    (llama, {"head_dim": 32}),  # kv_channels other than hidden / heads
    (llama, {"max_position_embeddings": 16384, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}),
    (mixtral, {}),
    (mixtral, {"save_original_format": False}),  # transformers 5's stacked experts
], ids=["llama", "llama-padded-vocab", "llama-tied-mqa", "llama-head-dim", "llama3-rope-scaling", "mixtral",
        "mixtral-stacked-experts"])
def test_megatron_core_computes_the_logits_transformers_computes(mcore, tmp_path, make, kwargs):
    import torch

    directory = make(tmp_path / "m", **kwargs)
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    tokens = torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(1))
    ours, theirs = logits_both(directory, tokens)
    assert ours.shape == theirs.shape
    assert relative(ours, theirs) < 1e-5


def test_the_stacked_experts_file_is_what_transformers_5_writes(tmp_path):
    from safetensors import safe_open

    directory = mixtral(tmp_path / "m", save_original_format=False)
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any("block_sparse_moe" in n for n in names)


def hf_round_trip(source: Path, out: Path, max_shard_bytes: int = 1 << 40):
    """``source`` read as canonical weights and written back by mcx, through a spec's [model]."""
    import torch

    from mcx.weights.hf_convert import Shapes, hf_weights, write_hf
    from mcx.weights.hfconfig import as_model_spec, config_json, read_config

    hf = read_config(source)
    model = as_model_spec(hf, 64)
    shapes = Shapes(hf.num_layers, hf.num_attention_heads, hf.num_query_groups, hf.head_dim, hf.num_experts, hf.tied)
    config = config_json(model, hf.vocab_size, "float32", {"eos": 2, "bos": 1})
    return write_hf(hf_weights(source), shapes, out, config, torch.float32, max_shard_bytes, {})


def tensors_of(directory: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


@pytest.mark.parametrize("make", [llama, mixtral], ids=["llama", "mixtral"])
def test_hf_to_mcore_to_hf_is_bitwise_and_sharded_on_request(tmp_path, make):
    import torch
    from transformers import AutoConfig

    source = make(tmp_path / "src")
    written = hf_round_trip(source, tmp_path / "one")
    before, after = tensors_of(source), tensors_of(tmp_path / "one")
    assert sorted(before) == sorted(after) and written["tensors"] == len(before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    a, b = AutoConfig.from_pretrained(source), AutoConfig.from_pretrained(tmp_path / "one")
    for key in ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings",
                "num_local_experts", "num_experts_per_tok", "max_position_embeddings"):
        assert getattr(a, key, None) == getattr(b, key, None), key
    assert (a.head_dim or a.hidden_size // a.num_attention_heads) == b.head_dim
    assert a.rope_parameters["rope_theta"] == b.rope_parameters["rope_theta"]

    sharded = hf_round_trip(source, tmp_path / "sharded", max_shard_bytes=40_000)
    files = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
    assert sharded["shards"] == len(files) > 2 and all(p.stat().st_size < 40_000 + 70_000
                                                       for p in (tmp_path / "sharded").glob("*.safetensors"))
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(before) and set(index["weight_map"].values()) == set(files)
    hf_round_trip(tmp_path / "sharded", tmp_path / "again")  # a sharded directory reads back
    assert all(torch.equal(before[k], tensors_of(tmp_path / "again")[k]) for k in before)


def test_an_export_never_replaces_a_directory_and_leaves_nothing_on_error(tmp_path):
    from mcx.weights.canonical import Weights

    source = llama(tmp_path / "src")
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        hf_round_trip(source, tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []

    import mcx.weights.hf_convert as hfmod

    real = hfmod.hf_weights

    def failing(directory):
        w = real(directory)

        def read(name):
            if "layers.1" in name:
                raise RuntimeError("disk full")
            return w[name]
        return Weights(w.shapes, read, w.origin)

    hfmod.hf_weights = failing
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            hf_round_trip(source, tmp_path / "out", max_shard_bytes=40_000)
    finally:
        hfmod.hf_weights = real
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "taken"]


# -- bad directories ---------------------------------------------------------------------------------

def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _rewrite(path: Path, change) -> None:
    """``path`` (a safetensors file) saved again with ``change`` applied to its tensors."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _sharded(d: Path, tmp_path: Path) -> list[Path]:
    """``d`` made again as mcx writes a sharded model (an index and several shards); the shards."""
    shutil.rmtree(d)
    hf_round_trip(llama(tmp_path / "full"), d, max_shard_bytes=40_000)
    return sorted(d.glob("model-*.safetensors"))


def _damage(kind: str, d: Path, tmp_path: Path) -> None:
    """Damage the tiny LLaMA directory ``d`` in place, as ``kind`` says (``tmp_path``: room for a scratch copy)."""
    if kind == "architecture":
        _edit_config(d, architectures=["GPT2LMHeadModel"])
    elif kind == "missing-shard":
        _sharded(d, tmp_path)[1].unlink()
    elif kind == "shape":
        _edit_config(d, intermediate_size=128)
    elif kind == "tensor-shape":
        o_proj = "model.layers.0.self_attn.o_proj.weight"
        _rewrite(d / "model.safetensors", lambda t: t.update({o_proj: t[o_proj][:, :32].contiguous()}))
    elif kind == "missing-tensor":
        _rewrite(d / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    elif kind == "no-kv-heads":  # the model has 2 key/value heads; without the key they are the 4 query heads
        _edit_config(d, num_key_value_heads=None)
    elif kind == "no-intermediate-size":
        _edit_config(d, intermediate_size=None)
    elif kind == "truncated":
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif kind == "truncated-shard":
        last = _sharded(d, tmp_path)[-1]
        last.write_bytes(last.read_bytes()[:-100])
    elif kind == "index-misplaced":
        first = _sharded(d, tmp_path)[0].name
        index = json.loads((d / "model.safetensors.index.json").read_text())
        index["weight_map"]["model.norm.weight"] = first
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    elif kind == "pytorch-bin":
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
    elif kind == "biases":
        _edit_config(d, attention_bias=True)
    elif kind == "rope":
        _edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    elif kind == "no-config":
        (d / "config.json").unlink()


def _bad(kind: str, tmp_path: Path) -> Path:
    d = llama(tmp_path / kind)
    _damage(kind, d, tmp_path)
    return d


# What each damaged directory is refused with: the file, tensor or config.json key, by name.
BAD = {
    "architecture": "architecture 'GPT2LMHeadModel' is not one mcx converts",
    "missing-shard": "shard(s) the index names are missing: model-00002-of-",
    "shape": "model.layers.*.mlp.gate_proj.weight (2 tensors) in model.safetensors: (96, 64), config.json implies "
             "(128, 64) = (intermediate_size, hidden_size)",
    "tensor-shape": "model.layers.0.self_attn.o_proj.weight in model.safetensors: (64, 32), config.json implies "
                    "(64, 64) = (hidden_size, num_attention_heads x head_dim)",
    "missing-tensor": "model.layers.1.mlp.down_proj.weight: missing from model.safetensors",
    "no-kv-heads": "model.layers.*.self_attn.k_proj.weight (2 tensors) in model.safetensors: (32, 64), config.json "
                   "implies (64, 64) = (num_key_value_heads x head_dim, hidden_size); model.layers.*.self_attn."
                   "v_proj.weight (2 tensors) in model.safetensors: (32, 64), config.json implies (64, 64) = "
                   "(num_key_value_heads x head_dim, hidden_size); config.json has no num_key_value_heads, so it is 4",
    "no-intermediate-size": "config.json: intermediate_size is missing",
    "truncated": "model.safetensors is cut off: its header describes",
    "truncated-shard": "-of-00010.safetensors is cut off: its header describes",
    "index-misplaced": "model.norm.weight: model.safetensors.index.json puts it in model-00001-of-00010.safetensors, "
                       "whose header does not list it",
    "pytorch-bin": "has no safetensors files (it has pytorch_model.bin)",
    "biases": "attention_bias = true",
    "rope": "rope scaling",
    "no-config": "has no config.json",
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_model_directory_is_named_before_anything_is_read(tmp_path, kind):
    from mcx.errors import InputError
    from mcx.weights.hf_convert import hf_weights

    directory = _bad(kind, tmp_path)
    with pytest.raises(InputError) as err:
        hf_weights(directory)
    assert BAD[kind] in str(err.value), str(err.value)


def test_import_hf_refuses_a_bad_directory_with_exit_2_and_writes_nothing(tmp_path):
    project = tmp_path / "p"
    (project / "experiments").mkdir(parents=True)
    shutil.copyfile(TINY, project / "experiments" / "tiny.toml")
    directory = _bad("architecture", tmp_path)
    bad = mcx_subprocess(project, "import-hf", str(directory), "-o", "experiments/x.toml",
                         "--extends", "experiments/tiny.toml")
    assert bad.code == 2 and "is not one mcx converts" in bad.err and "Traceback" not in bad.err
    assert not (project / "experiments" / "x.toml").exists()
    alone = mcx_subprocess(project, "import-hf", str(llama(tmp_path / "ok")), "-o", "experiments/x.toml")
    assert alone.code == 2 and "--extends" in alone.err and "train" in alone.err
    assert sorted(p.name for p in (project / "experiments").iterdir()) == ["tiny.toml"]


def test_import_hf_writes_a_spec_that_plans_with_the_models_shapes(tmp_path):
    project = make_e2e_project(tmp_path / "p")
    directory = mixtral(project / "models" / "mix")
    made = mcx_subprocess(project, "import-hf", "models/mix", "-o", "experiments/mix.toml",
                          "--extends", "experiments/tiny.toml", "--set", "train.lr=1e-4", "--set", "train.min_lr=1e-5")
    assert made.code == 0, made.err
    from mcx.spec import load_spec

    spec = load_spec(project / "experiments" / "mix.toml")
    assert (spec.model.num_experts, spec.model.moe_ffn_hidden_size, spec.model.vocab_size) == (4, 96, 256)
    assert spec.init.source == "hf:models/mix" and spec.train.lr == 1e-4
    assert spec.model.rotary_base == 1000000 and spec.model.seq_length == 128
    plan = mcx_subprocess(project, "plan", "experiments/mix.toml", "--set", "model.num_layers=3")
    assert plan.code == 2 and "model.num_layers" in plan.err and "3 here, 2 in hf:mix" in plan.err, plan.err
    assert directory.is_dir()


# What issue 35 found passing import-hf and plan, then refused by the worker after a run directory and an
# MLflow run existed: each is now refused by all three commands, before anything is written.
DAMAGED = ["pytorch-bin", "truncated", "truncated-shard", "tensor-shape", "missing-tensor", "index-misplaced",
           "missing-shard", "no-kv-heads", "no-intermediate-size"]


@pytest.fixture(scope="module")
def hf_project(tmp_path_factory, e2e_clean_env) -> Path:
    return make_e2e_project(tmp_path_factory.mktemp("hfcheck") / "p")


def _nothing_recorded(project: Path) -> None:
    """No run directory, and no MLflow run in the embedded store (if the command made one at all)."""
    import sqlite3

    runs = project / ".mcx" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), sorted(runs.iterdir())
    db = project / ".mcx" / "mlflow.db"
    if db.exists():
        with sqlite3.connect(db) as c:
            assert c.execute("select count(*) from runs").fetchone() == (0,)


@pytest.mark.parametrize("kind", DAMAGED)
def test_a_damaged_directory_is_refused_by_import_hf_plan_and_run_before_anything_is_written(hf_project, tmp_path,
                                                                                            kind):
    project = hf_project
    good = llama(project / "models" / kind)
    spec = f"experiments/hf-{kind}.toml"
    made = mcx_inprocess(project, "import-hf", f"models/{kind}", "-o", spec, "--extends", "experiments/tiny.toml")
    assert made.code == 0, made
    planned = mcx_inprocess(project, "plan", spec)
    assert planned.code == 0 and re.search(r"run [0-9a-f]{12}", planned.out), planned  # while the directory is whole
    _damage(kind, good, tmp_path)

    again = mcx_inprocess(project, "import-hf", f"models/{kind}", "-o", "experiments/again.toml",
                          "--extends", "experiments/tiny.toml")
    plan = mcx_inprocess(project, "plan", spec)
    run = mcx_inprocess(project, "run", spec)
    for result in (again, plan, run):
        assert result.code == 2 and BAD[kind] in result.err and "Traceback" not in result.err, result
        assert result.err.startswith("mcx: error:"), result.err
    assert not (project / "experiments" / "again.toml").exists() and plan.out == ""
    _nothing_recorded(project)


def test_planning_from_a_hugging_face_directory_imports_neither_torch_nor_safetensors(hf_project):
    """The check reads config.json and the headers with the standard library: `mcx plan` stays a light process."""
    import subprocess
    import sys

    from conftest import e2e_env

    llama(hf_project / "models" / "light")
    made = mcx_inprocess(hf_project, "import-hf", "models/light", "-o", "experiments/light.toml",
                         "--extends", "experiments/tiny.toml")
    assert made.code == 0, made
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('LOADED', sorted(m for m in ('torch', 'safetensors', 'transformers') "
             "if m in sys.modules), file=sys.stderr))\n"
             "sys.argv = ['mcx', *sys.argv[1:]]\nrunpy.run_module('mcx', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", probe, "--project", str(hf_project), "plan", "experiments/light.toml"],
                          cwd=hf_project, env=e2e_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and re.search(r"run [0-9a-f]{12}", proc.stdout), proc.stderr[-2000:]
    assert "LOADED []" in proc.stderr, proc.stderr[-2000:]


# -- the chain, end to end ------------------------------------------------------------------------------

SHORT = ["--skip-smoke", "--set", "train.lr_warmup_iters=2", "--set", "train.eval_interval=10"]
FROZEN = [*SHORT, "--set", "train.train_iters=10", "--set", "train.lr=0.0", "--set", "train.min_lr=0.0"]


def _metrics(project: Path, run_id: str) -> list[dict]:
    path = project / ".mcx" / "runs" / run_id / "full" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_run_leaves_as_a_hugging_face_model_and_a_run_starts_from_it(mcore, tmp_path):
    """pretrain -> export-hf -> transformers computes what Megatron-Core computed -> import-hf -> a run from
    the export and a run from the parent start from the same weights; the chain is recorded and reproduced."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcx.data.tokenizer import load_saved
    from mcx.spec import load_spec
    from mcx.train import cpu
    from mcx.train import model as model_lib
    from mcx.plan.layout import Layout

    project = make_e2e_project(tmp_path / "project")
    parent = mcx_subprocess(project, "run", "experiments/tiny.toml", *SHORT, "--set", "train.train_iters=20", "--json")
    assert parent.code == 0, parent.err
    pid = parent.json()["run_id"]

    made = mcx_subprocess(project, "export-hf", pid, "-o", "hf/tiny", "--max-shard-size", "500KB", "--json")
    assert made.code == 0, made.err
    out = made.json()
    assert (out["architecture"], out["step"], out["dtype"]) == ("LlamaForCausalLM", 20, "fp32") and out["shards"] > 2
    export = project / "hf" / "tiny"
    assert json.loads((export / "mcx.json").read_text())["run_id"] == pid
    again = mcx_subprocess(project, "export-hf", pid, "-o", "hf/tiny")
    assert again.code == 2 and "already exists" in again.err
    for args, words in ((["0123456789ab"], "no run 0123456789ab"), ([pid, "--step", "7"], "--step: run"),
                        ([pid, "--max-shard-size", "big"], "is not a size")):
        bad = mcx_subprocess(project, "export-hf", *args, "-o", "hf/other")
        assert bad.code == 2 and words in bad.err and "Traceback" not in bad.err, bad.err
    assert not (project / "hf" / "other").exists()

    # transformers loads the export and computes Megatron-Core's logits; its tokenizer is the dataset's
    spec = load_spec(project / ".mcx" / "runs" / pid / "spec.toml")
    model = model_lib.build_model_chunk(spec, model_lib.transformer_config(spec, Layout(), "cpu", "local"),
                                        model_lib.gpt_layer_spec(spec, "local"), 4096)
    cpu.adapt_model(model)
    state = project / ".mcx" / "runs" / pid / "full" / "checkpoints" / "iter_0000020" / "state.pt"
    model.load_state_dict(torch.load(state, weights_only=True)["model"])
    reference = AutoModelForCausalLM.from_pretrained(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    text = "def forward(self, hidden_states):\n    return self.linear(hidden_states)\n"
    ids = tokenizer.encode(text)
    assert ids == load_saved(project / "data" / "quickstart", "bpe").encode(text)
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ours = model.eval()(tokens, torch.arange(len(ids)).unsqueeze(0), None)
        assert relative(ours, reference(tokens).logits) < 1e-5
    assert tokenizer.eos_token == "<|endoftext|>"

    # a run from the export and a run from the parent (learning rate 0): the same weights, the same losses
    made = mcx_subprocess(project, "import-hf", "hf/tiny", "-o", "experiments/from_hf.toml",
                          "--extends", "experiments/tiny.toml")
    assert made.code == 0, made.err
    from_hf = mcx_subprocess(project, "run", "experiments/from_hf.toml", *FROZEN, "--json")
    from_run = mcx_subprocess(project, "run", "experiments/tiny.toml", *FROZEN, "--set", f'init.from="run:{pid}"',
                              "--json")
    assert from_hf.code == 0 and from_run.code == 0, (from_hf.err, from_run.err)
    hid, rid = from_hf.json()["run_id"], from_run.json()["run_id"]
    first = [_metrics(project, r)[0]["loss"] for r in (hid, rid)]
    assert first[0] == first[1] < 7.0  # not random weights (ln 4096 = 8.3)
    test_loss = [next(x["loss"] for x in _metrics(project, r) if x["kind"] == "test") for r in (pid, hid)]
    assert test_loss[0] == test_loss[1]

    # the chain: the export names its run, so lineage goes through it both ways
    chain = mcx_subprocess(project, "lineage", hid, "--json").json()
    assert [a.get("run_id") or a["kind"] for a in chain["ancestors"]] == ["hf", pid]
    assert chain["ancestors"][0]["exported_from"]["run_id"] == pid
    down = mcx_subprocess(project, "lineage", pid, "--json").json()
    assert sorted((d["run_id"], d["via"] is not None) for d in down["descendants"]) == sorted([(hid, True), (rid, False)])
    why = mcx_subprocess(project, "explain", hid, rid, "--json")
    assert why.code == 0 and "init" in why.out

    # the directory's content is the child's identity: one changed byte, another run ID
    shard = sorted(export.glob("model-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    changed = mcx_subprocess(project, "plan", "experiments/from_hf.toml", *FROZEN[1:], "--json")
    assert changed.code == 0 and changed.json()["run_id"] != hid
    refused = mcx_subprocess(project, "reproduce", hid)
    assert refused.code == 2 and "init.from" in refused.err, refused.err
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    rep = mcx_subprocess(project, "reproduce", hid, "--json")
    assert rep.code == 0 and rep.json()["verdict"] == "bitwise", rep.err[-2000:]
