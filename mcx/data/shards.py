"""Record shards: the files a real corpus arrives in (JSON Lines, gzipped JSON Lines, Parquet), found and read.

A shard is one file; its documents are the strings under one JSON key or in one Parquet column, in file
order. Reading streams (a shard of tens of GB is never held whole) and reports how far into the file it is,
so progress can estimate the time left. Anything unreadable is a :class:`DataError` naming the file and the
line (JSON Lines) or row (Parquet), with the fix.
"""

from __future__ import annotations

import glob
import gzip
import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from attrs import frozen

from mcx.errors import DataError

ShardFormat = Literal["jsonl", "jsonl.gz", "parquet"]
SUFFIXES: dict[str, ShardFormat] = {".jsonl": "jsonl", ".jsonl.gz": "jsonl.gz", ".parquet": "parquet"}
_PARQUET_BATCH = 1024  # rows per Arrow batch: memory stays small whatever the row group size


@frozen
class Shard:
    path: Path
    format: ShardFormat
    size: int  # bytes on disk (compressed for .gz): what progress counts


def shard_format(path: Path) -> ShardFormat | None:
    name = path.name
    for suffix, fmt in sorted(SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return fmt
    return None


def is_record_input(source: str) -> bool:
    """Whether ``source`` (a file, a directory or a glob) names record shards rather than text files."""
    path = Path(source)
    if path.is_dir():
        return any(p.is_file() and shard_format(p) for p in path.rglob("*"))
    if path.exists():
        return shard_format(path) is not None
    return _is_glob(source)


def _is_glob(source: str) -> bool:
    return glob.has_magic(source)


def find_shards(sources: Sequence[str]) -> tuple[Shard, ...]:
    """The shards ``sources`` name, in order: a file as given, a directory's shards (recursive) and a glob's
    matches each sorted by path. A source that matches nothing, or a file of another kind, is a DataError."""
    if not sources:
        raise DataError("no input given.", "name shard files (.jsonl, .jsonl.gz, .parquet), a directory or a glob.")
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.is_file() and shard_format(p))
            if not matches:
                raise DataError(f"{path} holds no .jsonl, .jsonl.gz or .parquet files.",
                                "give a directory of shards, the shard files, or a glob like 'dir/*.jsonl.gz'.")
            found.extend(matches)
        elif path.exists():
            if not path.is_file():  # a device or FIFO: /dev/zero would never end
                raise DataError(f"{path} is not a regular file.", "give shard files, a directory or a glob.")
            if shard_format(path) is None:
                raise DataError(f"{path} is not a .jsonl, .jsonl.gz or .parquet file.",
                                "give shards of those kinds (text files go alone, or as a directory of .txt files).")
            found.append(path)
        elif _is_glob(source):
            matches = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
            shards = [p for p in matches if shard_format(p)]
            if not shards:
                what = f"only files of other kinds ({matches[0].name}, ...)" if matches else "no file"
                raise DataError(f"the glob {source!r} matches {what}.",
                                "check the pattern (quote it, so that mcx expands it); shards end in .jsonl, .jsonl.gz "
                                "or .parquet.")
            found.extend(shards)
        else:
            raise DataError(f"{source} does not exist.", "check the path.")
    seen: set[Path] = set()
    shards_: list[Shard] = []
    for p in found:
        key = p.resolve()
        if key in seen:
            raise DataError(f"{p} is named twice among the inputs.", "name each shard once; its documents would be read twice.")
        seen.add(key)
        fmt = shard_format(p)
        assert fmt is not None
        shards_.append(Shard(path=p, format=fmt, size=p.stat().st_size))
    return tuple(shards_)


def shard_documents(shard: Shard, text_key: str) -> Iterator[tuple[str, int]]:
    """Each non-empty document of ``shard`` with the bytes of the file read so far (for progress)."""
    if shard.format == "parquet":
        yield from _parquet_documents(shard, text_key)
    else:
        yield from _jsonl_documents(shard, text_key)


def _jsonl_documents(shard: Shard, text_key: str) -> Iterator[tuple[str, int]]:
    path, lineno = shard.path, 0
    try:
        with open(path, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if shard.format == "jsonl.gz" else raw
            for lineno, line in enumerate(stream, start=1):
                value = json_text(path, lineno, line, text_key)
                if value:
                    yield value, raw.tell()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: the gzip stream is broken after line {lineno} ({exc}).",
                        "download or recompress that shard again (`gzip -t FILE` checks one).") from None
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc}).", "check the file and its permissions.") from None


def json_text(path: Path, lineno: int, line: bytes, text_key: str) -> str | None:
    """The text of one JSON line (None for a blank line), or a DataError naming ``path:lineno`` and what to fix."""
    where = f"{path}:{lineno}"
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 (byte {exc.start} of the line).",
                        f"convert the file, e.g. `iconv -t UTF-8 {path}`.") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno}).",
                        f'fix or remove that line; each line must be one JSON object like {{"{text_key}": "..."}}.') from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, found {type(obj).__name__}.",
                        f'each line must be one JSON object like {{"{text_key}": "..."}}.')
    if text_key not in obj:
        keys = ", ".join(sorted(obj)[:8]) or "none"
        raise DataError(f'{where}: no "{text_key}" field (keys: {keys}).',
                        "add the field, or name the key that holds the text with --text-key.")
    value = obj[text_key]
    if not isinstance(value, str):
        raise DataError(f'{where}: "{text_key}" is {type(value).__name__}, not a string.', "store the text as a string.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON's "\ud800" escape: a lone surrogate, no character at all
        raise DataError(f'{where}: "{text_key}" holds a lone surrogate {value[exc.start]!a} (character {exc.start}), '
                        "which is not text.", "fix that escape, or remove the line.") from None
    return value


def _parquet_documents(shard: Shard, text_key: str) -> Iterator[tuple[str, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = shard.path
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc}).", "download or write that shard again.") from None
    names = file.schema_arrow.names
    if text_key not in names:
        raise DataError(f'{path}: no "{text_key}" column (columns: {", ".join(names[:8]) or "none"}).',
                        "name the column that holds the text with --text-key.")
    column_type = file.schema_arrow.field(text_key).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DataError(f'{path}: column "{text_key}" holds {column_type}, not strings.', "name a text column with --text-key.")
    total = max(file.metadata.num_rows, 1)
    row = 0
    try:
        for batch in file.iter_batches(batch_size=_PARQUET_BATCH, columns=[text_key]):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is None:
                    raise DataError(f'{path}: row {row - 1} (counting from 0) has no "{text_key}" (null).',
                                    "drop the rows without text from that shard, or fill them.")
                if value:
                    yield value, shard.size * row // total
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: unreadable after row {row - 1} (counting from 0) ({exc}).", "download or write that shard again.") from None
