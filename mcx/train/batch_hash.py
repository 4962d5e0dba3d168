"""The hash of every micro-batch a step trains on, per data-parallel rank: ``ranks/batches.dp<D>.jsonl``.

Each micro-batch's digest is xxh3_64 (the xxhash package) over the exact host tensors the model is given
(tokens, labels, loss mask, position ids, and the attention mask where there is one), each prefixed by its
name, dtype and shape. It is taken as the batch is read (on the prefetch thread, mcx.train.prefetch, while the
step before trains) and before the backend copies the batch to the device, so it adds no device
sync; its cost is in docs/benchmarks.md (D69). Tensor- and context-parallel ranks of one data-parallel
rank, and its pipeline stages, read the same batch (each takes the whole micro-batch from the same
sampler; CP slices it on the device), so one rank a data-parallel rank writes the file: TP rank 0, CP
rank 0 of the first pipeline stage (``World.records_batches``).

A line per step, ``{"kind": "train", "step": N, "batches": ["<16 hex>", ...]}`` (micro-batches in the
order trained), appended and flushed as the step's metrics are; a resumed rank cuts the file back to its
checkpoint's step, as metrics.jsonl is, so a step has exactly one line. ``mcx.metrics.batches`` reads
them back for `mcx reproduce` and `mcx compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import xxhash

from mcx.contract.files import RANKS_DIR, batch_hashes_file
from mcx.train.metrics import MetricsFile

if TYPE_CHECKING:
    from mcx.train.backend import Batch

FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")  # Batch's keys, in hash order


def batch_digest(mb: Batch) -> str:
    """One micro-batch's digest (16 hex digits) over its host tensors' bytes, names, dtypes and shapes."""
    h = xxhash.xxh3_64()  # 64 bits: a chance collision among a run's few million micro-batches is ~1e-7
    for name in FIELDS:
        t: torch.Tensor | None = mb.get(name)  # type: ignore[assignment]
        if t is None:
            continue
        if t.device.type != "cpu":  # the loop hashes before the copy to the device; never a device sync here
            raise ValueError(f"batch_digest: {name} is on {t.device}, not on the host")
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # raw bytes, any dtype
    return h.hexdigest()


def batch_digests(microbatches: list[Batch]) -> list[str]:
    """Every micro-batch's digest, in the order they are trained."""
    return [batch_digest(mb) for mb in microbatches]


class BatchHashes:
    """The batch-hash file of one data-parallel rank, written by its one recording rank."""

    def __init__(self, stage_dir: Path, dp_rank: int) -> None:
        folder = stage_dir / RANKS_DIR
        folder.mkdir(exist_ok=True)
        self.file = MetricsFile(folder / batch_hashes_file(dp_rank), enabled=True)

    def truncate_after(self, step: int) -> None:
        self.file.truncate_after(step, final=False)

    def record(self, step: int, digests: list[str]) -> None:
        """Step ``step`` trained on micro-batches with these digests (``batch_digests``, taken before the step)."""
        self.file.append({"kind": "train", "step": step, "batches": digests})

    def close(self) -> None:
        self.file.close()
