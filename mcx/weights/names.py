"""Canonical tensor names (mcx.weights.canonical), without torch: the Hugging Face table (``hftensors``) and
the distributed checkpoint reader build them, and the planner checks a directory with that table."""

from __future__ import annotations


def layer_key(layer: int, rest: str) -> str:
    return f"decoder.layers.{layer}.{rest}"


def expert_key(layer: int, expert: int, rest: str) -> str:
    return f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.{rest}"
