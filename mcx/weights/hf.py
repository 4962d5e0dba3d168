"""Hugging Face safetensors <-> canonical weights, one tensor at a time.

The mapping is a table of links: each canonical tensor is one Hugging Face tensor, or several joined:
Megatron-Core's fused QKV holds, for each query group in turn, that group's query heads, then its key
head, then its value head (so tensor parallelism splits it by whole groups); its first MLP linear holds
the gate projection, then the up projection (SwiGLU computes silu(gate) * up). Experts and router map
one to one. The vocabulary tensors keep the Hugging Face row count here (Megatron's padding rows are
added or cut by ``canonical.with_vocab_rows``).

Reading opens each shard's header once (shapes without data) and reads a tensor's bytes when it is asked
for. Writing plans the shards from the shapes, then fills and writes one shard at a time, so the host
holds at most one shard and one canonical tensor, whatever the model's size.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from attrs import frozen

from mcx.errors import InputError
from mcx.weights.canonical import Shape, Weights, expert_key, layer_key
from mcx.weights.hfconfig import HfModel, read_config

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Buffers older checkpoints carry that are recomputed, not learned.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HF_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@frozen
class Link:
    """One canonical tensor and the Hugging Face tensors it is made of (``join``: how)."""

    canonical: str
    hf: tuple[str, ...]
    join: str  # "same", "qkv" (q, k, v interleaved by query group) or "gate_up" (concatenated rows)


@frozen
class Shapes:
    """What the links of a model depend on."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    num_experts: int | None
    tied: bool


def shapes_of(hf: HfModel) -> Shapes:
    return Shapes(hf.num_layers, hf.num_attention_heads, hf.num_query_groups, hf.head_dim, hf.num_experts, hf.tied)


