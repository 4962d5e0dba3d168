"""Preparing a dataset: corpus -> tokenizer -> Megatron-Core indexed dataset + manifest.

The output directory is built in a temporary sibling directory (``.mcx-tmp-*``, which the project's
``.dvcignore`` hides from DVC) and renamed into place when complete, so an interrupted prepare leaves
no half-written dataset behind. The output is byte-for-byte deterministic: the same corpus, tokenizer
spec and library versions give the same bytes in every file (nothing records time, paths or hosts).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from mcx.data.corpus import QUICKSTART_PACKAGE, QUICKSTART_VERSION, Corpus, documents_sha256, megatron_core_corpus
from mcx.data.dataset import FORMAT, MANIFEST, check_dataset, read_manifest
from mcx.data.dvc_hash import TMP_PREFIX
from mcx.data.shards import Shard, shard_documents
from mcx.data.tokenizer import BPE_MIN_FREQUENCY, BPE_SPECIAL_TOKENS, Tokenizer, load_tokenizer, train_bpe
from mcx.errors import DataError
from mcx.hashing import digest, file_sha256
from mcx.spec.schema import TokenizerSpec

if TYPE_CHECKING:
    from mcx.data.shard_work import Progress as ShardProgress

_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENCODE_BATCH = 256  # documents per tokenizer call


@frozen(kw_only=True)
class QuickstartRecipe:
    """The exact parameters of the bundled dataset (``data.dvc`` tracks its output)."""

    path: str = "data/quickstart"  # relative to the project root
    package: str = QUICKSTART_PACKAGE
    version: str = QUICKSTART_VERSION
    tokenizer: TokenizerSpec = field(factory=lambda: TokenizerSpec(kind="bpe", vocab_size=4096))
    prefix: str = "corpus"


def quickstart_recipe() -> QuickstartRecipe:
    return QuickstartRecipe()


def prepare_quickstart(project_root: Path, *, force: bool = False) -> Path:
    """Build (or find already built) the bundled dataset under ``project_root``; returns its path."""
    recipe = quickstart_recipe()
    out_dir = Path(project_root) / recipe.path
    corpus = megatron_core_corpus(recipe.version)
    prepare(corpus, recipe.tokenizer, out_dir, prefix=recipe.prefix, base_dir=Path(project_root), force=force)
    return out_dir


def _versions(kind: str) -> dict[str, str]:
    library = "sentencepiece" if kind == "sentencepiece" else "tokenizers"
    return {name: importlib.metadata.version(name) for name in ("megatron-core", library)}


def prepare(
    corpus: Corpus,
    tokenizer_spec: TokenizerSpec,
    out_dir: Path,
    *,
    prefix: str = "corpus",
    base_dir: Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Tokenize ``corpus`` into a Megatron-Core indexed dataset at ``out_dir``; returns the manifest.

    Every document is encoded without special tokens and followed by the end-of-document id; one
    document is one sequence of the ``<prefix>.bin``/``.idx`` pair (uint16 ids when the vocabulary
    has fewer than 65500 entries, else int32, as Megatron-Core chooses). Tokenizer files named by
    ``tokenizer_spec`` are resolved against ``base_dir`` (default: the current directory).

    An existing ``out_dir`` made from the same inputs is checked and kept (nothing is rebuilt); a
    different one is an error unless ``force`` is set.
    """
    out_dir = Path(out_dir)
    base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
    _check_args(prefix, tokenizer_spec)

    source_sha256, n_documents, n_bytes = documents_sha256(corpus.documents())
    if n_documents == 0:
        raise DataError("the corpus holds no documents (every file is empty).", "give files with text.")
    source = {**corpus.description, "documents": n_documents, "bytes": n_bytes, "sha256": source_sha256}
    tokenizer = None if tokenizer_spec.kind == "bpe" else load_tokenizer(tokenizer_spec, base_dir)
    requested = {"kind": "bpe", "vocab_size": tokenizer_spec.vocab_size} if tokenizer is None else tokenizer.identity()
    versions = _versions(tokenizer_spec.kind)
    recipe = digest({"format": FORMAT, "prefix": prefix, "source": source, "tokenizer": requested, "versions": versions})

    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"{out_dir} is a file, not a dataset directory.", "choose another output directory.")
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        return _existing(out_dir, recipe)

    if tokenizer is None:
        tokenizer = train_bpe(corpus.documents(), tokenizer_spec.vocab_size)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out_dir.name}-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)
        dataset = _write_indexed(corpus, tokenizer, tmp, prefix)
        manifest = _finish(tmp, out_dir, tokenizer, tokenizer_spec, prefix=prefix, recipe=recipe, source=source,
                           dataset=dataset, versions=versions)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _check_args(prefix: str, tokenizer_spec: TokenizerSpec) -> None:
    if not _PREFIX_RE.fullmatch(prefix):
        raise DataError(f"prefix {prefix!r} is not a plain file name.", "use letters, digits, '.', '_' or '-', e.g. 'corpus'.")
    if tokenizer_spec.kind == "bpe" and (tokenizer_spec.path or tokenizer_spec.merges):
        raise DataError(
            "data.tokenizer.kind = 'bpe' trains a new tokenizer, but data.tokenizer.path/merges name files.",
            "use kind = 'huggingface' (or 'gpt2', 'sentencepiece') to load them, or remove path/merges.",
        )


