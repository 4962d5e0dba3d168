"""A model's weights outside a model: the canonical form (``canonical.py``, its tensor names in ``names.py``),
and the formats weights come from and go to, one tensor at a time: Hugging Face directories (``hf.py``; their
config in ``hfconfig.py``, their tensor table and its check in ``hftensors.py``, safetensors headers in
``safetensors_header.py``), Megatron-Core distributed checkpoints (``dist.py``) and the CPU backend's state.pt.

Modules that move tensors import torch; ``names``, ``hfconfig``, ``hftensors`` and ``safetensors_header`` do
not (the planner checks a Hugging Face source's config.json and safetensors headers before anything runs).
"""
