"""Tokenizers: one small interface over Hugging Face ``tokenizers`` and SentencePiece.

Four kinds (``data.tokenizer.kind``):

- ``bpe``: a byte-level BPE trained on the corpus (:func:`train_bpe`), ``vocab_size`` entries
  including the special tokens ``<|endoftext|>`` (id 0, the end-of-document token) and ``<|pad|>``
  (id 1). Training is deterministic: the same documents give the same ``tokenizer.json`` bytes in
  any process, with any thread count (checked by tests/test_data.py).
- ``huggingface``: an existing ``tokenizer.json`` (``data.tokenizer.path``).
- ``sentencepiece``: a SentencePiece model (``data.tokenizer.path``); its ``eos`` piece ends documents.
- ``gpt2``: a GPT-2 ``vocab.json`` (``data.tokenizer.path``) and ``merges.txt`` (``data.tokenizer.merges``).

A tokenizer holds the exact bytes of its files, so saving it into a dataset directory copies them
unchanged and the dataset's manifest can record their sha256.
"""

from __future__ import annotations

import hashlib
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mcx.errors import DataError
from mcx.spec.load import read_regular_bytes
from mcx.spec.schema import TokenizerKind, TokenizerSpec

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BPE_SPECIAL_TOKENS = (EOD_TOKEN, PAD_TOKEN)  # ids 0 and 1 of a trained BPE
BPE_MIN_FREQUENCY = 2

# End-of-document tokens of common tokenizer.json files, first match wins:
# GPT-2/NeoX/Qwen, Llama 3, Llama 2/Mistral/T5, Gemma.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>")

# The files a tokenizer of each kind saves into a dataset directory.
SAVED_FILES: dict[str, tuple[str, ...]] = {
    "bpe": ("tokenizer.json",),
    "huggingface": ("tokenizer.json",),
    "gpt2": ("vocab.json", "merges.txt"),
    "sentencepiece": ("tokenizer.model",),
}


class Tokenizer(ABC):
    """What mcx needs from a tokenizer: ids both ways, the vocabulary size and end-of-document id."""

    kind: TokenizerKind
    vocab_size: int
    eod: int
    pad: int | None
    payload: dict[str, bytes]  # saved file name -> exact bytes

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without any special tokens added."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: Path) -> dict[str, str]:
        """Write the tokenizer's files into ``directory``; returns {file name: sha256}."""
        written = {}
        for name, data in self.payload.items():
            (directory / name).write_bytes(data)
            written[name] = hashlib.sha256(data).hexdigest()
        return written

    def identity(self) -> dict[str, Any]:
        """JSON data that identifies the tokenizer by content (never by path)."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eod": self.eod,
            "pad": self.pad,
            "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(self.payload.items())},
        }


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer (kinds bpe, huggingface, gpt2)."""

    def __init__(self, kind: TokenizerKind, backend: Any, payload: dict[str, bytes], source: str) -> None:
        self.kind = kind
        self._backend = backend
        self.payload = payload
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        eod = _first_token(backend, EOD_CANDIDATES)
        if eod is None:
            raise DataError(
                f"{source} has no end-of-document token (looked for {', '.join(EOD_CANDIDATES)}).",
                f"add one of them to the tokenizer's added_tokens, e.g. {EOD_TOKEN}.",
            )
        self.eod = eod
        self.pad = _first_token(backend, PAD_CANDIDATES)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=False)


class SentencePieceTokenizer(Tokenizer):
    kind: TokenizerKind = "sentencepiece"

    def __init__(self, model: bytes, source: str) -> None:
        import sentencepiece

        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        except (RuntimeError, OSError, TypeError) as exc:
            raise DataError(f"{source} is not a SentencePiece model ({exc}).", "give the .model file SentencePiece wrote.") from None
        self.payload = {"tokenizer.model": model}
        self.vocab_size = self._sp.get_piece_size()
        if self._sp.eos_id() < 0:
            raise DataError(f"{source} has no eos piece to end documents.", "train it with eos_id set (the default, 2).")
        self.eod = self._sp.eos_id()
        self.pad = self._sp.pad_id() if self._sp.pad_id() >= 0 else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode(list(ids))


def _first_token(backend: Any, candidates: Iterable[str]) -> int | None:
    for token in candidates:
        token_id = backend.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


def _read(path: Path, key: str) -> bytes:
    try:
        return read_regular_bytes(path, None)  # a FIFO or /dev/zero would never end
    except FileNotFoundError:
        raise DataError(
            f"{key} = {str(path)!r} does not exist.", f"fix {key}; relative paths start at the spec's project."
        ) from None
    except OSError as exc:
        raise DataError(f"{key} = {str(path)!r} cannot be read ({exc.strerror}).", f"fix {key}.") from None


# --- the four kinds -----------------------------------------------------------------------------


