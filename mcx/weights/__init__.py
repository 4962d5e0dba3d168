"""A model's weights outside a model: the canonical form (``canonical.py``, its tensor names in ``names.py``),
and the formats weights come from and go to, one tensor at a time: Hugging Face directories (``hf.py``; their
config in ``hfconfig.py``, their tensor table and its check in ``hftensors.py``, safetensors headers in
``safetensors_header.py``), Megatron-Core distributed checkpoints (``dist.py``) and the CPU backend's state.pt.

A checkpoint's files carry their sizes and CRC-32 (``checksums.py``), checked by the worker and the control
plane alike. Modules that move tensors import torch; ``names``, ``hfconfig``, ``hftensors``,
``safetensors_header`` and ``checksums`` do not (the planner checks a Hugging Face source's config.json and
safetensors headers, and a parent checkpoint's files, before anything runs).

In detail: ``canonical.py`` holds the canonical form, the CPU model's state dict, as ``Weights`` (shapes up
front, each tensor read when asked for; the vocabulary's padding rows fitted; the strict fit check);
``hf.py`` converts Hugging Face safetensors <-> canonical (QKV and gate/up joins, reading shard headers
first, writing planned shards one at a time into a directory renamed into place); ``hfconfig.py`` is
config.json <-> ``[model]``, pure (the planner checks ``hf:`` sources with it); ``hftensors.py`` checks a
directory's tensors against config.json from the safetensors headers alone (the planner, ``import-hf`` and
the worker's reader, D49); ``dist.py`` reads a torch_dist checkpoint of any layout as canonical weights, names
and shapes from its ``.metadata``, each tensor's layer read alone through torch.distributed.checkpoint's
reader; ``paths.py`` knows checkpoint directories (state.pt, ``latest``, Megatron-LM's tracker,
``iter_NNNNNNN``, what makes a torch_dist checkpoint; pure); ``checksums.py`` records every checkpoint file's
size and CRC-32 by the rank that wrote it at the commit (D36), checked wherever a checkpoint is used (the
worker's load, ``mcx pull``, ``export-hf``, ``init.from``; D48); ``sources.py`` reads a checkpoint of any
format as canonical weights. Side effects: torch and safetensors inside the functions that move tensors;
reads and writes model directories.
"""
