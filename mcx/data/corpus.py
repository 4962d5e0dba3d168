"""Corpora: where the documents of a dataset come from.

A :class:`Corpus` is a description (JSON data that goes into the dataset manifest) and an ordered
tuple of files with a reader that turns one file into documents. Documents are streamed, so a corpus
larger than memory can still be tokenized; every pass reads the files again in the same order.

Three kinds:

- :func:`megatron_core_corpus`: the bundled quickstart corpus, the Python sources of the installed
  ``megatron-core`` wheel, one document per file in sorted path order, each file checked against the
  sha256 in the wheel's RECORD so that every machine with the locked version tokenizes the same bytes.
- :func:`text_corpus`: plain UTF-8 text files. One document per file (``unit="file"``, the default:
  a book, a source file or an article stays whole), or one per blank-line-separated paragraph
  (``unit="paragraph"``, for a single large file whose train/valid/test split must fall between
  documents).
- :func:`jsonl_corpus`: JSON Lines, one object per line with the text under ``text_key``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from mcx.data.shards import json_text
from mcx.errors import DataError

QUICKSTART_PACKAGE = "megatron-core"
QUICKSTART_VERSION = "0.19.2"  # pinned by lockfiles/; the quickstart dataset's bytes depend on it

TextUnit = Literal["file", "paragraph"]
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


@frozen
class Corpus:
    """An ordered, re-readable stream of documents and the description of where they come from."""

    description: dict[str, Any]
    files: tuple[Path, ...]
    reader: Callable[[Path], Iterator[str]]

    def documents(self) -> Iterator[str]:
        """Every document, in order. Each call reads the files again."""
        for path in self.files:
            yield from self.reader(path)


def documents_sha256(documents: Iterator[str]) -> tuple[str, int, int]:
    """sha256 of the documents as they are tokenized (UTF-8, each followed by one NUL byte).

    Returns ``(hex digest, number of documents, number of UTF-8 bytes)``. This is the data's
    identity in the manifest: equal digests mean the tokenizer saw the same text.
    """
    h = hashlib.sha256()
    count = size = 0
    for text in documents:
        data = text.encode("utf-8")
        h.update(data)
        h.update(b"\0")
        count += 1
        size += len(data)
    return h.hexdigest(), count, size


# --- the bundled corpus -------------------------------------------------------------------------


def _record_sha256(data: bytes) -> str:
    """The RECORD form of a sha256: urlsafe base64 without padding (PEP 376 / wheel spec)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def megatron_core_corpus(version: str = QUICKSTART_VERSION) -> Corpus:
    """The Python sources of the installed megatron-core wheel: one document per ``.py`` file.

    Files are ordered by their path inside the wheel; each document is a header line
    ``# <path>`` followed by the file's text. All ``.py`` files of the wheel are used
    (megatron/core and megatron/training, about 8.8 MB in 0.19.2), which is small enough that
    no subset is needed.
    """
    hint = f"reinstall megatron-core=={version} from the lockfile (./dev does this)."
    try:
        dist = importlib.metadata.distribution(QUICKSTART_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"{QUICKSTART_PACKAGE} is not installed; the quickstart corpus is its source code.", hint) from None
    if dist.version != version:
        raise DataError(
            f"{QUICKSTART_PACKAGE} {dist.version} is installed, but the quickstart dataset is built from {version}.", hint
        )
    entries = sorted((f for f in dist.files or () if f.suffix == ".py"), key=lambda f: f.as_posix())
    if not entries:
        raise DataError(f"{QUICKSTART_PACKAGE} {version} lists no Python files in its RECORD.", hint)
    expected = {}
    for entry in entries:
        if entry.hash is None or entry.hash.mode != "sha256":
            raise DataError(f"{QUICKSTART_PACKAGE} RECORD has no sha256 for {entry.as_posix()}.", hint)
        expected[Path(entry.locate())] = (entry.as_posix(), entry.hash.value)

    def read(path: Path) -> Iterator[str]:
        name, digest = expected[path]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read {name} of {QUICKSTART_PACKAGE} ({exc.strerror}).", hint) from None
        if _record_sha256(data) != digest:
            raise DataError(f"{name} of {QUICKSTART_PACKAGE} differs from the wheel's RECORD (sha256 mismatch).", hint)
        yield f"# {name}\n" + data.decode("utf-8")

    description = {
        "kind": "python-package",
        "package": QUICKSTART_PACKAGE,
        "version": version,
        "selection": "every .py file of the wheel, sorted by path, one document each with a '# <path>' header",
    }
    return Corpus(description=description, files=tuple(expected), reader=read)


# --- user corpora -------------------------------------------------------------------------------


def _expand(paths: Sequence[str | Path], suffixes: tuple[str, ...], what: str) -> tuple[Path, ...]:
    """Files as given, directories as their files with ``suffixes`` (recursive, sorted)."""
    if not paths:
        raise DataError(f"no {what} given.", "name at least one file or directory.")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
            if not found:
                raise DataError(f"{path} holds no {'/'.join(suffixes)} files.", f"give {what} directly or a directory with them.")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():  # a device or FIFO: /dev/zero would never end
            raise DataError(f"{path} is not a regular file.", f"give {what} or a directory of them.")
        else:
            raise DataError(f"{path} does not exist.", "check the path.")
    return tuple(files)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror}).", "check the path and its permissions.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 (byte {exc.start}).", f"convert the file, e.g. `iconv -t UTF-8 {path}`."
        ) from None


def _describe(kind: str, files: tuple[Path, ...], **extra: Any) -> dict[str, Any]:
    # No paths: they differ between machines and would change the manifest's bytes. The content
    # digest (documents_sha256) is the corpus's identity.
    return {"kind": kind, "files": len(files), **extra}


def text_corpus(paths: Sequence[str | Path], *, unit: TextUnit = "file") -> Corpus:
    """Plain UTF-8 text files (directories: their ``.txt`` files). Empty documents are skipped."""
    if unit not in ("file", "paragraph"):
        raise DataError(f"unit={unit!r} is not a text unit.", "use 'file' or 'paragraph'.")
    files = _expand(paths, (".txt",), "text files")

    def read(path: Path) -> Iterator[str]:
        text = _read_text(path)
        if unit == "file":
            if text:
                yield text
            return
        for paragraph in _PARAGRAPH_BREAK.split(text):
            paragraph = paragraph.strip("\n")
            if paragraph.strip():
                yield paragraph

    return Corpus(description=_describe("text", files, unit=unit), files=files, reader=read)


def jsonl_corpus(paths: Sequence[str | Path], *, text_key: str = "text") -> Corpus:
    """JSON Lines files (directories: their ``.jsonl`` files); the document is ``obj[text_key]``.

    Blank lines are skipped, and so are empty texts. Anything else that is not an object with a
    string under ``text_key`` is a :class:`DataError` naming ``file:line``.
    """
    files = _expand(paths, (".jsonl", ".json"), "JSONL files")

    def read(path: Path) -> Iterator[str]:
        text = _read_text(path)  # the whole file is UTF-8, checked once, so each line is too
        for lineno, line in enumerate(text.split("\n"), start=1):
            value = json_text(path, lineno, line.encode("utf-8"), text_key)  # a JSONL shard's line, the same rules
            if value:
                yield value

    return Corpus(description=_describe("jsonl", files, text_key=text_key), files=files, reader=read)
