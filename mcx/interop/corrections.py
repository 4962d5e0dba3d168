"""Arguments Megatron-LM accepts and then overrides: the spec says what actually trains.

Megatron-LM's ``validate_args`` and its layer specs quietly drop a few settings the parser took;
the import writes the value that trains, and a note says why. ``--set`` values are left alone.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from mcx.interop.pretrain_args import Ctx
from mcx.spec.convert import toml_value


@frozen
class Correction:
    key: str
    flag: str  # the argument Megatron-LM overrides
    applies: Callable[[Ctx], bool]  # over the imported values
    value: object  # what Megatron-LM trains with instead
    why: str


CORRECTIONS: tuple[Correction, ...] = (
    Correction("parallel.sequence_parallel", "--sequence-parallel",
               lambda c: bool(c.view("parallel.sequence_parallel")) and (c.view("parallel.tensor") or 1) == 1,
               False, "validate_args turns sequence parallelism off at --tensor-model-parallel-size 1"),
    Correction("train.te_op_fuser", "--use-transformer-engine-op-fuser",
               lambda c: bool(c.view("train.te_op_fuser")) and c.view("model.transformer_impl") == "local",
               False, "Megatron-LM builds the local layers without it (it applies to Transformer Engine layers only)"),
    Correction("checkpoint.async_save", "--async-save",
               lambda c: bool(c.view("checkpoint.async_save")) and not c.has("--use-persistent-ckpt-worker"),
               False, "validate_args turns asynchronous saves off without --use-persistent-ckpt-worker"),
)


def apply_corrections(ctx: Ctx) -> None:
    for c in CORRECTIONS:
        if c.key in ctx.pinned or not c.applies(ctx):
            continue
        ctx.set(c.key, c.value, c.flag, f"Megatron-LM: {c.why}")
        ctx.notes.append(f"{c.flag} has no effect here: {c.why}; {c.key} = {toml_value(c.value)}")
