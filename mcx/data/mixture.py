"""A mixture's components on disk, for the control plane: what each holds and what the smoke stage takes.

The worker's Megatron-Core ``BlendedMegatronDatasetBuilder`` does the sampling (mcx.train.datasets); this
module only counts, from each component's ``.idx`` and manifest, without importing torch (D60).
"""

from __future__ import annotations

import math
from pathlib import Path

from attrs import frozen

from mcx.data.dataset import check_dataset, read_index, split_ranges, split_samples
from mcx.errors import DataError
from mcx.spec.schema import DataSpec

WHOLE = "1,0,0"  # a per-split mixture's component is read whole by its split (Megatron's blend_per_split)


@frozen
class Component:
    """One prepared dataset of a split's blend: its name (``mix.web``), directory, prefix and normalised share."""

    name: str
    key: str  # its path's spec key, for messages
    directory: Path
    prefix: str
    share: float  # the weight over the split's weights' sum (1.0 for a single dataset)
    weight: float | None = None  # as the spec writes it, what Megatron's blend takes; None: a single dataset


def blend(data: DataSpec, root: Path, split: str = "mix") -> list[Component]:
    """The components of ``split`` ("mix": training, and every split unless per-split; "valid"; "test") under
    ``root`` (the project, or the job's data_dir for a mixture); a single dataset is one component of share 1."""
    if data.path is not None:
        return [Component("dataset", "data.path", root / data.path, data.prefix, 1.0)] if split == "mix" else []
    parts = {"mix": data.mix, "valid": data.valid, "test": data.test}[split]
    total = math.fsum(p.weight for p in parts.values())
    return [Component(f"{split}.{name}", f"data.{split}.{name}.path", root / p.path, p.prefix, p.weight / total,
                      p.weight) for name, p in parts.items()]


def train_samples(data: DataSpec, root: Path, seq_length: int) -> int:
    """Samples of ``seq_length`` tokens in one epoch of the training data: the train split of each component
    (all of it for a per-split mixture), summed."""
    split = WHOLE if data.per_split else data.split
    return sum(split_samples(c.directory, split, seq_length, c.prefix)[0] for c in blend(data, root))


def train_tokens(data: DataSpec, root: Path) -> list[tuple[str, str, int, float]] | None:
    """(name, key, tokens in its training part, share) of each training component; None where one is not here."""
    split = WHOLE if data.per_split else data.split
    out = []
    for c in blend(data, root):
        try:
            manifest = check_dataset(c.directory, c.prefix)
            index = read_index(c.directory / f"{c.prefix}.idx", c.directory / f"{c.prefix}.bin")
        except (DataError, OSError):
            return None
        bounds = split_ranges(split, manifest["dataset"]["documents"])[0]
        tokens = 0 if bounds is None else int(index.sequence_lengths[bounds[0]:bounds[1]].sum(dtype="int64"))
        out.append((c.name, c.key, tokens, c.share))
    return out


def smoke_limit(data: DataSpec, root: Path, seq_length: int, data_fraction: float) -> int:
    """``smoke.data_fraction`` of a mixture's training samples (at least one): the smoke stage's subset."""
    train = train_samples(data, root, seq_length)
    if train < 1:
        raise DataError(f"the training data ({', '.join(c.key for c in blend(data, root))}) holds no sample of "
                        f"{seq_length} tokens.", "use more data or a shorter seq_length.")
    return max(1, math.ceil(data_fraction * train))