def links(s: Shapes) -> list[Link]:
    """Every tensor of the model, in Hugging Face's order (embedding, layers, final norm, head)."""
    out = [Link("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "same")]
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        out += [
            Link(layer_key(i, "input_layernorm.weight"), (p + "input_layernorm.weight",), "same"),
            Link(layer_key(i, "self_attention.linear_qkv.weight"),
                 tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"), "qkv"),
            Link(layer_key(i, "self_attention.linear_proj.weight"), (p + "self_attn.o_proj.weight",), "same"),
            Link(layer_key(i, "pre_mlp_layernorm.weight"), (p + "post_attention_layernorm.weight",), "same"),
        ]
        if s.num_experts:
            moe = p + "block_sparse_moe."
            out.append(Link(layer_key(i, "mlp.router.weight"), (moe + "gate.weight",), "same"))
            for e in range(s.num_experts):
                x = f"{moe}experts.{e}."
                out += [Link(expert_key(i, e, "linear_fc1.weight"), (x + "w1.weight", x + "w3.weight"), "gate_up"),
                        Link(expert_key(i, e, "linear_fc2.weight"), (x + "w2.weight",), "same")]
        else:
            out += [Link(layer_key(i, "mlp.linear_fc1.weight"), (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                         "gate_up"),
                    Link(layer_key(i, "mlp.linear_fc2.weight"), (p + "mlp.down_proj.weight",), "same")]
    out.append(Link("decoder.final_layernorm.weight", ("model.norm.weight",), "same"))
    if not s.tied:
        out.append(Link("output_layer.weight", ("lm_head.weight",), "same"))
    return out


# -- the joins ------------------------------------------------------------------------------------

def join_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shapes) -> torch.Tensor:
    g, d = s.num_query_groups, s.head_dim
    per = s.num_attention_heads // g
    hidden = q.shape[-1]
    parts = (q.reshape(g, per * d, hidden), k.reshape(g, d, hidden), v.reshape(g, d, hidden))
    return torch.cat(parts, dim=1).reshape(-1, hidden)


def split_qkv(qkv: torch.Tensor, s: Shapes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d = s.num_query_groups, s.head_dim
    per = s.num_attention_heads // g
    hidden = qkv.shape[-1]
    grouped = qkv.reshape(g, (per + 2) * d, hidden)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


def joined_shape(link: Link, parts: list[Shape]) -> Shape:
    if link.join == "same":
        return parts[0]
    return (sum(p[0] for p in parts), *parts[0][1:])


def split(link: Link, tensor: torch.Tensor, s: Shapes) -> tuple[torch.Tensor, ...]:
    if link.join == "same":
        return (tensor,)
    if link.join == "qkv":
        return split_qkv(tensor, s)
    return tuple(torch.chunk(tensor, 2, dim=0))


# -- reading ---------------------------------------------------------------------------------------

def hf_weights(directory: Path) -> Weights:
    """A Hugging Face model directory (config.json + safetensors, sharded or not) as canonical Weights.
    InputError for a missing shard, a missing, extra or mis-shaped tensor, a model mcx does not convert."""
    directory = Path(directory)
    hf = read_config(directory)
    s = shapes_of(hf)
    files = _tensor_files(directory)
    handles: dict[str, object] = {}

    def handle(name: str):
        file = files[name]
        if file not in handles:
            from safetensors import SafetensorError, safe_open

            try:
                handles[file] = safe_open(str(directory / file), "pt", device="cpu")
            except (SafetensorError, OSError) as exc:
                raise InputError(f"hf:{directory}: {file} is not a readable safetensors file ({exc});",
                                 "download it again (a cut-off download leaves a truncated file).") from None
        return handles[file]

    have = {name: tuple(handle(name).get_slice(name).get_shape()) for name in files}
    refs = {name: Ref(name) for name in have} | _stacked_experts(have, s)
    table = links(s)
    wanted = {name for link in table for name in link.hf}
    used = {refs[n].stored for n in wanted if n in refs}
    problems = [f"{n}: missing" for n in sorted(wanted - refs.keys())]
    problems += [f"{n}: not a tensor of a {hf.architecture}" for n in sorted(have.keys() - used)
                 if not n.endswith(IGNORED_SUFFIXES)]
    if not problems:
        problems = [f"{n}: {refs[n].shape(have)}, config.json implies {e}" for link in table
                    for n, e in zip(link.hf, _expected(link, hf)) if refs[n].shape(have) != e]
    if problems:
        raise InputError(f"hf:{directory}: the safetensors files do not hold the model config.json describes "
                         f"({'; '.join(problems[:8])}{f'; and {len(problems) - 8} more' if len(problems) > 8 else ''});",
                         "use the directory as published (every shard the index lists) with its own config.json.")
    by_name = {link.canonical: link for link in table}
    shapes = {link.canonical: joined_shape(link, [refs[n].shape(have) for n in link.hf]) for link in table}

    def read(name: str) -> torch.Tensor:
        link = by_name[name]
        parts = [refs[n].read(handle(refs[n].stored)) for n in link.hf]
        if link.join == "same":
            return parts[0]
        if link.join == "qkv":
            return join_qkv(*parts, s)
        return torch.cat(parts, dim=0)

    return Weights(shapes, read, f"hf:{directory}")


@frozen
class Ref:
    """Where a Hub-named tensor is stored: under its own name, or as one expert's rows of a stacked tensor."""

    stored: str
    expert: int | None = None
    rows: tuple[int, int] | None = None

    def shape(self, have: dict[str, Shape]) -> Shape:
        shape = have[self.stored] if self.expert is None else have[self.stored][1:]
        return shape if self.rows is None else (self.rows[1] - self.rows[0], *shape[1:])

    def read(self, f) -> torch.Tensor:
        if self.expert is None:
            return f.get_tensor(self.stored)
        part = f.get_slice(self.stored)[self.expert]
        return part if self.rows is None else part[self.rows[0]:self.rows[1]]


def _stacked_experts(have: dict[str, Shape], s: Shapes) -> dict[str, Ref]:
    """transformers 5 can save Mixtral's experts stacked (``mlp.experts.gate_up_proj``: [E, 2F, H], gate rows
    first; ``mlp.experts.down_proj``: [E, H, F]; the router as ``mlp.gate.weight``): the Hub's names for them."""
    out: dict[str, Ref] = {}
    for i in range(s.num_layers if s.num_experts else 0):
        p, moe = f"model.layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
        gate_up, down = p + "experts.gate_up_proj", p + "experts.down_proj"
        if gate_up in have and down in have:
            f = have[gate_up][1] // 2
            for e in range(s.num_experts or 0):
                x = f"{moe}experts.{e}."
                out |= {x + "w1.weight": Ref(gate_up, e, (0, f)), x + "w3.weight": Ref(gate_up, e, (f, 2 * f)),
                        x + "w2.weight": Ref(down, e)}
        if p + "gate.weight" in have:
            out[moe + "gate.weight"] = Ref(p + "gate.weight")
    return out


def _expected(link: Link, hf: HfModel) -> list[Shape]:
    """The shape config.json implies for each Hugging Face tensor of ``link``."""
    h, v, f, q, kv = hf.hidden_size, hf.vocab_size, hf.ffn_hidden_size, hf.num_attention_heads * hf.head_dim, \
        hf.num_query_groups * hf.head_dim
    by_end = {"embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "norm.weight": (h,), "layernorm.weight": (h,),
              "q_proj.weight": (q, h), "k_proj.weight": (kv, h), "v_proj.weight": (kv, h), "o_proj.weight": (h, q),
              "gate_proj.weight": (f, h), "up_proj.weight": (f, h), "w1.weight": (f, h), "w3.weight": (f, h),
              "down_proj.weight": (h, f), "w2.weight": (h, f), "gate.weight": (hf.num_experts or 0, h)}
    return [next(shape for end, shape in by_end.items() if name.endswith(end)) for name in link.hf]


def _tensor_files(directory: Path) -> dict[str, str]:
    """Tensor name -> shard file, from the index (every shard it names must exist) or the one file."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            assert isinstance(weight_map, dict)
        except (OSError, ValueError, KeyError, AssertionError) as exc:
            raise InputError(f"{index} is not a safetensors index ({exc});",
                             "restore it from the model's source.") from None
        absent = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
        if absent:
            raise InputError(f"hf:{directory}: {len(absent)} shard(s) the index names are missing: {', '.join(absent[:5])}"
                             f"{' ...' if len(absent) > 5 else ''};",
                             "download the missing files (huggingface-cli download resumes), or copy the whole "
                             "directory again.")
        return weight_map
    singles = sorted(p.name for p in directory.glob("*.safetensors"))
    if len(singles) == 1:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(directory / singles[0]), "pt", device="cpu") as f:
                return {name: singles[0] for name in f.keys()}
        except (SafetensorError, OSError) as exc:
            raise InputError(f"hf:{directory}: {singles[0]} is not a readable safetensors file ({exc});",
                             "download it again (a cut-off download leaves a truncated file).") from None
    if not singles:
        bins = sorted(p.name for p in directory.glob("*.bin"))
        raise InputError(f"hf:{directory} has no safetensors files" + (f" (it has {', '.join(bins[:3])})" if bins else "")
                         + ";", "mcx reads safetensors only: save the model with transformers' "
                         "save_pretrained (safetensors is its default), then point init.from at that directory.")
    raise InputError(f"hf:{directory} has {len(singles)} safetensors files and no {INDEX};",
                     f"restore {INDEX} from the model's source.")


# -- writing ---------------------------------------------------------------------------------------

def write_hf(weights: Weights, s: Shapes, out: Path, config: dict, dtype: torch.dtype, max_shard_bytes: int,
             files: dict[str, bytes], progress: Callable[[str], None] = lambda _: None) -> dict:
    """Write ``weights`` as a Hugging Face model directory ``out`` (which must not exist): config.json,
    safetensors shards of at most ``max_shard_bytes`` (one tensor larger than that gets a shard of its own)
    with their index, and ``files`` (tokenizer files, ...) as given. The vocabulary tensors are cut to
    ``config["vocab_size"]`` rows. Built in a temporary directory beside ``out`` and renamed into place, so
    an error leaves nothing behind. Returns {"shards", "bytes", "tensors"}."""
    from safetensors.torch import save_file

    vocab = int(config["vocab_size"])
    table = links(s)
    sizes: list[tuple[Link, list[tuple[str, Shape]]]] = []
    for link in table:
        shape = weights.shapes[link.canonical]
        if link.canonical in ("embedding.word_embeddings.weight", "output_layer.weight"):
            shape = (vocab, *shape[1:])
        sizes.append((link, [(n, p) for n, p in zip(link.hf, _split_shapes(link, shape, s))]))
    shards = _plan_shards(sizes, dtype, max_shard_bytes)
    names = [SINGLE] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                               for i in range(len(shards))]
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: an export never replaces a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        weight_map, total = {}, 0
        for name, shard in zip(names, shards):
            tensors: dict[str, torch.Tensor] = {}
            for link in shard:
                full = weights[link.canonical]
                if link.canonical in ("embedding.word_embeddings.weight", "output_layer.weight"):
                    full = full[:vocab]
                for hf_name, part in zip(link.hf, split(link, full, s)):
                    tensors[hf_name] = part.to(dtype).contiguous()
                    weight_map[hf_name] = name
                    total += tensors[hf_name].numel() * tensors[hf_name].element_size()
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            progress(f"wrote {name} ({len(tensors)} tensors)")
            del tensors
        if len(names) > 1:
            _write_text(tmp / INDEX, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2, sort_keys=True))
        _write_text(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True))
        for fname, data in files.items():
            (tmp / fname).write_bytes(data)
        _publish(tmp)
        if out.exists():  # rename would replace an empty directory that appeared meanwhile
            raise FileExistsError(f"{out} exists: an export never replaces a directory")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"shards": len(names), "bytes": total, "tensors": len(weight_map)}


def _split_shapes(link: Link, shape: Shape, s: Shapes) -> list[Shape]:
    if link.join == "same":
        return [shape]
    if link.join == "gate_up":
        return [(shape[0] // 2, *shape[1:])] * 2
    q = s.num_attention_heads * s.head_dim
    kv = s.num_query_groups * s.head_dim
    return [(q, shape[1]), (kv, shape[1]), (kv, shape[1])]


def _plan_shards(sizes: list[tuple[Link, list[tuple[str, Shape]]]], dtype: torch.dtype,
                 max_bytes: int) -> list[list[Link]]:
    """Links grouped in order into shards of at most ``max_bytes`` (a link is never split across shards)."""
    width = torch.empty((), dtype=dtype).element_size()
    shards: list[list[Link]] = [[]]
    used = 0
    for link, parts in sizes:
        n = sum(width * _numel(p) for _, p in parts)
        if shards[-1] and used + n > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(link)
        used += n
    return shards


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _publish(directory: Path) -> None:
    """The modes a plain mkdir and open would have given (mkdtemp and the writer make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for f in directory.iterdir():
        f.chmod(0o666 & ~umask)


def _write_text(path: Path, text: str) -> None:
    path.write_text(text + "\n", encoding="utf-8")
