"""A prepared dataset directory: its manifest and the checks that it is whole.

Layout (written by :func:`mcx.data.prepare.prepare`)::

    <dir>/manifest.json       what the dataset is (this module reads it)
    <dir>/<prefix>.bin        token ids, one sequence per document (Megatron-Core IndexedDataset)
    <dir>/<prefix>.idx        the index: dtype, sequence lengths and offsets, document boundaries
    <dir>/tokenizer.json ...  the tokenizer's files, see mcx.data.tokenizer.SAVED_FILES

:func:`check_dataset` reads the ``.idx`` with NumPy alone (no torch, no megatron) and checks every
size and offset against the ``.bin``, so a truncated or corrupt file is a :class:`DataError` naming
the file and the fix, never a traceback from deep inside Megatron-Core.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from mcx.errors import DataError
from mcx.hashing import file_sha256

if TYPE_CHECKING:
    import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1

# Megatron-Core's .idx layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter).
_IDX_MAGIC = b"MMIDIDX\x00\x00"
_IDX_VERSION = 1
_IDX_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}

# --force: plain `dvc checkout` refuses to overwrite a file that differs from its record (a corrupt one)
_RESTORE = ("restore it with `dvc checkout --force` (or `dvc pull --force`), or prepare it again with "
            "`mcx data prepare --force`.")


@frozen
class Index:
    """The contents of a ``.idx`` file."""

    dtype: str  # NumPy name of the token dtype
    sequence_lengths: np.ndarray  # int32, tokens per sequence
    document_indices: np.ndarray  # int64, sequence index where each document starts, then the end

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype="int64"))


def token_dtype(idx_path: Path) -> str | None:
    """The token dtype an ``.idx`` header names (its first bytes only); None when it is not a readable
    Megatron-Core index of integer tokens (``read_index`` says what is wrong)."""
    try:
        with open(idx_path, "rb") as f:
            header = f.read(_IDX_HEADER.size)
    except OSError:
        return None
    if len(header) < _IDX_HEADER.size:
        return None
    magic, version, code, _, _ = _IDX_HEADER.unpack(header)
    dtype = _DTYPES.get(code) if (magic, version) == (_IDX_MAGIC, _IDX_VERSION) else None
    return dtype if dtype is not None and not dtype.startswith("float") else None


def read_index(idx_path: Path, bin_path: Path) -> Index:
    """Read and check a Megatron-Core index against its data file."""
    import numpy as np

    def bad(what: str) -> DataError:
        return DataError(f"{idx_path} is corrupt: {what}.", _RESTORE)

    try:
        idx_size = idx_path.stat().st_size
        bin_size = bin_path.stat().st_size
        with open(idx_path, "rb") as f:
            header = f.read(_IDX_HEADER.size)
    except FileNotFoundError as exc:
        raise DataError(f"{exc.filename} is missing.", _RESTORE) from None
    if len(header) < _IDX_HEADER.size:
        raise bad(f"{idx_size} bytes, shorter than the {_IDX_HEADER.size}-byte header (truncated)")
    magic, version, code, n_seq, n_doc = _IDX_HEADER.unpack(header)
    if magic != _IDX_MAGIC:
        raise bad("not a Megatron-Core index (bad magic bytes)")
    if version != _IDX_VERSION:
        raise bad(f"index version {version}, expected {_IDX_VERSION}")
    if code not in _DTYPES:
        raise bad(f"unknown dtype code {code}")
    expected = _IDX_HEADER.size + n_seq * (4 + 8) + n_doc * 8
    if idx_size != expected:
        raise bad(f"{idx_size} bytes, but its header promises {expected} ({'truncated' if idx_size < expected else 'trailing bytes'})")
    data = np.memmap(idx_path, dtype=np.uint8, mode="r")
    offset = _IDX_HEADER.size
    lengths = np.frombuffer(data, dtype=np.int32, count=n_seq, offset=offset)
    pointers = np.frombuffer(data, dtype=np.int64, count=n_seq, offset=offset + 4 * n_seq)
    doc_idx = np.frombuffer(data, dtype=np.int64, count=n_doc, offset=offset + 12 * n_seq)
    dtype = _DTYPES[code]
    itemsize = np.dtype(dtype).itemsize
    if n_seq and lengths.min() < 0:
        raise bad("negative sequence length")
    starts = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))) * itemsize if n_seq else pointers
    if not np.array_equal(pointers, starts):
        raise bad("sequence offsets do not follow the sequence lengths")
    if n_doc < 1 or doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0):
        raise bad("document boundaries do not cover the sequences")
    tokens = int(lengths.sum(dtype=np.int64))
    if bin_size != tokens * itemsize:
        raise DataError(
            f"{bin_path} has {bin_size} bytes, but {idx_path.name} describes {tokens} tokens of "
            f"{itemsize} bytes ({tokens * itemsize} bytes){' (truncated)' if bin_size < tokens * itemsize else ''}.",
            _RESTORE,
        )
    return Index(dtype=dtype, sequence_lengths=lengths, document_indices=doc_idx)


def read_manifest(data_dir: Path) -> dict[str, Any]:
    path = data_dir / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not data_dir.is_dir():
            raise DataError(
                f"dataset directory {data_dir} does not exist.", "prepare it with `mcx data prepare`, or restore it with `dvc pull`."
            ) from None
        raise DataError(f"{data_dir} is not a prepared dataset (no {MANIFEST}).", "prepare it with `mcx data prepare`.") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg}).", _RESTORE) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path} is not an mcx dataset manifest of format {FORMAT}.", "prepare the dataset again with this mcx.")
    try:
        dataset, tokenizer = manifest["dataset"], manifest["tokenizer"]
        well_formed = (
            isinstance(manifest["prefix"], str)
            and all(isinstance(dataset[k], int) for k in ("documents", "tokens"))
            and isinstance(dataset["dtype"], str)
            and isinstance(tokenizer["kind"], str)
            and all(isinstance(f, dict) for f in (dataset["files"], tokenizer["files"]))
        )
    except (KeyError, TypeError):
        well_formed = False
    if not well_formed:
        raise DataError(f"{path} lacks fields of an mcx dataset manifest.", _RESTORE)
    return manifest


def check_dataset(data_dir: Path, prefix: str | None = None, *, contents: bool = False) -> dict[str, Any]:
    """Check a prepared dataset and return its manifest.

    Always: the manifest, the index structure against the data file, the counts against the
    manifest, and that the tokenizer's files exist. With ``contents=True`` also the sha256 of every
    file (reads everything once; DVC checks the same for tracked data).
    """
    manifest = read_manifest(data_dir)
    if prefix is not None and prefix != manifest["prefix"]:
        raise DataError(
            f"data.prefix = {prefix!r}, but {data_dir} holds the dataset {manifest['prefix']!r}.",
            f"set data.prefix = {manifest['prefix']!r}.",
        )
    prefix = manifest["prefix"]
    index = read_index(data_dir / f"{prefix}.idx", data_dir / f"{prefix}.bin")
    counts = manifest["dataset"]
    if (index.documents, index.tokens, index.dtype) != (counts["documents"], counts["tokens"], counts["dtype"]):
        raise DataError(
            f"{data_dir}/{prefix}.idx holds {index.documents} documents and {index.tokens} {index.dtype} tokens, "
            f"but {MANIFEST} says {counts['documents']} and {counts['tokens']} {counts['dtype']}.",
            _RESTORE,
        )
    files = {**counts["files"], **manifest["tokenizer"]["files"]}
    for name, sha256 in sorted(files.items()):
        path = data_dir / name
        if not path.is_file():
            raise DataError(f"{path} is missing.", _RESTORE)
        if contents and file_sha256(path) != sha256:
            raise DataError(f"{path} differs from the sha256 in {MANIFEST}.", _RESTORE)
    return manifest


def split_ranges(split: str, n_documents: int) -> list[tuple[int, int] | None]:
    """Document ranges ``[begin, end)`` of the train, valid and test splits, or None for a split of
    weight 0: Megatron-Core's arithmetic (``parse_and_normalize_split``,
    ``convert_split_vector_to_split_matrix``, the builder's ``round``), without importing it."""
    weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    weights += [0.0] * (3 - len(weights))
    total = 0.0
    for w in weights:  # sequential, as numpy.sum of three (Python 3.12's sum() compensates)
        total += w
    if len(weights) != 3 or total <= 0.0:
        raise DataError(f"data.split = {split!r} is not a train,valid,test weighting.", 'use three weights, e.g. "969,30,1".')
    bounds = [0.0]
    for w in weights:
        bounds.append(bounds[-1] + w / total)
    ranges: list[tuple[int, int] | None] = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        ranges.append(None if end <= begin else (int(round(begin * float(n_documents))), int(round(end * float(n_documents)))))
    return ranges


