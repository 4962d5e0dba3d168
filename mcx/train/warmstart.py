"""A stage that starts from other weights ([init] from; job.init): the source's full tensors, and a strict
load that names every tensor that does not fit.

The canonical form between backends and formats is the state_dict of mcx's CPU model (Megatron-Core's
GPTModel with the local layer spec, one chunk, no parallelism), full tensors by name:

* ``torch``: a CPU run's checkpoint, state.pt's "model" (already canonical);
* ``dist``: a GPU run's (or a Megatron-Core) distributed checkpoint, read tensor by tensor (fullstate.py);
* ``hf``: a Hugging Face model directory, mapped by mcx.hf.

The GPU backend loads a ``dist`` source of its own kind with dist_checkpointing directly (any layout).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mcx.errors import InputError
from mcx.train.job import InitFrom

STATE_FILE = "state.pt"
META = "meta.json"
SHOWN = 8  # tensors named in one error, then a count


def source_position(init: InitFrom) -> tuple[int, int]:
    """(step, consumed samples) the stage continues from: (0, 0) with ``reset_step``, else the source
    checkpoint's (a model directory has no step: the spec's rules refuse reset_step = false for it)."""
    if init.reset_step or init.format == "hf":
        return 0, 0
    try:
        meta = json.loads((Path(init.path) / META).read_text(encoding="utf-8"))
        return int(meta["step"]), int(meta["consumed_samples"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"init.reset_step = false: the source {init.path} has no readable {META} ({exc});",
                         "start from an mcx run's checkpoint, or set init.reset_step = true.") from None


def canonical_weights(init: InitFrom, model_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The source's weights as the canonical state_dict, for the tensors ``model_state`` names."""
    path = Path(init.path)
    if init.format == "torch":
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        return state["model"]
    if init.format == "hf":
        from mcx.hf.weights import read_hf_as_mcore

        return read_hf_as_mcore(path, model_state)
    from mcx.train.fullstate import read_full

    return dict(read_full(path))


def check_fits(weights: Mapping[str, Any], model_state: Mapping[str, torch.Tensor], source: str) -> None:
    """InputError naming every tensor the model has and the source lacks, has extra, or shapes otherwise."""
    want = {k: v for k, v in model_state.items() if not k.endswith("_extra_state")}
    have = {k: v for k, v in weights.items() if not k.endswith("_extra_state")}
    problems = [f"{k}: missing" for k in want if k not in have]
    problems += [f"{k}: not in this model" for k in have if k not in want]
    problems += [f"{k}: shape {tuple(have[k].shape)}, this model's is {tuple(want[k].shape)}"
                 for k in want if k in have and tuple(have[k].shape) != tuple(want[k].shape)]
    if problems:
        listed = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise InputError(f"init.from: the weights in {source} do not fit this spec's model ({listed});",
                         "start from a source with the same [model] shapes (num_layers, hidden_size, heads, "
                         "query groups, ffn and vocabulary sizes, experts).")
