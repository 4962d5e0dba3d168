"""A model's weights outside a model: the canonical form (``canonical.py``, its tensor names in ``names.py``),
and the formats weights come from and go to, one tensor at a time: Hugging Face directories (``hf.py``; their
config in ``hfconfig.py``, their tensor table and its check in ``hftensors.py``, safetensors headers in
``safetensors_header.py``), Megatron-Core distributed checkpoints (``dist.py``) and the CPU backend's state.pt.

A checkpoint's files carry their sizes and CRC-32 (``checksums.py``), checked by the worker and the control
plane alike. Modules that move tensors import torch; ``names``, ``hfconfig``, ``hftensors``,
``safetensors_header`` and ``checksums`` do not (the planner checks a Hugging Face source's config.json and
safetensors headers, and a parent checkpoint's files, before anything runs).
"""
