"""Megatron-Core distributed checkpoints (torch_dist) as canonical weights, read on any machine.

dist_checkpointing stores every tensor under its sharded key with one global shape, whatever layout
(TP, PP, VPP, EP) or layer spec (local, Transformer Engine) saved it. The decoder's layers are stacked on
prepended axes, and their keys are Transformer Engine's names even for the local spec (its layer spec maps
its norms onto them). Canonical names (mcx.weights.canonical) from sharded keys, with layer i, expert e:

    decoder.layers.self_attention.linear_qkv.layer_norm_X  (L, h)  decoder.layers.i.input_layernorm.X
    decoder.layers.mlp.linear_fc1.layer_norm_X             (L, h)  decoder.layers.i.pre_mlp_layernorm.X
        (the local spec's pre-MLP norm, dense and MoE; TE's fused one, dense)
    decoder.layers.pre_mlp_layernorm.X                     (L, h)  decoder.layers.i.pre_mlp_layernorm.X (TE, MoE)
    decoder.layers.mlp.experts.experts.REST             (L, E, ..)  decoder.layers.i.mlp.experts.local_experts.e.REST
        (SequentialMLP and TEGroupedMLP alike)
    decoder.layers.REST                                  (L, ..)  decoder.layers.i.REST (router (L, E, h), ...)
    decoder.layers.N.REST: layers saved unstacked (non-homogeneous layers: MoE every k-th layer); N is i
    anything else (embedding., decoder.final_layernorm., output_layer.)   the same name and shape

A swiglu fc1's global tensor is the unsharded [gate; up] (its factory shards each half over TP), and a tied
output layer is stored as the embedding alone, so neither needs a rule here. Keys outside the model
(optimizer., rng_state, common_state, opt_param_scheduler) and ``_extra_state`` are not weights.

``read_full`` builds the table of canonical names and shapes from the checkpoint's ``.metadata`` and reads
each tensor when indexed: the read items of its one layer (and expert), through torch.distributed
.checkpoint's own reader, so a 440 GB stack is never read whole. Neither torch.distributed nor Megatron-Core
is needed (mcx export-hf and the CPU worker read GPU runs' checkpoints). mcx.train.fullstate loads canonical
weights into a sharded model with the names below.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from mcx.errors import InputError
from mcx.weights.canonical import SHOWN, Shape, Weights, is_extra_state
from mcx.weights.names import expert_key, layer_key
from mcx.weights.checkpoint_files import checkpoint_dir, dist_directory_problem

MODEL_KEYS = ("embedding.", "decoder.", "output_layer.", "mtp.")  # GPTModel's modules; the rest is not weights
LAYERS = "decoder.layers."
EXPERTS = "mlp.experts.experts."  # the experts' sharded prefix in a layer: one expert axis
# TE's fused norms (the local spec saves its own norms under these names) -> the local spec's modules
FUSED_NORMS = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
               ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))
_NUMBERED = re.compile(r"(\d+)\.(.+)")


# -- names ----------------------------------------------------------------------------------------

def prepended_axes(key: str) -> int:
    """How many axes dist_checkpointing prepends to a model tensor saved under ``key`` (layer, expert)."""
    if not key.startswith(LAYERS):
        return 0
    numbered = _NUMBERED.fullmatch(key[len(LAYERS):])
    rest = numbered[2] if numbered else key[len(LAYERS):]
    return (0 if numbered else 1) + rest.startswith(EXPERTS)


def canonical_name(key: str, index: Sequence[int]) -> str:
    """The canonical name of the slice at ``index`` (its position on the prepended axes) of ``key``."""
    if not key.startswith(LAYERS):
        return key
    rest, axes = key[len(LAYERS):], list(index)
    numbered = _NUMBERED.fullmatch(rest)
    layer, rest = (int(numbered[1]), numbered[2]) if numbered else (axes.pop(0), rest)
    if rest.startswith(EXPERTS):
        return expert_key(layer, axes.pop(0), rest[len(EXPERTS):])
    for fused, own in FUSED_NORMS:
        if rest.startswith(fused):
            return layer_key(layer, own + rest[len(fused):])
    return layer_key(layer, rest)


# -- the metadata ----------------------------------------------------------------------------------

def _metadata(path: Path) -> Metadata:
    """The checkpoint's torch.distributed.checkpoint metadata, or InputError saying what ``path`` is."""
    problem = dist_directory_problem(path)
    if problem is not None:
        raise InputError(*problem)
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # a truncated or foreign .metadata fails in pickle, in any of its ways
        raise InputError(f"{path}/.metadata cannot be read ({type(exc).__name__}: {exc});",
                         "copy the checkpoint again; its files are incomplete or damaged.") from None


