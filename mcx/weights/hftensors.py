"""The tensors of a Hugging Face model directory: the table linking each canonical tensor to the Hugging
Face tensors it is made of, the shapes config.json implies for them, and the check of a directory's
safetensors headers against both.

Pure (no torch, no safetensors): `mcx import-hf`, `mcx plan` and `mcx run` check a directory here before
anything is written, from config.json and the headers alone; the worker's reader (``hf.py``) checks the
same way, then reads the tensors.

Megatron-Core's fused QKV holds, for each query group in turn, that group's query heads, then its key head,
then its value head (so tensor parallelism splits it by whole groups); its first MLP linear holds the gate
projection, then the up projection (SwiGLU computes silu(gate) * up). Experts and router map one to one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.weights.names import expert_key, layer_key
from mcx.weights.hfconfig import HfModel
from mcx.weights.safetensors_header import Shape, read_header

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Buffers older checkpoints carry that are recomputed, not learned.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SHOWN = 8  # problems named in one error, then a count


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


def joined_shape(link: Link, parts: list[Shape]) -> Shape:
    if link.join == "same":
        return parts[0]
    return (sum(p[0] for p in parts), *parts[0][1:])


@frozen
class Ref:
    """Where a Hub-named tensor is stored: under its own name, or as one expert's rows of a stacked tensor."""

    stored: str
    expert: int | None = None
    rows: tuple[int, int] | None = None

    def shape(self, have: dict[str, Shape]) -> Shape:
        shape = have[self.stored] if self.expert is None else have[self.stored][1:]
        return shape if self.rows is None else (self.rows[1] - self.rows[0], *shape[1:])

    def read(self, f):
        """The tensor, from ``f``: the open safetensors file (safe_open) that stores it."""
        if self.expert is None:
            return f.get_tensor(self.stored)
        part = f.get_slice(self.stored)[self.expert]
        return part if self.rows is None else part[self.rows[0]:self.rows[1]]


@frozen
class HfTensors:
    """A checked directory's tensors: where each is stored (``files``: stored name -> safetensors file), their
    shapes as stored, and the Hub's names for them (``refs``, stacked experts included)."""

    files: dict[str, str]
    have: dict[str, Shape]
    refs: dict[str, Ref]

    def shape(self, name: str) -> Shape:
        return self.refs[name].shape(self.have)


def check_tensors(directory: Path, hf: HfModel) -> HfTensors:
    """The tensors of the Hugging Face model ``directory`` (whose config.json ``hf`` is), from its safetensors
    headers alone: InputError naming every missing, damaged or cut-off file, and every tensor missing, extra
    or of another shape than config.json implies."""
    directory = Path(directory)
    files = tensor_files(directory)
    headers = {file: read_header(directory / file) for file in sorted(set(files.values()))}
    damaged = [p for h in headers.values() for p in h.problems]
    if damaged:
        raise _damaged(directory, damaged)
    misplaced = [f"{n}: {INDEX} puts it in {f}, whose header does not list it" for n, f in files.items()
                 if n not in headers[f].tensors]
    have = {n: headers[f].tensors[n] for n, f in files.items() if n in headers[f].tensors}
    s = shapes_of(hf)
    refs = {name: Ref(name) for name in have} | _stacked_experts(have, s)
    table = links(s)
    wanted = {name for link in table for name in link.hf}
    used = {refs[n].stored for n in wanted if n in refs}
    listing = INDEX if (directory / INDEX).is_file() else next(iter(headers), "the directory")
    absent = sorted(wanted - refs.keys() - files.keys())  # those the index lists are named as misplaced
    problems = misplaced + _grouped([(n, f": missing from {listing}") for n in absent])
    problems += _grouped([(n, f" in {files[n]}: not a tensor of a {hf.architecture}")
                          for n in sorted(have.keys() - used) if not n.endswith(IGNORED_SUFFIXES)])
    if not problems:
        dims = _dims(hf)
        problems = _grouped([(n, f" in {files[refs[n].stored]}: {refs[n].shape(have)}, config.json implies {want} "
                              f"= ({', '.join(keys)})") for link in table for n in link.hf
                             for want, keys in [_expected(n, dims)] if refs[n].shape(have) != want])
        problems += _defaulted(hf) if problems else []
    if problems:
        raise InputError(f"hf:{directory}: the safetensors files do not hold the model {hf.path} describes "
                         f"({_listed(problems)});",
                         "use the directory as published (every shard the index lists) with its own config.json.")
    return HfTensors(files, have, refs)


