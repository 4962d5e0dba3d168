"""A safetensors file's header, read with the standard library: the tensors' names and shapes, and whether
the file holds the bytes its header describes.

The format: an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets": [begin, end]}}, plus an optional "__metadata__"), then the tensors' bytes, offsets counted
from the end of the header. A download cut off partway leaves a file shorter than its header says; the
planner finds that here, from the header and the file's size, without reading any tensor.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from attrs import frozen

Shape = tuple[int, ...]
# Bits per element of every dtype the safetensors format names (safetensors' Dtype enum).
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
              "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
MAX_HEADER = 100_000_000  # the safetensors library refuses longer headers too


@frozen
class Header:
    """The tensors a safetensors file's header lists (name -> shape), and what is wrong with the file
    (``problems``: each a phrase that starts with the file's name; empty when the file is whole)."""

    tensors: dict[str, Shape]
    problems: tuple[str, ...]


def read_header(path: Path) -> Header:
    """The header of the safetensors file ``path``, each tensor's dtype and shape checked against its data
    offsets, and the offsets against the file's size. Reads the header's bytes only."""
    path = Path(path)
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            raw = f.read(n) if n is not None and n <= min(size - 8, MAX_HEADER) else b""
    except OSError as exc:
        return Header({}, (f"{name} cannot be read ({exc.strerror or exc})",))
    if n is None:
        return Header({}, (f"{name} is {size} bytes, too short for a safetensors header",))
    if n > MAX_HEADER:
        return Header({}, (f"{name} is not a safetensors file (its first 8 bytes give a header of {n} bytes)",))
    if n > size - 8:
        return Header({}, (f"{name} is cut off inside its header ({size} bytes; the header alone is {n + 8})",))
    try:
        entries = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return Header({}, (f"{name} is not a safetensors file (its header is not JSON)",))
    if not isinstance(entries, dict):
        return Header({}, (f"{name} is not a safetensors file (its header is not a JSON object)",))
    return _checked(name, entries, size - 8 - n)


def _checked(name: str, entries: dict, data_bytes: int) -> Header:
    """Each entry's byte count against its dtype and shape; the entries tiling the data exactly."""
    tensors: dict[str, Shape] = {}
    spans: list[tuple[int, int, str]] = []
    problems: list[str] = []
    for tensor, entry in entries.items():
        if tensor == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            assert all(type(d) is int and d >= 0 for d in (*shape, begin, end)) and begin <= end
        except (TypeError, KeyError, ValueError, AssertionError):
            problems.append(f"{name}: {tensor}'s header entry is not a safetensors entry ({json.dumps(entry)[:120]})")
            continue
        numel = 1
        for d in shape:
            numel *= d
        bits = DTYPE_BITS.get(dtype)
        if bits is None:
            problems.append(f"{name}: {tensor} has dtype {dtype!r}, which safetensors does not define")
        elif numel * bits != (end - begin) * 8:
            problems.append(f"{name}: {tensor} is {dtype} {shape}, {numel * bits // 8} bytes, and its data_offsets "
                            f"span {end - begin}")
        tensors[tensor] = shape
        spans.append((begin, end, tensor))
    spans.sort()
    edge = 0
    for begin, end, tensor in spans:
        if begin != edge:
            problems.append(f"{name}: {tensor}'s bytes start at {begin}, the tensor before it ends at {edge} "
                            "(overlapping or with a gap)")
        edge = max(edge, end)
    if edge > data_bytes:
        problems.append(f"{name} is cut off: its header describes {edge} bytes of tensors and the file holds "
                        f"{data_bytes}")
    elif edge < data_bytes:
        problems.append(f"{name} has {data_bytes - edge} bytes after its last tensor (not a file safetensors wrote)")
    return Header(tensors, tuple(problems))
