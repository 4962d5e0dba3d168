"""A checkpoint's model weights as canonical Weights, whatever wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mcx.weights.checkpoint_files import STATE_FILE

if TYPE_CHECKING:
    from mcx.weights.canonical import Weights

Format = Literal["torch", "dist", "hf"]


def open_weights(path: Path, format: Format) -> Weights:
    """``torch``: a CPU run's state.pt (memory-mapped: only the model's tensors are read, when asked for);
    ``dist``: a Megatron-Core distributed checkpoint of any layout; ``hf``: a Hugging Face directory."""
    path = Path(path)
    if format == "torch":
        import torch

        from mcx.weights.canonical import Weights

        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        return Weights.of(state["model"], str(path))
    if format == "hf":
        from mcx.weights.hf_convert import hf_weights

        return hf_weights(path)
    from mcx.weights.dist import read_full

    return read_full(path)
