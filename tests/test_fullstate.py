"""mcx.train.fullstate against real Megatron-Core on CPU: torch_dist checkpoints of several layouts
(TP, PP with VPP, EP, data parallel; dense, LayerNorm with biases and tied embeddings, MoE) read back as the
canonical weights bit for bit, a CPU stage started from one, and every checkpoint that does not fit named.

The checkpoints are written once for the module by one torchrun of two gloo ranks
(tests/fixtures/dist_checkpoint.py: mcx's model in each layout, filled by fullstate.load_full, saved by
dist_checkpointing), from canonical weights made here: the CPU model's state dict, every tensor drawn
afresh from a seeded generator so that no two tensors (norms included) are alike. A round trip through
load_full and read_full alone would pass with any mapping and its inverse, so each variant also has a
reference written without fullstate (torch's load_state_dict, canonical names), which read_full must read
as the canonical weights and Megatron-Core's own load must put where load_full put them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
TINY_MOE = ROOT / "experiments" / "tiny_moe.toml"
FIXTURE = ROOT / "tests" / "fixtures" / "dist_checkpoint.py"
VOCAB = 4096  # tiny.toml's tokenizer

# model variant: (spec, overrides)
VARIANTS = {
    "dense": (TINY, []),
    "layernorm": (TINY, ['model.normalization="LayerNorm"', "model.add_bias_linear=true",
                         "model.untie_embeddings_and_output_weights=false"]),
    "moe": (TINY_MOE, []),
}
# checkpoint: (variant, layout on two ranks, what else the fixture does). The *_dp2 ones are references,
# filled by torch's load_state_dict (no fullstate); the others by load_full, checked on their ranks against
# Megatron-Core's own load of their variant's reference.
CHECKPOINTS = {
    "dense_dp2": ("dense", {}, {"fill": "load_state_dict"}),
    "layernorm_dp2": ("layernorm", {}, {"fill": "load_state_dict"}),
    "moe_dp2": ("moe", {}, {"fill": "load_state_dict"}),
    "dense_tp2": ("dense", {"tp": 2}, {"extras": True}),  # with optimizer, RNG and scheduler state
    "layernorm_pp2_vpp2": ("layernorm", {"pp": 2, "vpp": 2}, {}),
    "layernorm_tp2": ("layernorm", {"tp": 2}, {}),
    "moe_ep2": ("moe", {"ep": 2}, {}),
    "moe_tp2": ("moe", {"tp": 2}, {}),
    "moe_ep2_unstacked": ("moe", {"ep": 2}, {"metadata": {"non_homogeneous_layers": True}}),  # decoder.layers.N.*
    "dense_without_final_norm": ("dense", {}, {"drop": ["decoder.final_layernorm.weight"]}),
}
FULL = [name for name in CHECKPOINTS if name != "dense_without_final_norm"]


@contextlib.contextmanager
def cpu_backend(variant: str, overrides: list[str] = ()):
    """mcx's CPU backend for ``variant`` in this process (torch.distributed and parallel_state for one rank)."""
    from mcx.plan.layout import Layout
    from mcx.spec.load import load_spec
    from mcx.train.cpu import CpuBackend
    from mcx.contract.job import Job
    from mcx.train.runtime import distributed

    path, sets = VARIANTS[variant]
    job = Job(run_id="f" * 12, stage="full", spec=load_spec(path, [*sets, *overrides]), layout=Layout(),
              data_dir="", checkpoint_dir="", device="cpu")
    with distributed(job) as world:
        yield CpuBackend(job, world, VOCAB)


