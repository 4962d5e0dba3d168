"""Make the Transformer Engine core wheel small enough for one device call: sm_90 (H100, H200) only.

transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl (PyPI, md5 3561d500b47357c6942d006bb1c185f3,
276.5 MB) holds libtransformer_engine.so (343 MB) whose .nv_fatbin section (263.6 MB, 89 fatbin containers, no
PTX) has cubins for sm_75/80/89/90/100/103/107/120. Every container has an sm_90 cubin (one has two). The payload
bytes of every non-sm_90 entry are overwritten with zeros in place (headers and file layout unchanged: 245.2 MB
zeroed, 18.3 MB kept, the sm_90 code byte-identical), the wheel's RECORD line for the .so updated, and the wheel
re-zipped at deflate level 9: 32.3 MB, the same bytes each time with one zlib (docs/gpu.md gives the md5s seen).
docs/gpu.md says where it goes.

    python3 benchmarks/gpu/strip_te_fatbin.py ORIGINAL.whl OUT.whl
"""

from __future__ import annotations

import base64
import hashlib
import struct
import sys
import zipfile

SO = "transformer_engine/wheel_lib/libtransformer_engine.so"
FATBIN_MAGIC = 0xBA55ED50


def strip(data: bytearray, keep_sm: int = 90) -> tuple[int, int]:
    """Zero every cubin of the ELF's .nv_fatbin section built for another architecture than ``keep_sm``,
    in place; (bytes zeroed, bytes kept)."""
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    stroff = secs[e_shstrndx][4]

    def name(n: int) -> str:
        return bytes(data[stroff + n:data.index(b"\0", stroff + n)]).decode()

    off, size = [(s[4], s[5]) for s in secs if name(s[0]) == ".nv_fatbin"][0]
    p, end, zeroed, kept = off, off + size, 0, 0
    while p < end:  # fatbin containers, each a header and its entries
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, p)
        assert magic == FATBIN_MAGIC
        q, container_end = p + header_size, p + header_size + fat_size
        while q < container_end:
            _kind, _entry_version, entry_header_size, padded = struct.unpack_from("<HHII", data, q)
            (sm,) = struct.unpack_from("<I", data, q + 28)
            if sm != keep_sm:
                data[q + entry_header_size:q + entry_header_size + padded] = bytes(padded)
                zeroed += padded
            else:
                kept += padded
            q += entry_header_size + padded
        assert q == container_end
        p = container_end
    return zeroed, kept


def main(src: str, dst: str) -> None:
    zin = zipfile.ZipFile(src)
    so = bytearray(zin.read(SO))
    print("zeroed, kept bytes:", strip(so))
    digest = base64.urlsafe_b64encode(hashlib.sha256(so).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename == SO:
                zout.writestr(info, bytes(so), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            elif info.filename.endswith(".dist-info/RECORD"):
                lines = [f"{SO},sha256={digest},{len(so)}" if line.startswith(SO + ",") else line
                         for line in zin.read(info).decode().splitlines()]
                zout.writestr(info, "\n".join(lines) + "\n")
            else:
                zout.writestr(info, zin.read(info))


if __name__ == "__main__":
    main(*sys.argv[1:3])
