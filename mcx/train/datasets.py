"""Training data in the worker: Megatron-Core GPT datasets over a prepared dataset, and batches.

:func:`build_datasets` builds the train/valid/test ``GPTDataset`` splits with Megatron-Core's
``BlendedMegatronDatasetBuilder``, exactly as Megatron-LM's ``pretrain_gpt.py`` does for a single
``--data-path`` prefix with ``--split``. Its shuffled sample indices are cached as ``.npy`` files in
``cache_dir`` (the stage directory's, never the dataset directory, whose DVC hash must not change);
the cache is keyed by MCore's description of the inputs and holds the same arrays whether it was hit
or missed, so it cannot change what the model sees.

Under ``torch.distributed`` (gloo or NCCL) the builder works as in Megatron-LM 0.19: global rank 0
builds the indices and writes the cache, all ranks meet at a barrier, then the other ranks load the
cache. ``cache_dir`` must therefore be on a filesystem every rank sees.

:func:`iterate_batches` is Megatron-LM's ``MegatronPretrainingSampler`` made explicit: the position
in the data is the number of samples consumed so far, each global step takes the next
``micro_batch_size * dp_size`` indices and data-parallel rank ``r`` gets the ``r``-th slice of
``micro_batch_size`` of them. A run resumed at ``consumed_samples`` therefore continues with exactly
the batches it would have seen.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from attrs import frozen

from mcx.data import mixture
from mcx.data.dataset import check_dataset, split_ranges
from mcx.data.mixture import Component
from mcx.data.tokenizer import Tokenizer, load_saved
from mcx.errors import DataError
from mcx.spec.schema import ExperimentSpec

if TYPE_CHECKING:
    from mcx.train.backend import Batch

with warnings.catch_warnings():  # megatron.core warns at import about optional CUDA packages
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizerBase


class MegatronTokenizerAdapter(MegatronTokenizerBase):
    """An mcx tokenizer in the shape Megatron-Core's datasets use: ``eod``, ``pad``, ``vocab_size``
    and ``unique_identifiers`` (part of the index cache key: the tokenizer's content, not its path)."""

    def __init__(self, tokenizer: Tokenizer, data_dir: Path) -> None:
        super().__init__(str(data_dir), {})
        self._tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    @property
    def eod(self) -> int:
        return self._tokenizer.eod

    @property
    def pad(self) -> int:
        # -1 is MCore's "no pad token" (megatron_dataset._PAD_TOKEN_ID): ids are never negative.
        return self._tokenizer.pad if self._tokenizer.pad is not None else -1

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict(sorted(self._tokenizer.identity().items()))

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def detokenize(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    @property
    def vocab(self) -> dict[str, int]:
        raise NotImplementedError("mcx datasets are pre-tokenized; the vocabulary is in the dataset's tokenizer files")

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("mcx trains on plain pre-tokenized text")


@frozen
class Datasets:
    train: GPTDataset | BlendedDataset | RepeatedSubset  # RepeatedSubset: the smoke stage's (train_samples_limit)
    valid: GPTDataset | None
    test: GPTDataset | None
    tokenizer: MegatronTokenizerAdapter
    manifest: dict[str, Any]
    samples: tuple[int, int, int]  # what was asked for; each split holds at least that many
    components: tuple[Component, ...] = ()  # the training blend's, for a mixture (D60); () for one dataset

    def drawn(self, consumed_samples: int) -> dict[str, int]:
        """Training samples taken from each component in the first ``consumed_samples``, as Megatron-Core's
        ``BlendedDataset.dataset_index`` assigns them (the smoke stage's subset repeats its first ``limit``)."""
        if not self.components:
            return {}
        train, limit = self.train, None
        if isinstance(train, RepeatedSubset):
            train, limit = train.dataset, train.limit
        index = np.asarray(train.dataset_index)
        n = len(self.components)
        if limit is None:
            counts = np.bincount(index[:consumed_samples], minlength=n)
        else:
            whole, rest = divmod(consumed_samples, limit)
            counts = whole * np.bincount(index[:limit], minlength=n) + np.bincount(index[:rest], minlength=n)
        return {c.name: int(k) for c, k in zip(self.components, counts, strict=True)}


class RepeatedSubset(torch.utils.data.Dataset):
    """The first ``limit`` samples of ``dataset`` (distinct, in its shuffled order), repeated to
    ``length``: sample ``i`` is ``dataset[i % limit]``. The smoke stage trains on this subset."""

    def __init__(self, dataset: GPTDataset, limit: int, length: int) -> None:
        if not 0 < limit <= len(dataset):
            raise ValueError(f"limit {limit} outside 1..{len(dataset)}")
        self.dataset, self.limit, self.length = dataset, limit, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not 0 <= idx < self.length:
            raise IndexError(idx)
        return self.dataset[idx % self.limit]


def num_samples(train_iters: int, global_batch_size: int, eval_interval: int, eval_iters: int) -> tuple[int, int, int]:
    """Samples per split, as Megatron-LM's ``get_train_valid_test_num_samples``: evaluation runs
    every ``eval_interval`` steps and once at the end, ``eval_iters`` global batches each."""
    evals = (train_iters // eval_interval + 1) if eval_interval > 0 else 1
    return train_iters * global_batch_size, evals * eval_iters * global_batch_size, eval_iters * global_batch_size


def build_datasets(
    data_dir: Path,
    *,
    prefix: str,
    split: str,
    seq_length: int,
    seed: int,
    samples: tuple[int, int, int],
    cache_dir: Path,
    train_samples_limit: int | None = None,
    is_built_on_rank: Callable[[], bool] = lambda: True,
    verify_contents: bool = False,
) -> Datasets:
    """Build the three splits over ``data_dir/prefix`` with at least ``samples`` samples each.

    ``train_samples_limit`` (the smoke stage's subset): train on only that many distinct samples,
    repeated to ``samples[0]``. Splits with weight 0 in ``split`` are ``None``.
    """
    one = Component("dataset", "data.path", Path(data_dir), prefix, 1.0, weight=None)
    return build_blend((one,), None, None, split=split, seq_length=seq_length, seed=seed, samples=samples,
                       cache_dir=cache_dir, train_samples_limit=train_samples_limit,
                       is_built_on_rank=is_built_on_rank, verify_contents=verify_contents)


def build_blend(
    train: tuple[Component, ...],
    valid: tuple[Component, ...] | None,
    test: tuple[Component, ...] | None,
    *,
    split: str | None,
    seq_length: int,
    seed: int,
    samples: tuple[int, int, int],
    cache_dir: Path,
    train_samples_limit: int | None = None,
    is_built_on_rank: Callable[[], bool] = lambda: True,
    verify_contents: bool = False,
) -> Datasets:
    """The splits over a blend of prepared datasets, as Megatron-LM's ``pretrain_gpt.py`` builds them: with
    ``split``, every component of ``train`` is split so and the splits blended by weight (a weighted
    ``--data-path``: ``GPTDatasetConfig.blend``); without it (``valid`` / ``test`` given), each split reads its
    own components whole (``--train/--valid/--test-data-path``: ``blend_per_split``). A component whose
    ``weight`` is None is a single unweighted ``--data-path``. Megatron-Core's ``BlendedDataset`` draws the
    samples; nothing here samples.
    """
    every = [*train, *(valid or ()), *(test or ())]
    manifests = {c.name: check_dataset(c.directory.absolute(), c.prefix, contents=verify_contents) for c in every}
    first = every[0]
    for c in every[1:]:  # the control plane checked this at planning (mcx.fingerprint.data); a job file may be older
        if manifests[c.name]["tokenizer"] != manifests[first.name]["tokenizer"]:
            raise DataError(f"{c.key} = {str(c.directory)!r} was prepared with another tokenizer than {first.key};",
                            "prepare every component of the mixture with the same tokenizer.")
    manifest = manifests[first.name]
    data_dir = first.directory.absolute()
    tokenizer = MegatronTokenizerAdapter(load_saved(data_dir, manifest["tokenizer"]["kind"]), data_dir)
    if split is not None:
        for c in train:
            _check_splits(c.directory, manifests[c.name], split, samples)
    train_size = samples[0] if train_samples_limit is None else min(train_samples_limit, samples[0])
    if train_size < 1:
        raise DataError(f"train_samples_limit = {train_samples_limit} leaves no training data.", "use at least 1.")

    def blend(parts: tuple[Component, ...] | None) -> tuple[list[str], list[float] | None] | None:
        if not parts:
            return None
        weights = [c.weight for c in parts]
        return ([str(c.directory.absolute() / c.prefix) for c in parts],
                None if any(w is None for w in weights) else [float(w) for w in weights if w is not None])

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=blend(train) if split is not None else None,
        blend_per_split=None if split is not None else [blend(train), blend(valid), blend(test)],
        split=split,
        path_to_cache=str(Path(cache_dir).absolute()),
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # causal attention builds its own mask
        mmap_bin_files=True,
        num_dataset_builder_threads=1,
    )
    builder = BlendedMegatronDatasetBuilder(GPTDataset, [train_size, samples[1], samples[2]], is_built_on_rank, config)
    train_set, valid_set, test_set = builder.build()
    if train_set is not None and train_samples_limit is not None:
        train_set = RepeatedSubset(train_set, train_size, samples[0])
    blended = isinstance(train_set.dataset if isinstance(train_set, RepeatedSubset) else train_set, BlendedDataset)
    return Datasets(train=train_set, valid=valid_set, test=test_set, tokenizer=tokenizer, manifest=manifest,
                    samples=samples, components=tuple(train) if blended else ())


def datasets_from_spec(
    spec: ExperimentSpec,
    data_dir: Path,
    cache_dir: Path,
    *,
    train_samples_limit: int | None = None,
    is_built_on_rank: Callable[[], bool] = lambda: True,
    verify_contents: bool = False,
) -> Datasets:
    """:func:`build_datasets` with the sizes, seed and split of ``spec`` (one stage's spec); for a mixture,
    :func:`build_blend` over its components, whose paths start at ``data_dir`` (the job's; D60)."""
    t = spec.train
    samples = num_samples(t.train_iters, t.global_batch_size, t.eval_interval, t.eval_iters)
    if spec.data.path is not None:
        return build_datasets(data_dir, prefix=spec.data.prefix, split=spec.data.split,
                              seq_length=spec.model.seq_length, seed=t.seed, samples=samples, cache_dir=cache_dir,
                              train_samples_limit=train_samples_limit, is_built_on_rank=is_built_on_rank,
                              verify_contents=verify_contents)
    data = spec.data
    per_split = data.per_split
    return build_blend(tuple(mixture.blend(data, data_dir)),
                       tuple(mixture.blend(data, data_dir, "valid")) if per_split else None,
                       tuple(mixture.blend(data, data_dir, "test")) if per_split else None,
                       split=None if per_split else data.split, seq_length=spec.model.seq_length, seed=t.seed,
                       samples=samples, cache_dir=cache_dir, train_samples_limit=train_samples_limit,
                       is_built_on_rank=is_built_on_rank, verify_contents=verify_contents)


def _check_splits(data_dir: Path, manifest: dict[str, Any], split: str, samples: tuple[int, int, int]) -> None:
    """Every split that must supply samples has at least one document (else MCore loops forever)."""
    n = manifest["dataset"]["documents"]
    for name, bounds, wanted in zip(("train", "valid", "test"), split_ranges(split, n), samples, strict=True):
        if bounds is not None and wanted > 0 and bounds[1] <= bounds[0]:
            raise DataError(
                f"data.split = {split!r} gives the {name} split none of the {n} documents in {data_dir}.",
                f"raise the {name} weight, or set it to 0 to skip that split.",
            )


def _collate(samples: list[dict[str, torch.Tensor]]) -> Batch:
    def stacked(key: str) -> torch.Tensor:
        return torch.stack([s[key] for s in samples])

    return {"tokens": stacked("tokens"), "labels": stacked("labels"), "loss_mask": stacked("loss_mask"),
            "position_ids": stacked("position_ids"), "attention_mask": None}  # causal: the attention kernel masks


def sample_indices(
    consumed_samples: int, total_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int
) -> Iterator[range]:
    """The sample indices of each micro-batch of ``dp_rank``: ``MegatronPretrainingSampler``'s
    order (drop_last=True) from ``consumed_samples`` up to ``total_samples``."""
    if micro_batch_size < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size or consumed_samples < 0:
        raise ValueError(f"bad sampler state: consumed={consumed_samples} mbs={micro_batch_size} rank={dp_rank}/{dp_size}")
    step = micro_batch_size * dp_size
    first = dp_rank * micro_batch_size
    for start in range(consumed_samples, total_samples - step + 1, step):
        yield range(start + first, start + first + micro_batch_size)


def iterate_batches(
    dataset: GPTDataset | BlendedDataset | RepeatedSubset,
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    *,
    total_samples: int | None = None,
) -> Iterator[Batch]:
    """Micro-batches for data-parallel rank ``dp_rank`` from sample ``consumed_samples`` on.

    Step ``k`` covers samples ``consumed_samples + k*m*dp_size`` and the next ``m*dp_size``
    (``m`` = ``micro_batch_size``); this rank gets the ``dp_rank``-th run of ``m``. A global batch of
    ``G`` samples is ``G / (m*dp_size)`` consecutive steps, so after ``n`` iterations
    ``consumed_samples = n*G`` (the value to store in a checkpoint). Stops before an incomplete step
    or at ``total_samples`` (default: the dataset's length). Batches hold ``tokens``, ``labels``
    (int64), ``loss_mask`` (float32), ``position_ids`` (int64), each ``[m, seq_length]``, and
    ``attention_mask`` None.
    """
    total = len(dataset) if total_samples is None else min(total_samples, len(dataset))
    for indices in sample_indices(consumed_samples, total, micro_batch_size, dp_rank, dp_size):
        yield _collate([dataset[i] for i in indices])