# -- reading ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Slice:
    """One canonical tensor in a checkpoint: ``key`` at ``index`` on its prepended axes."""

    key: str
    index: tuple[int, ...]
    shape: Shape
    dtype: torch.dtype


def _slices(metadata: Metadata, origin: Path) -> dict[str, _Slice]:
    """Every canonical tensor the checkpoint holds, from its metadata alone (each stored chunk's offsets on
    the prepended axes say which layers and experts it has)."""
    out: dict[str, _Slice] = {}
    for key, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata) or not key.startswith(MODEL_KEYS) or is_extra_state(key):
            continue
        axes = prepended_axes(key)
        if len(md.size) <= axes:
            raise InputError(f"{origin}: {key} has shape {tuple(md.size)}, too few axes for a Megatron-Core GPT "
                             "model's tensor;", "start from a Megatron-Core GPT model's checkpoint.")
        indices = {i for c in md.chunks for i in itertools.product(
            *(range(o, o + s) for o, s in zip(c.offsets[:axes], c.sizes[:axes])))}
        for index in sorted(indices):
            name = canonical_name(key, index)
            if name in out:
                raise InputError(f"{origin}: {out[name].key} and {key} both hold {name};",
                                 "this checkpoint's keys are not Megatron-Core's GPT model's; convert it with "
                                 "Megatron-LM's tools.")
            out[name] = _Slice(key, index, tuple(md.size)[axes:], md.properties.dtype)
    if not out:
        some = ", ".join(list(metadata.state_dict_metadata)[:SHOWN]) or "none"
        raise InputError(f"{origin} holds no Megatron-Core GPT model weights (its keys: {some});",
                         "point at a checkpoint Megatron-LM or mcx's GPU backend saved with --ckpt-format torch_dist.")
    return out


def _narrow(tensor: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor


class _SlicePlanner(LoadPlanner):
    """Plans and lands the read of one canonical tensor: the chunk at its index on the prepended axes (size 1
    each), whole on the others. Only the stored chunks that overlap it are read."""

    def __init__(self, piece: _Slice) -> None:
        self.piece = piece
        self.target = torch.empty((*(1,) * len(piece.index), *piece.shape), dtype=piece.dtype)

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        piece = self.piece
        chunk = ChunkStorageMetadata(offsets=torch.Size((*piece.index, *(0,) * len(piece.shape))),
                                     sizes=self.target.size())
        # set_up_planner gave the checkpoint's metadata, whose tensors _slices read the piece from
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata[piece.key]
        assert isinstance(stored, TensorStorageMetadata), piece.key
        return LoadPlan(create_read_items_for_chunk_list(piece.key, stored, [chunk]))

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        raise TypeError(f"{read_item.dest_index.fqn} is stored as bytes, not as a tensor")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return _narrow(self.target, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        """Already in place: resolve_tensor gave a view of the target."""


def _plan(reader: FileSystemReader, metadata: Metadata, planner: _SlicePlanner) -> LoadPlan:
    """torch.distributed.checkpoint.load's steps for one process (no_dist), on metadata read once."""
    planner.set_up_planner({planner.piece.key: planner.target}, metadata, True)
    local = reader.prepare_local_plan(planner.create_local_plan())
    return planner.finish_plan(reader.prepare_global_plan(planner.create_global_plan([local]))[0])


def read_full(path: Path) -> Weights:
    """The weights of a torch_dist checkpoint (``path``: see checkpoint_dir) as canonical Weights: the names
    and shapes from its metadata, each tensor read when indexed. Needs no torch.distributed."""
    path = checkpoint_dir(Path(path))
    metadata = _metadata(path)
    slices = _slices(metadata, path)
    reader = FileSystemReader(str(path))
    reader.set_up_storage_reader(metadata, is_coordinator=True)

    def read(name: str) -> torch.Tensor:
        planner = _SlicePlanner(slices[name])
        plan = _plan(reader, metadata, planner)
        if sum(math.prod(item.lengths) for item in plan.items) != planner.target.numel():
            raise InputError(f"{path}: {name} is stored only in part (in {planner.piece.key});",
                             "copy the checkpoint again: it is missing some of its chunks.")
        reader.read_data(plan, planner).wait()
        return planner.target.view(planner.piece.shape)

    return Weights({name: piece.shape for name, piece in slices.items()}, read, str(path))
