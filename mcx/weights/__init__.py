"""A model's weights outside a model: the canonical form (``canonical.py``), and the formats weights
come from and go to, one tensor at a time: Hugging Face directories (``hf.py``, their config in
``hfconfig.py``), Megatron-Core distributed checkpoints (``dist.py``) and the CPU backend's state.pt.

A checkpoint's files carry their sizes and CRC-32 (``checksums.py``), checked by the worker and the control
plane alike. Modules that move tensors import torch; ``hfconfig`` and ``checksums`` do not (the planner checks a Hugging Face
source's shapes before anything runs).
"""
