"""A model's weights outside a model: the canonical form (``canonical.py``), and the formats weights
come from and go to, one tensor at a time: Hugging Face directories (``hf.py``, their config in
``hfconfig.py``), Megatron-Core distributed checkpoints (``dist.py``) and the CPU backend's state.pt.

Modules that move tensors import torch; ``hfconfig`` does not (the planner checks a Hugging Face
source's shapes before anything runs).
"""
