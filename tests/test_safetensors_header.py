"""mcx.weights.safetensors_header: a file written by the safetensors library reads as safetensors reads it,
and each way a file can be damaged (cut off in its header or its tensors, bytes added, an entry whose dtype
and shape disagree with its offsets, a header that is not JSON) is named with the file, from the header and
the file's size alone."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from mcx.weights.safetensors_header import read_header


def _written(path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({"a": np.zeros((3, 5), np.float32), "b": np.ones((7,), np.float16), "c": np.zeros((0, 4), np.int64)},
              str(path), metadata={"format": "pt"})
    return path


def test_a_whole_file_reads_as_safetensors_reads_it(tmp_path):
    from safetensors import safe_open

    path = _written(tmp_path / "m.safetensors")
    header = read_header(path)
    with safe_open(str(path), "np") as f:
        theirs = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    assert header.problems == () and header.tensors == theirs == {"a": (3, 5), "b": (7,), "c": (0, 4)}


def _cut_in_header(data: bytes) -> bytes:
    return data[:20]


def _cut_in_tensors(data: bytes) -> bytes:
    return data[:-6]


def _trailing(data: bytes) -> bytes:
    return data + b"\0" * 4


def _retyped(data: bytes) -> bytes:  # "a" said to be F16: the same header length, half the bytes its offsets span
    return data.replace(b'"F32"', b'"F16"')


def _not_json(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    return data[:8] + b"x" * n + data[8 + n:]


def _huge_length(data: bytes) -> bytes:  # a pytorch_model.bin renamed: its first 8 bytes are a zip's
    return b"PK\x03\x04\x00\x00\x08\x00" + data[8:]


def _overlapping(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header["b"]["data_offsets"] = [header["b"]["data_offsets"][0] - 2, header["b"]["data_offsets"][1] - 2]
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    return data[:8] + raw + data[8 + n:]


DAMAGES = [
    (_cut_in_header, "m.safetensors is cut off inside its header (20 bytes; the header alone is"),
    (_cut_in_tensors, "m.safetensors is cut off: its header describes 74 bytes of tensors and the file holds 68"),
    (_trailing, "m.safetensors has 4 bytes after its last tensor"),
    (_retyped, "m.safetensors: a is F16 (3, 5), 30 bytes, and its data_offsets span 60"),
    (_not_json, "m.safetensors is not a safetensors file (its header is not JSON)"),
    (_huge_length, "m.safetensors is not a safetensors file (its first 8 bytes give a header of"),
    (_overlapping, "m.safetensors: b's bytes start at 58, the tensor before it ends at 60"),
]


@pytest.mark.parametrize("damage, expected", DAMAGES, ids=[d.__name__[1:] for d, _ in DAMAGES])
def test_a_damaged_file_is_named_from_its_header_and_size(tmp_path, damage, expected):
    path = _written(tmp_path / "m.safetensors")
    path.write_bytes(damage(path.read_bytes()))
    problems = read_header(path).problems
    assert problems and expected in "; ".join(problems), problems
