"""Canonical weights (mcx.weights.canonical) into the shards of a model of any layout (TP, PP, VPP, EP) and
layer spec: what each local tensor is comes from the model's own ``sharded_state_dict()``, so the layout
mapping is Megatron-Core's, and its sharded keys name canonical tensors as mcx.weights.dist reads them.
The GPU backend loads a ``hf:`` source, or a CPU run's checkpoint, this way.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mcx.weights.canonical import Shape, Weights, check_fits, is_extra_state
from mcx.weights.dist import canonical_name, prepended_axes

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel


# -- loading into a sharded model -------------------------------------------------------------------

@dataclass(frozen=True)
class _Shard:
    """One local tensor of the model: ``region`` of canonical tensor ``name``."""

    name: str
    region: tuple[slice, ...]
    target: torch.Tensor


def _shards(chunks: list[GPTModel]) -> tuple[list[_Shard], dict[str, Shape]]:
    """This rank's shards, from the chunks' sharded state dicts (swiglu factories built), and the canonical
    shapes of every layer and expert the prepended axes span (those of other ranks too)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    shards: list[_Shard] = []
    shapes: dict[str, Shape] = {}
    spanned: set[str] = set()
    for chunk in chunks:
        sd = chunk.sharded_state_dict(metadata={"singleton_local_shards": False})
        apply_factories(sd)
        owned = {t.untyped_storage().data_ptr() for t in itertools.chain(chunk.parameters(), chunk.buffers())}
        for sh in nested_values(sd):
            if not isinstance(sh, ShardedTensor) or is_extra_state(sh.key):
                continue
            axes = sh.prepend_axis_num
            if axes != prepended_axes(sh.key):  # the table above no longer says what Megatron-Core does
                raise RuntimeError(f"{sh.key}: {axes} prepended axes, fullstate expects {prepended_axes(sh.key)}")
            if sh.data.untyped_storage().data_ptr() not in owned:  # a copy: writing it would not reach the model
                raise RuntimeError(f"{sh.key}: the sharded state dict's tensor is not the model's own storage")
            full = tuple(sh.global_shape[axes:])
            if sh.key not in spanned:  # once a key: an MoE rank holds thousands of its (layer, expert) shards
                spanned.add(sh.key)
                shapes.update((canonical_name(sh.key, index), full)
                              for index in itertools.product(*(range(n) for n in sh.global_shape[:axes])))
            region = tuple(slice(o, o + n) for o, n in zip(sh.global_offset[axes:], sh.local_shape))
            shards.append(_Shard(canonical_name(sh.key, sh.global_offset[:axes]), region, sh.data))
    return shards, shapes


def _whole_model(chunks: list[GPTModel], shapes: dict[str, Shape]) -> dict[str, Shape]:
    """``shapes`` merged over the pipeline stages (each stage alone sees its own embedding or output layer)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return shapes
    group = chunks[0].pg_collection.pp
    if dist.get_world_size(group) == 1:
        return shapes
    parts: list[dict[str, Shape] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, shapes, group=group)
    return {name: shape for part in parts for name, shape in (part or {}).items()}


@torch.no_grad()
def load_full(chunks: list[GPTModel], weights: Weights) -> None:
    """Copy canonical full tensors into this rank's shards of ``chunks`` (this rank's model chunks, any
    layout and layer spec). Every tensor the whole model lacks, has extra or shapes otherwise is named
    first (check_fits); then each canonical tensor is read once and its shards copied (``copy_`` converts
    device and dtype). Collective over the pipeline group."""
    shards, shapes = _shards(chunks)
    check_fits(weights, _whole_model(chunks, shapes), weights.origin)
    by_name: dict[str, list[_Shard]] = defaultdict(list)
    for shard in shards:
        by_name[shard.name].append(shard)
    for name, group in by_name.items():
        full = weights[name]
        for shard in group:
            shard.target.copy_(full[shard.region])