def train_bpe(documents: Iterable[str], vocab_size: int) -> HFTokenizer:
    """Train a byte-level BPE on ``documents``; deterministic in its bytes for the same input."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(BPE_SPECIAL_TOKENS):
        raise DataError(
            f"data.tokenizer.vocab_size = {vocab_size} is below the byte alphabet plus special tokens.",
            f"use at least {256 + len(BPE_SPECIAL_TOKENS)} (4096 to 65536 are typical).",
        )
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=BPE_MIN_FREQUENCY,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(documents, trainer)
    if backend.get_vocab_size(with_added_tokens=True) <= 256 + len(BPE_SPECIAL_TOKENS):
        raise DataError("the corpus is empty or too small to learn any BPE merge.", "give more text.")
    data = backend.to_str(pretty=True).encode("utf-8")
    return HFTokenizer("bpe", backend, {"tokenizer.json": data}, "the trained BPE")


def huggingface_tokenizer(path: Path, key: str = "data.tokenizer.path", kind: TokenizerKind = "huggingface") -> HFTokenizer:
    from tokenizers import Tokenizer as Backend

    data = _read(path, key)
    try:
        backend = Backend.from_buffer(data)
    except Exception as exc:  # tokenizers raises a bare Exception for any parse error
        raise DataError(
            f"{key} = {str(path)!r} is not a tokenizer.json ({exc}).", "give the tokenizer.json file of a Hugging Face tokenizer."
        ) from None
    return HFTokenizer(kind, backend, {"tokenizer.json": data}, str(path))


def sentencepiece_tokenizer(path: Path, key: str = "data.tokenizer.path") -> SentencePieceTokenizer:
    return SentencePieceTokenizer(_read(path, key), str(path))


def gpt2_tokenizer(vocab: Path, merges: Path) -> HFTokenizer:
    from tokenizers.implementations import ByteLevelBPETokenizer

    payload = {"vocab.json": _read(vocab, "data.tokenizer.path"), "merges.txt": _read(merges, "data.tokenizer.merges")}
    # Load from copies of the bytes just read, so the tokenizer and its payload cannot disagree.
    with tempfile.TemporaryDirectory(prefix="mcx-gpt2-") as tmp:
        for name, data in payload.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            backend = ByteLevelBPETokenizer.from_file(str(Path(tmp) / "vocab.json"), str(Path(tmp) / "merges.txt"))
        except Exception as exc:  # tokenizers raises a bare Exception for any parse error
            raise DataError(
                f"{vocab} and {merges} are not a GPT-2 vocab.json and merges.txt ({exc}).",
                "give data.tokenizer.path = vocab.json and data.tokenizer.merges = merges.txt.",
            ) from None
    if backend.token_to_id(EOD_TOKEN) is not None:
        backend.add_special_tokens([EOD_TOKEN])  # as in GPT-2: the literal text maps to the EOD id
    return HFTokenizer("gpt2", backend, payload, str(vocab))


def load_tokenizer(spec: TokenizerSpec, base_dir: Path) -> Tokenizer:
    """The tokenizer a spec names by file (kinds huggingface, sentencepiece, gpt2)."""
    if spec.kind == "bpe":
        raise DataError("data.tokenizer.kind = 'bpe' is trained on the corpus, not loaded.", "prepare the dataset with it.")
    if spec.path is None:
        raise DataError(f"data.tokenizer.kind = {spec.kind!r} needs data.tokenizer.path.", "set it to the tokenizer file.")
    path = base_dir / spec.path
    if spec.kind == "huggingface":
        return huggingface_tokenizer(path)
    if spec.kind == "sentencepiece":
        return sentencepiece_tokenizer(path)
    if spec.merges is None:
        raise DataError("data.tokenizer.kind = 'gpt2' needs data.tokenizer.merges.", "set it to the merges.txt file.")
    return gpt2_tokenizer(path, base_dir / spec.merges)


def load_saved(directory: Path, kind: TokenizerKind) -> Tokenizer:
    """The tokenizer a prepared dataset directory holds (see :data:`SAVED_FILES`)."""
    if kind not in SAVED_FILES:
        raise DataError(f"unknown tokenizer kind {kind!r} in {directory}/manifest.json.", "prepare the dataset again.")
    for name in SAVED_FILES[kind]:
        if not (directory / name).is_file():
            raise DataError(f"{directory / name} is missing.", "restore it with `dvc checkout`, or prepare the dataset again.")
    if kind in ("bpe", "huggingface"):
        return huggingface_tokenizer(directory / "tokenizer.json", f"{directory}/tokenizer.json", kind)
    if kind == "sentencepiece":
        return sentencepiece_tokenizer(directory / "tokenizer.model", f"{directory}/tokenizer.model")
    return gpt2_tokenizer(directory / "vocab.json", directory / "merges.txt")