def _finish(tmp: Path, out_dir: Path, tokenizer: Tokenizer, tokenizer_spec: TokenizerSpec, *, prefix: str, recipe: str,
            source: dict[str, Any], dataset: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    """The tokenizer's files and the manifest into ``tmp`` (the .bin/.idx are there), then ``tmp`` into place."""
    tokenizer_entry: dict[str, Any] = {
        "kind": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "eod": tokenizer.eod,
        "pad": tokenizer.pad,
        "files": tokenizer.save(tmp),
    }
    if tokenizer.kind == "bpe":
        tokenizer_entry["trained"] = {
            "vocab_size": tokenizer_spec.vocab_size,
            "min_frequency": BPE_MIN_FREQUENCY,
            "special_tokens": list(BPE_SPECIAL_TOKENS),
        }
    manifest = {
        "format": FORMAT,
        "prefix": prefix,
        "recipe": recipe,
        "source": source,
        "tokenizer": tokenizer_entry,
        "dataset": dataset,
        "versions": versions,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _replace(tmp, out_dir)
    return manifest


def prepare_shards(
    shards: Sequence[Shard],
    tokenizer_spec: TokenizerSpec,
    out_dir: Path,
    *,
    text_key: str = "text",
    prefix: str = "corpus",
    base_dir: Path | None = None,
    force: bool = False,
    workers: int = 1,
    progress: ShardProgress | None = None,
) -> dict[str, Any]:
    """Tokenize record shards (JSON Lines, gzipped or not, and Parquet) into one indexed dataset at ``out_dir``.

    As :func:`prepare` (documents and their end-of-document ids, the dataset built aside and renamed into
    place, an identical existing one kept), with ``workers`` processes, one shard each at a time, and a
    resumable work directory beside ``out_dir`` (``mcx.data.shard_work``): the bytes are the same whatever
    ``workers`` is, and a prepare interrupted (Ctrl-C, a bad shard) and run again redoes only the shards
    that were not finished. ``progress`` hears a :class:`PrepareProgress` a few times a second.

    The source's ``sha256`` is the digest of the shards' document digests in order (each as
    :func:`documents_sha256` computes it), so it is known without reading the shards twice.
    """
    out_dir = Path(out_dir)
    base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
    if workers < 1:
        raise DataError(f"--workers {workers} is not a number of processes.", "use 1 or more (one a CPU core at most).")
    _check_args(prefix, tokenizer_spec)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"{out_dir} is a file, not a dataset directory.", "choose another output directory.")
    kinds = "+".join(sorted({s.format.removesuffix(".gz") for s in shards}))
    description = {"kind": kinds, "files": len(shards), "text_key": text_key}
    versions = _versions(tokenizer_spec.kind)

    def every_document() -> Iterator[str]:
        for shard in shards:
            yield from (text for text, _ in shard_documents(shard, text_key))

    tokenizer = train_bpe(every_document(), tokenizer_spec.vocab_size) if tokenizer_spec.kind == "bpe" else (
        load_tokenizer(tokenizer_spec, base_dir))
    requested = ({"kind": "bpe", "vocab_size": tokenizer_spec.vocab_size} if tokenizer_spec.kind == "bpe"
                 else tokenizer.identity())

    def recipe_of(source: dict[str, Any]) -> str:
        return digest({"format": FORMAT, "prefix": prefix, "source": source, "tokenizer": requested, "versions": versions})

    def source_of(digests: list[str], documents: int, n_bytes: int) -> dict[str, Any]:
        return {**description, "documents": documents, "bytes": n_bytes, "sha256": digest(digests)}

    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        parts = [documents_sha256(text for text, _ in shard_documents(s, text_key)) for s in shards]
        source = source_of([p[0] for p in parts], sum(p[1] for p in parts), sum(p[2] for p in parts))
        return _existing(out_dir, recipe_of(source))

    from mcx.data.shard_work import merge, tokenize_shards, work_key

    dtype = _optimal_dtype(tokenizer.vocab_size)
    work = out_dir.parent / f"{TMP_PREFIX}{out_dir.name}-work"  # a stable name: the next prepare resumes from it
    done = tokenize_shards(shards, tokenizer, text_key=text_key, work=work, dtype=dtype, workers=workers,
                           key=work_key(tokenizer, text_key, versions), progress=progress)
    documents, tokens = sum(d.documents for d in done), sum(d.tokens for d in done)
    if documents == 0:
        shutil.rmtree(work, ignore_errors=True)
        raise DataError(f"the {len(shards)} shard(s) hold no documents (every {text_key!r} is empty).",
                        "give shards with text, or name the field that holds it with --text-key.")
    source = source_of([d.sha256 for d in done], documents, sum(d.text_bytes for d in done))
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out_dir.name}-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)
        merge(done, work, tmp / prefix, dtype)
        import numpy as np

        dataset = {"dtype": np.dtype(dtype).name, "documents": documents, "tokens": tokens,
                   "files": {p.name: file_sha256(p) for p in (tmp / f"{prefix}.bin", tmp / f"{prefix}.idx")}}
        manifest = _finish(tmp, out_dir, tokenizer, tokenizer_spec, prefix=prefix, recipe=recipe_of(source),
                           source=source, dataset=dataset, versions=versions)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def _optimal_dtype(vocab_size: int) -> Any:
    with warnings.catch_warnings():  # megatron.core warns at import about optional CUDA packages
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType

    return DType.optimal_dtype(vocab_size)


