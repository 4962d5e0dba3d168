"""A stage that starts from other weights ([init] from; job.init): the source's full tensors, and a strict
load that names every tensor that does not fit.

The canonical form between backends and formats is the state_dict of mcx's CPU model (Megatron-Core's
GPTModel with the local layer spec, one chunk, no parallelism), full tensors by name:

* ``torch``: a CPU run's checkpoint, state.pt's "model" (already canonical);
* ``dist``: a GPU run's, or Megatron-LM's, distributed checkpoint of any layout (fullstate.read_full);
* ``hf``: a Hugging Face model directory (mcx.hf.read).

Each is read tensor by tensor (canonical.Weights). The GPU backend loads a ``dist`` source of its own
layer spec with dist_checkpointing directly (any layout), anything else with fullstate.load_full.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcx.errors import InputError
from mcx.contract.job import InitFrom
from mcx.weights.canonical import Weights, with_vocab_rows
from mcx.weights.sources import open_weights

META = "meta.json"


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


def canonical_weights(init: InitFrom, rows: int, vocab: int) -> Weights:
    """The source's weights in canonical form (mcx.weights), read tensor by tensor, with the vocabulary
    tensors padded or cut to this model's ``rows`` (``vocab``: the true vocabulary size)."""
    return with_vocab_rows(open_weights(Path(init.path), init.format), rows, vocab)