def split_samples(data_dir: Path, split: str, seq_length: int, prefix: str | None = None) -> tuple[int, int, int]:
    """Samples of ``seq_length`` tokens in one epoch of each split, as Megatron-Core's GPTDataset
    counts them (each sample reads one extra token for the shifted labels)."""
    manifest = check_dataset(data_dir, prefix)
    prefix = manifest["prefix"]
    index = read_index(data_dir / f"{prefix}.idx", data_dir / f"{prefix}.bin")
    counts = []
    for bounds in split_ranges(split, index.documents):
        tokens = 0 if bounds is None else int(index.sequence_lengths[bounds[0] : bounds[1]].sum(dtype="int64"))
        counts.append(max(0, (tokens - 1) // seq_length))
    return counts[0], counts[1], counts[2]


def smoke_samples_limit(data_dir: Path, split: str, seq_length: int, data_fraction: float, prefix: str | None = None) -> int:
    """``smoke.data_fraction`` of the train split's samples (at least one): the job's
    ``train_samples_limit`` for the smoke stage."""
    train, _, _ = split_samples(data_dir, split, seq_length, prefix)
    if train < 1:
        raise DataError(
            f"the train split of {data_dir} holds no sample of {seq_length} tokens.", "use more data or a shorter seq_length."
        )
    return max(1, math.ceil(data_fraction * train))
