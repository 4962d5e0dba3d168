"""A traced step's records, as the worker writes them (mcx.train.trace) and `mcx locate` reads them (D70).

The control plane asks for a trace with the job file's ``trace`` (a replay: mcx.ops.locate); each rank then
writes, under STAGE_DIR/trace/, one JSON line a record in execution order (``rank<R>.jsonl``) and the full
tensors of the records it kept (``tensors.rank<R>.pt``, a dict key -> tensor). A record's ``key`` names it by
logical coordinates only (the rank's parallel position, step, micro-batch, phase, module path, occurrence),
so the same operation has the same key in two runs of one model and layout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

TRACE_DIR = "trace"
REPLAYS_DIR = "replays"  # <run>/replays/<name>/: a replay's stage directory, a cache of `mcx locate`
# In execution order within a micro-batch: its input batch, each module's forward output (children before
# their parent), each module's output gradient in backward; after the step's backward, each parameter's
# gradient as the optimizer receives it, then each parameter after the optimizer's step.
Phase = Literal["batch", "forward", "backward", "grad", "update"]
PHASES: tuple[Phase, ...] = ("batch", "forward", "backward", "grad", "update")
POSITION = ("tp", "pp", "cp", "dp", "ep")  # a rank's parallel coordinates, as megatron.core.parallel_state gives them


@frozen(kw_only=True)
class TraceRequest:
    """The job file's ``trace``: trace step ``step`` (the stage resumes from its checkpoint, trains up to
    ``step`` and stops there, saving nothing); keep the full tensors of the first records up to
    ``keep_bytes`` a rank, and those named in ``keep`` whatever their size. ``layers`` (a replay across
    layouts, D74) also keeps, whatever their size, each micro-batch's tokens, every layer-level forward output
    (LAYER_LEVEL) and every parameter after the step; ``noise`` (the band's replay) adds one unit of rounding
    (the dtype's eps, relative, seeded) to each NOISED output in the traced step and to its gradient (D79)."""

    step: int
    keep_bytes: int = 64 * 2**20
    keep: tuple[str, ...] = ()
    layers: bool = False
    noise: bool = False


# The modules a cross-layout comparison gathers (their outputs are whole on every tensor-parallel rank, or
# vocabulary-split for output_layer), and the ones the band's replay adds rounding noise to: the outputs of
# the row-parallel reductions and the embedding, where layouts sum in another order.
LAYER_LEVEL = re.compile(r"^(embedding|decoder\.final_layernorm|output_layer|"
                         r"decoder\.layers\.\d+(\.self_attention|\.mlp)?)$")
NOISED = re.compile(r"^(embedding|decoder\.layers\.\d+\.(self_attention|mlp))$")


def records_file(rank: int) -> str:
    return f"rank{rank}.jsonl"


def tensors_file(rank: int) -> str:
    return f"tensors.rank{rank}.pt"


def record_key(rec: dict[str, Any]) -> str:
    """The record's logical name: the same operation in two runs of one model and layout has the same key."""
    where = ",".join(f"{k}{rec[k]}" for k in POSITION)
    return f"{where}/step{rec['step']}/mb{rec['micro_batch']}/{rec['phase']}/{rec['module']}#{rec['occurrence']}"


def trace_ranks(directory: Path) -> list[int]:
    """The ranks that wrote a trace under ``directory`` (a stage directory's trace/), ascending."""
    return sorted(int(p.name[4:-6]) for p in directory.glob("rank*.jsonl") if p.name[4:-6].isdigit())
