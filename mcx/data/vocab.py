"""A tokenizer's vocabulary size read from its files, without loading a tokenizer library.

The planner needs the vocabulary to count parameters; the control plane never imports the
tokenizer libraries. Read in this order: the prepared dataset's manifest (what the worker will
train with), else the tokenizer file the spec names: a Hugging Face ``tokenizer.json`` (the model's
vocabulary plus added tokens, as ``len(tokenizer)`` counts them) or a SentencePiece ``.model``
(its pieces). None when neither is on this machine or readable; the caller says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcx.spec.load import read_regular_bytes
from mcx.spec.schema import DataSpec

MANIFEST = "manifest.json"  # mcx.data.dataset.MANIFEST, without importing numpy


def _manifest_vocab(data_dir: Path) -> int | None:
    try:
        value = json.loads(read_regular_bytes(data_dir / MANIFEST, None))["tokenizer"]["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def hf_vocab_size(data: bytes) -> int | None:
    """``len(tokenizer)`` of a tokenizer.json: the model's tokens and the added tokens, by content."""
    try:
        doc = json.loads(data)
        vocab = doc["model"]["vocab"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(vocab, dict):
        tokens = set(vocab)
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        tokens = {entry[0] for entry in vocab if isinstance(entry, list) and entry}
    else:
        return None
    tokens.update(t["content"] for t in doc.get("added_tokens") or [] if isinstance(t, dict) and "content" in t)
    return len(tokens) or None


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def sentencepiece_vocab_size(data: bytes) -> int | None:
    """The number of pieces in a SentencePiece ModelProto (field 1, repeated), walking the wire format."""
    pos, pieces = 0, 0
    try:
        while pos < len(data):
            tag, pos = _varint(data, pos)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 2:
                length, pos = _varint(data, pos)
                pos += length
                pieces += field == 1
            elif wire == 5:
                pos += 4
            else:
                return None
            if pos > len(data):
                return None
    except ValueError:
        return None
    return pieces or None


def tokenizer_vocab_size(data: DataSpec, root: Path) -> int | None:
    """The vocabulary the worker will train with, if this machine has the files that say it."""
    for _, dataset, _ in data.datasets().values():  # a mixture's components share one tokenizer (checked at planning)
        from_manifest = _manifest_vocab(root / dataset)
        if from_manifest is not None:
            return from_manifest
    tok = data.tokenizer
    if tok.path is None or tok.kind not in ("huggingface", "sentencepiece"):
        return None
    path = root / tok.path
    if tok.kind == "huggingface" and path.is_dir():  # the directory Megatron-LM's --tokenizer-model names
        path = path / "tokenizer.json"
    try:
        raw = read_regular_bytes(path, None)  # a FIFO or /dev/zero named here would never end: the fingerprint says
    except (OSError, ValueError):            # what is wrong with it (ValueError: a NUL in the path)
        return None
    return hf_vocab_size(raw) if tok.kind == "huggingface" else sentencepiece_vocab_size(raw)