def _grouped(items: list[tuple[str, str]]) -> list[str]:
    """``name + problem`` for each item, the same problem of every layer (and expert) said once:
    ``model.layers.*.mlp.up_proj.weight (2 tensors): ...``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, problem in items:
        groups.setdefault((re.sub(r"\.\d+\.", ".*.", name), problem), []).append(name)
    return [f"{pattern} ({len(names)} tensors){problem}" if len(names) > 1 else names[0] + problem
            for (pattern, problem), names in groups.items()]


def _defaulted(hf: HfModel) -> list[str]:
    """What config.json left out and was read as transformers reads it (a likely cause of a shape mismatch)."""
    return [f"config.json has no {key}, so it is {value}, as transformers reads it" for key, value in hf.defaulted]


def _damaged(directory: Path, problems: list[str]) -> InputError:
    return InputError(f"hf:{directory}: {_listed(problems)};", "download each file named again (a cut-off download "
                      "leaves a truncated file; huggingface-cli download resumes).")


def _listed(problems: list[str]) -> str:
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return "; ".join(problems[:SHOWN]) + more


def _stacked_experts(have: dict[str, Shape], s: Shapes) -> dict[str, Ref]:
    """transformers 5 can save Mixtral's experts stacked (``mlp.experts.gate_up_proj``: [E, 2F, H], gate rows
    first; ``mlp.experts.down_proj``: [E, H, F]; the router as ``mlp.gate.weight``): the Hub's names for them."""
    out: dict[str, Ref] = {}
    for i in range(s.num_layers if s.num_experts else 0):
        p, moe = f"model.layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
        gate_up, down = p + "experts.gate_up_proj", p + "experts.down_proj"
        if gate_up in have and down in have and len(have[gate_up]) == 3:
            f = have[gate_up][1] // 2
            for e in range(s.num_experts or 0):
                x = f"{moe}experts.{e}."
                out |= {x + "w1.weight": Ref(gate_up, e, (0, f)), x + "w3.weight": Ref(gate_up, e, (f, 2 * f)),
                        x + "w2.weight": Ref(down, e)}
        if p + "gate.weight" in have:
            out[moe + "gate.weight"] = Ref(p + "gate.weight")
    return out


# The sizes each Hugging Face tensor's dimensions are (by the end of its name), as symbols of _dims.
DIMS_BY_END = {"embed_tokens.weight": "vh", "lm_head.weight": "vh", "norm.weight": "h", "layernorm.weight": "h",
               "q_proj.weight": ("q", "h"), "k_proj.weight": ("kv", "h"), "v_proj.weight": ("kv", "h"),
               "o_proj.weight": ("h", "q"), "gate_proj.weight": "fh", "up_proj.weight": "fh", "w1.weight": "fh",
               "w3.weight": "fh", "down_proj.weight": "hf", "w2.weight": "hf", "gate.weight": "eh"}


def _dims(hf: HfModel) -> dict[str, tuple[int, str]]:
    """Each dimension symbol's size and the config.json keys it comes from."""
    return {"v": (hf.vocab_size, "vocab_size"), "h": (hf.hidden_size, "hidden_size"),
            "f": (hf.ffn_hidden_size, "intermediate_size"),
            "q": (hf.num_attention_heads * hf.head_dim, "num_attention_heads x head_dim"),
            "kv": (hf.num_query_groups * hf.head_dim, "num_key_value_heads x head_dim"),
            "e": (hf.num_experts or 0, "num_local_experts")}


def _expected(name: str, dims: dict[str, tuple[int, str]]) -> tuple[Shape, tuple[str, ...]]:
    """The shape config.json implies for the Hugging Face tensor ``name``, and the keys each size comes from."""
    symbols = next(s for end, s in DIMS_BY_END.items() if name.endswith(end))
    return tuple(dims[d][0] for d in symbols), tuple(dims[d][1] for d in symbols)


def tensor_files(directory: Path) -> dict[str, str]:
    """Tensor name -> safetensors file, from the index (every shard it names must exist) or the one file."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            assert isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
            raise InputError(f"{index} is not a safetensors index ({type(exc).__name__}: {exc});",
                             "restore it from the model's source.") from None
        absent = sorted(f for f in set(weight_map.values()) if not (directory / f).is_file())
        if absent:
            raise InputError(f"hf:{directory}: {len(absent)} shard(s) the index names are missing: "
                             f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''};",
                             "download the missing files (huggingface-cli download resumes), or copy the whole "
                             "directory again.")
        return weight_map
    singles = sorted(p.name for p in directory.glob("*.safetensors"))
    if len(singles) == 1:
        header = read_header(directory / singles[0])
        if header.problems:
            raise _damaged(directory, list(header.problems))
        return {name: singles[0] for name in header.tensors}
    if not singles:
        bins = sorted(p.name for p in directory.glob("*.bin"))
        has = f" (it has {', '.join(bins[:3])})" if bins else ""
        raise InputError(f"hf:{directory} has no safetensors files{has};",
                         "mcx reads safetensors only: save the model with transformers' save_pretrained "
                         "(safetensors is its default), then point init.from at that directory.")
    raise InputError(f"hf:{directory} has {len(singles)} safetensors files and no {INDEX};",
                     f"restore {INDEX} from the model's source.")