def own_tensors(backend) -> dict:
    from mcx.weights.canonical import is_extra_state

    return {k: v for k, v in backend.model.state_dict().items() if not is_extra_state(k)}


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Each variant's canonical weights: (the state_dict file, the tensors)."""
    import torch

    base = tmp_path_factory.mktemp("canonical")
    out = {}
    for seed, variant in enumerate(VARIANTS):
        with cpu_backend(variant) as backend:
            gen = torch.Generator().manual_seed(seed)
            tensors = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in own_tensors(backend).items()}
        torch.save(tensors, base / f"{variant}.pt")
        out[variant] = (base / f"{variant}.pt", tensors)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoints(canonical, tmp_path_factory) -> dict[str, Path]:
    """Every checkpoint of CHECKPOINTS, written by one torchrun of two ranks."""
    base = tmp_path_factory.mktemp("dist")
    plan = [{"out": str(base / name), "spec": str(VARIANTS[variant][0]), "set": VARIANTS[variant][1],
             "vocab": VOCAB, "canonical": str(canonical[variant][0]), "layout": layout,
             **({} if extra.get("fill") else {"check_against": str(base / f"{variant}_dp2")}), **extra}
            for name, (variant, layout, extra) in CHECKPOINTS.items()]
    (base / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                           str(FIXTURE), str(base / "plan.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {name: base / name for name in CHECKPOINTS}


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_a_checkpoint_of_any_layout_reads_back_as_the_canonical_weights_bitwise(name, checkpoints, canonical):
    import torch

    from mcx.weights.dist import read_full

    if not CHECKPOINTS[name][2].get("fill"):  # load_full's shards, on every rank, against Megatron-Core's load
        assert json.loads(Path(f"{checkpoints[name]}.check.json").read_text()) == []
    if name.endswith("unstacked"):  # one key a layer, the experts still on an axis
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(str(checkpoints[name])).read_metadata().state_dict_metadata
        assert "decoder.layers.3.mlp.experts.experts.linear_fc1.weight" in keys
        assert "decoder.layers.mlp.router.weight" not in keys
    want = canonical[CHECKPOINTS[name][0]][1]
    weights = read_full(checkpoints[name])
    assert weights.shapes == {k: tuple(v.shape) for k, v in want.items()}  # names and shapes, before any read
    for key, tensor in want.items():
        got = weights[key]
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), key


@pytest.mark.slow
def test_a_cpu_stage_starts_from_a_dist_checkpoint_bitwise(checkpoints, canonical, tmp_path):
    """[init] of format "dist" on the CPU backend: warmstart.canonical_weights (read_full) and the strict
    fit check, from an mcx checkpoint directory (its ``latest`` names the iteration)."""
    import torch

    from mcx.contract.job import InitFrom

    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "iter_0000007").symlink_to(checkpoints["moe_ep2"], target_is_directory=True)
    (root / "latest").write_text("iter_0000007")
    with cpu_backend("moe") as backend:
        backend.start_from(InitFrom(kind="megatron", path=str(root), format="dist"), 0)
        got = own_tensors(backend)
    want = canonical["moe"][1]
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_the_model_is_refused_naming_each_tensor(checkpoints):
    from mcx.errors import InputError
    from mcx.contract.job import InitFrom

    def start(variant: str, overrides: list[str], checkpoint: str) -> str:
        with cpu_backend(variant, overrides) as backend, pytest.raises(InputError) as caught:
            backend.start_from(InitFrom(kind="megatron", path=str(checkpoints[checkpoint]), format="dist"), 0)
        return str(caught.value)

    text = start("dense", ["model.num_query_groups=4"], "dense_dp2")
    assert "do not fit this spec's model" in text
    for layer in range(4):
        assert f"decoder.layers.{layer}.self_attention.linear_qkv.weight: shape (256, 128), this model's is (384, 128)" in text
    assert "decoder.final_layernorm.weight: missing" in start("dense", [], "dense_without_final_norm")


def test_load_full_names_every_missing_extra_and_misshaped_tensor_before_copying(canonical):
    import torch

    from mcx.errors import InputError
    from mcx.weights.canonical import Weights
    from mcx.train.fullstate import load_full

    tensors = dict(canonical["dense"][1])
    del tensors["decoder.layers.1.mlp.linear_fc2.weight"]
    tensors["decoder.layers.2.input_layernorm.weight"] = torch.ones(64)
    tensors["decoder.layers.4.input_layernorm.weight"] = torch.ones(128)
    with cpu_backend("dense") as backend:
        before = {k: v.clone() for k, v in own_tensors(backend).items()}
        with pytest.raises(InputError) as caught:
            load_full([backend.model], Weights.of(tensors, "the source"))
        after = own_tensors(backend)
    text = str(caught.value)
    assert "the weights in the source do not fit" in text
    assert "decoder.layers.1.mlp.linear_fc2.weight: missing" in text
    assert "decoder.layers.2.input_layernorm.weight: shape (64,), this model's is (128,)" in text
    assert "decoder.layers.4.input_layernorm.weight: not in this model" in text
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing copied


@pytest.mark.slow
def test_reading_one_tensor_reads_its_layer_not_the_stack(checkpoints):
    """Bytes the process reads (Linux's rchar) while one layer's fc1 is read: that layer's four stored chunks
    (two TP ranks, gate and up halves; each a torch.save record of ~40 KB beside its data), not the
    checkpoint's stacked (4, 768, 128) tensor."""
    from mcx.weights.dist import read_full

    weights = read_full(checkpoints["dense_tp2"])  # the metadata is read here
    name = "decoder.layers.2.mlp.linear_fc1.weight"
    one_layer = 768 * 128 * 4

    def rchar() -> int:
        return int(next(x for x in Path("/proc/self/io").read_text().splitlines() if x.startswith("rchar")).split()[1])

    before = rchar()
    tensor = weights[name]
    read = rchar() - before
    assert tuple(tensor.shape) == (768, 128)
    assert one_layer <= read < 2 * one_layer, read  # the stack is 4 x one_layer


