"""Hugging Face safetensors <-> canonical weights, one tensor at a time.

The table of links (which Hugging Face tensors each canonical tensor is made of) and the check of a
directory against config.json are ``hftensors``' (torch-free: the planner runs them too); here are the
joins that build Megatron-Core's fused tensors (QKV interleaved by query group, gate then up rows) and
split them again. The vocabulary tensors keep the Hugging Face row count here (Megatron's padding rows
are added or cut by ``canonical.with_vocab_rows``).

Reading checks the shards' headers first (shapes without data) and reads a tensor's bytes when it is asked
for. Writing plans the shards from the shapes, then fills and writes one shard at a time, so the host
holds at most one shard and one canonical tensor, whatever the model's size."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from mcx.errors import InputError
from mcx.weights.canonical import Shape, Weights
from mcx.weights.hfconfig import read_config
from mcx.weights.hftensors import INDEX, SINGLE, Link, Shapes, check_tensors, joined_shape, links, shapes_of

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HF_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


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


def split(link: Link, tensor: torch.Tensor, s: Shapes) -> tuple[torch.Tensor, ...]:
    if link.join == "same":
        return (tensor,)
    if link.join == "qkv":
        return split_qkv(tensor, s)
    return tuple(torch.chunk(tensor, 2, dim=0))


# -- reading ---------------------------------------------------------------------------------------

def hf_weights(directory: Path) -> Weights:
    """A Hugging Face model directory (config.json + safetensors, sharded or not) as canonical Weights.
    InputError for a missing or damaged file, a missing, extra or mis-shaped tensor, a model mcx does not
    convert (``hftensors.check_tensors``: the same check the planner made), before any tensor is read."""
    directory = Path(directory)
    hf = read_config(directory)
    s = shapes_of(hf)
    found = check_tensors(directory, hf)
    handles: dict[str, object] = {}

    def handle(stored: str):
        file = found.files[stored]
        if file not in handles:
            from safetensors import SafetensorError, safe_open

            try:
                handles[file] = safe_open(str(directory / file), "pt", device="cpu")
            except (SafetensorError, OSError) as exc:
                raise InputError(f"hf:{directory}: {file} is not a readable safetensors file ({exc});",
                                 "download it again (a cut-off download leaves a truncated file).") from None
        return handles[file]

    table = links(s)
    by_name = {link.canonical: link for link in table}
    shapes = {link.canonical: joined_shape(link, [found.shape(n) for n in link.hf]) for link in table}

    def read(name: str) -> torch.Tensor:
        link = by_name[name]
        parts = [found.refs[n].read(handle(found.refs[n].stored)) for n in link.hf]
        if link.join == "same":
            return parts[0]
        if link.join == "qkv":
            q, k, v = parts
            return join_qkv(q, k, v, s)
        return torch.cat(parts, dim=0)

    return Weights(shapes, read, f"hf:{directory}")


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