def _existing(out_dir: Path, recipe: str) -> dict[str, Any]:
    try:
        manifest = read_manifest(out_dir)
    except DataError:
        manifest = {}
    if manifest.get("recipe") != recipe:
        raise DataError(
            f"{out_dir} already holds a different dataset.",
            "choose another output directory, or replace it with --force (force=True).",
        )
    try:
        return check_dataset(out_dir, contents=True)
    except DataError as exc:
        raise DataError(
            f"{out_dir} was prepared from the same inputs but is damaged: {exc.message}", "rebuild it with --force (force=True)."
        ) from None


def _write_indexed(corpus: Corpus, tokenizer: Tokenizer, directory: Path, prefix: str) -> dict[str, Any]:
    import numpy as np

    with warnings.catch_warnings():  # megatron.core warns at import about optional CUDA packages
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    bin_path, idx_path = directory / f"{prefix}.bin", directory / f"{prefix}.idx"
    builder = IndexedDatasetBuilder(str(bin_path), dtype=dtype)
    documents = tokens = 0

    def flush(batch: list[str]) -> None:
        nonlocal documents, tokens
        for ids in tokenizer.encode_batch(batch):
            ids.append(tokenizer.eod)
            builder.add_document(np.asarray(ids, dtype=dtype), [len(ids)])
            documents += 1
            tokens += len(ids)

    batch: list[str] = []
    for text in corpus.documents():
        batch.append(text)
        if len(batch) == _ENCODE_BATCH:
            flush(batch)
            batch = []
    flush(batch)
    builder.finalize(str(idx_path))
    return {
        "dtype": np.dtype(dtype).name,
        "documents": documents,
        "tokens": tokens,
        "files": {path.name: file_sha256(path) for path in (bin_path, idx_path)},
    }


def _replace(tmp: Path, out_dir: Path) -> None:
    """Move the finished ``tmp`` to ``out_dir``; an old ``out_dir`` is renamed away, then deleted."""
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out_dir.name}-old-", dir=out_dir.parent))
    os.rmdir(old)
    os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)

