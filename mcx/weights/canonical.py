"""The canonical form of a model's weights, between checkpoint formats and layouts.

A model's weights in canonical form are the state_dict of mcx's CPU model: Megatron-Core's GPTModel
with the local layer spec, one chunk, no parallelism, full tensors named as that model names them
(``decoder.layers.3.self_attention.linear_qkv.weight``, ``decoder.layers.0.mlp.experts.local_experts.2
.linear_fc1.weight``; ``_extra_state`` entries left out). Every source (a CPU run's state.pt, a
distributed checkpoint of any layout, a Hugging Face directory) is read as canonical weights, and every
target (a sharded GPU model, a Hugging Face export) is written from them.

``Weights`` reads each tensor when it is asked for, so a converter holds one tensor at a time, never the
model: the shapes are known up front (for the strict fit check) and the bytes come later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from mcx.errors import InputError

Shape = tuple[int, ...]
SHOWN = 8  # tensors named in one error, then a count


class Weights(Mapping[str, torch.Tensor]):
    """Canonical tensors by name, each read by ``read(name)`` when indexed; ``shapes`` without reading."""

    def __init__(self, shapes: Mapping[str, Shape], read: Callable[[str], torch.Tensor], origin: str) -> None:
        self.shapes: dict[str, Shape] = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
        self._read = read
        self.origin = origin  # what the tensors are read from, for messages

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor], origin: str) -> Weights:
        """Weights already in memory (a CPU run's state.pt)."""
        kept = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor) and not is_extra_state(k)}
        return cls({k: tuple(v.shape) for k, v in kept.items()}, kept.__getitem__, origin)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        tensor = self._read(name)
        if tuple(tensor.shape) != self.shapes[name]:
            raise ValueError(f"{self.origin}: {name} read as {tuple(tensor.shape)}, recorded as {self.shapes[name]}")
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def is_extra_state(name: str) -> bool:
    return name.endswith("_extra_state")


VOCAB_TENSORS = ("embedding.word_embeddings.weight", "output_layer.weight")


def with_vocab_rows(weights: Weights, rows: int, vocab: int) -> Weights:
    """``weights`` with the vocabulary tensors padded with zero rows, or cut, to ``rows`` (a model's padded
    vocabulary: Megatron pads to a multiple of make_vocab_size_divisible_by x TP). Only padding rows, those
    at or past the true ``vocab``, are added or dropped; any other difference stays for the fit check."""
    def fitted(shape: Shape) -> Shape:
        return (rows, *shape[1:]) if len(shape) == 2 and shape[0] != rows and min(shape[0], rows) >= vocab else shape

    shapes = {k: fitted(s) if k in VOCAB_TENSORS else s for k, s in weights.shapes.items()}

    def read(name: str) -> torch.Tensor:
        tensor = weights[name]
        if shapes[name] == tuple(tensor.shape):
            return tensor
        if tensor.shape[0] > rows:
            return tensor[:rows]
        pad = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
        return torch.cat([tensor, pad])

    return Weights(shapes, read, weights.origin)


def check_fits(weights: Weights, want: Mapping[str, Shape], source: str) -> None:
    """InputError naming every tensor the model has and the source lacks, has extra, or shapes otherwise
    (``want``: the model's canonical shapes), before any tensor is read."""
    have = weights.shapes
    want = {k: tuple(v) for k, v in want.items() if not is_extra_state(k)}
    problems = [f"{k}: missing" for k in want if k not in have]
    problems += [f"{k}: not in this model" for k in have if k not in want]
    problems += [f"{k}: shape {have[k]}, this model's is {want[k]}" for k in want if k in have and have[k] != want[k]]
    if problems:
        listed = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise InputError(f"init.from: the weights in {source} do not fit this spec's model ({listed});",
                         "start from a source with the same [model] shapes (num_layers, hidden_size, heads, "
                         "query groups, ffn and vocabulary sizes, experts).")