def test_directories_that_are_not_torch_dist_checkpoints_are_named_with_what_to_do(tmp_path):
    import torch

    from mcx.errors import InputError
    from mcx.weights.dist import read_full

    def refusal(path: Path) -> str:
        with pytest.raises(InputError) as caught:
            read_full(path)
        return str(caught.value)

    legacy = tmp_path / "legacy" / "iter_0000010"
    (legacy / "mp_rank_00").mkdir(parents=True)
    torch.save({"model": {}}, legacy / "mp_rank_00" / "model_optim_rng.pt")
    (tmp_path / "legacy" / "latest_checkpointed_iteration.txt").write_text("10\n")
    text = refusal(tmp_path / "legacy")
    assert f"{legacy} is a legacy Megatron-LM checkpoint" in text
    assert "tools/checkpoint/convert.py --saver mcore" in text and "--ckpt-format torch_dist" in text

    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty} is not a torch_dist distributed checkpoint (it has no .metadata)" in refusal(empty)

    zarr = tmp_path / "zarr"
    zarr.mkdir()
    (zarr / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "sharded_backend_version": 1}))
    assert "of the 'zarr' format; mcx reads torch_dist" in refusal(zarr)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ".metadata").write_bytes(b"not a pickle")
    assert f"{broken}/.metadata cannot be read" in refusal(broken)

    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "latest_checkpointed_iteration.txt").write_text("20")
    assert f"{gone} names iter_0000020 as its newest checkpoint, and there is no" in refusal(gone)
    assert "is not a directory" in refusal(tmp_path / "nothing")


def test_checkpoint_dir_follows_megatron_lm_and_mcx_pointers(tmp_path):
    from mcx.weights.checkpoint_files import checkpoint_dir

    megatron, mcx = tmp_path / "save", tmp_path / "checkpoints"
    for root, name in ((megatron, "iter_0000500"), (megatron, "release"), (mcx, "iter_0000040")):
        (root / name).mkdir(parents=True)
    (megatron / "latest_checkpointed_iteration.txt").write_text("500\n")
    (mcx / "latest").write_text("iter_0000040")
    assert checkpoint_dir(megatron) == megatron / "iter_0000500"
    assert checkpoint_dir(mcx) == mcx / "iter_0000040"
    assert checkpoint_dir(mcx / "iter_0000040") == mcx / "iter_0000040"
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    assert checkpoint_dir(megatron) == megatron / "release"


def test_sharded_keys_map_to_canonical_names():
    """The table fullstate's docstring gives, key by key (what the checkpoints above exercise as a whole)."""
    from mcx.weights.dist import canonical_name, prepended_axes

    cases = [
        ("decoder.layers.self_attention.linear_qkv.layer_norm_weight", (3,), "decoder.layers.3.input_layernorm.weight"),
        ("decoder.layers.self_attention.linear_qkv.layer_norm_bias", (0,), "decoder.layers.0.input_layernorm.bias"),
        ("decoder.layers.mlp.linear_fc1.layer_norm_weight", (1,), "decoder.layers.1.pre_mlp_layernorm.weight"),
        ("decoder.layers.pre_mlp_layernorm.weight", (2,), "decoder.layers.2.pre_mlp_layernorm.weight"),
        ("decoder.layers.mlp.router.weight", (0,), "decoder.layers.0.mlp.router.weight"),
        ("decoder.layers.mlp.experts.experts.linear_fc1.weight", (1, 2),
         "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"),
        ("decoder.layers.5.mlp.experts.experts.linear_fc2.weight", (3,),
         "decoder.layers.5.mlp.experts.local_experts.3.linear_fc2.weight"),
        ("decoder.layers.5.mlp.linear_fc1.layer_norm_weight", (), "decoder.layers.5.pre_mlp_layernorm.weight"),
        ("decoder.final_layernorm.weight", (), "decoder.final_layernorm.weight"),
        ("embedding.word_embeddings.weight", (), "embedding.word_embeddings.weight"),
        ("output_layer.weight", (), "output_layer.weight"),
    ]
    for key, index, name in cases:
        assert prepended_axes(key) == len(index), key
        assert canonical_name(key, index) == name
