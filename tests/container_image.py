"""A Podman image for the container tests, built here without a registry (D67).

The image holds this interpreter's base installation (its standard library, without its tests), ``/bin/sh``
and every shared library that the interpreter and the environment's compiled extensions load (found with
``ldd``); the environment itself (``.venv``: torch, megatron-core, mcx) is what mcx mounts into the container
when ``launch.container.python`` is unset. So the quickstart really trains inside the image, on the image's
libc and libstdc++.

Built once per content: the tag holds a hash of what goes in (path, size and mtime of the interpreter's files
and the extensions, the system's package database), so a session finds the image an earlier one built, and a
changed interpreter, extension or system library builds a new one.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = "localhost/mcx-test-python"
_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages", "lib2to3"}


def _podman(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=600, check=False, **kwargs)


def _libraries(binaries: list[Path]) -> set[Path]:
    """The shared libraries ``binaries`` load, outside the interpreter's prefixes (ldd, 4 at a time)."""
    files = b"\0".join(str(p).encode() for p in binaries)
    out = subprocess.run(["xargs", "-0", "-n", "64", "-P", "4", "ldd"], input=files, capture_output=True,
                         check=False).stdout.decode()
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        for word in parts:
            if word.startswith("/") and "(" not in word and not word.endswith(":"):
                libs.add(Path(word))
    inside = (Path(sys.base_prefix), Path(sys.prefix))
    return {p for p in libs if p.exists() and not any(p.is_relative_to(top) for top in inside)}


def _sources() -> tuple[list[Path], list[Path]]:
    """(the interpreter's own files, the compiled extensions whose libraries the image needs)."""
    base = Path(sys.base_prefix)
    stdlib = base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    files: list[Path] = [Path(os.path.realpath(sys._base_executable)), Path("/bin/sh"), Path("/bin/dash")]
    files += sorted((base / "lib").glob("libpython*"))
    for top, dirs, names in os.walk(stdlib):
        if Path(top) == stdlib:
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith("config-")]
        files += [Path(top) / n for n in names]
    extensions = [p for p in files if p.suffix == ".so"] + [p for p in Path(sys.prefix).rglob("*.so*") if p.is_file()]
    return files, extensions


def _members(files: list[Path], extensions: list[Path]) -> list[Path]:
    """Every file and link of the image's root filesystem, as host paths."""
    found: set[Path] = set()
    for path in [*files, *_libraries([files[0], Path("/bin/dash"), *extensions])]:
        _with_links(path, found)
    return sorted(found)


def _with_links(path: Path, found: set[Path]) -> None:
    """``path`` under its real directory (merged /usr: /lib is a link to usr/lib), and each link it leads through."""
    path = Path(os.path.realpath(path.parent)) / path.name
    if path in found:
        return
    found.add(path)
    if path.is_symlink():
        target = Path(os.readlink(path))
        _with_links(target if target.is_absolute() else path.parent / target, found)


def _tar(members: list[Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("tmp", "etc", "root"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for top in ("bin", "sbin", "lib", "lib64"):  # merged /usr, as on the host
            if Path("/", top).is_symlink():
                info = tarfile.TarInfo(top)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(Path("/", top))
                tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for path in members:
            tar.add(str(path), arcname=str(path).lstrip("/"), recursive=False)
    return buf.getvalue()


def python_image() -> str:
    """The image's tag, built now unless an image of the same sources is in Podman's storage. The key: the
    interpreter's files, the extensions and the system's package database (the libraries change only through
    it), each by path, size and mtime, and this module's text; ldd runs only to build."""
    files, extensions = _sources()
    key = hashlib.sha256(Path(__file__).read_bytes())
    for path in [*files, *extensions, Path("/var/lib/dpkg/status")]:
        if path.exists():
            st = path.lstat()
            key.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    tag = f"{REPO}:{key.hexdigest()[:16]}"
    if _podman("image", "exists", tag).returncode == 0:
        return tag
    done = subprocess.run(["podman", "import", "--change", f"ENV PATH={Path(sys.base_prefix) / 'bin'}:/bin", "-",
                           tag], input=_tar(_members(files, extensions)), capture_output=True, timeout=600,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman import failed: {done.stderr.decode()[-2000:]}")
    return tag


def another_image(tag: str, label: str) -> str:
    """An image of ``tag``'s content and one more label: another image ID, the same files."""
    other = f"{REPO}-{label}:{tag.rpartition(':')[2]}"
    if _podman("image", "exists", other).returncode == 0:
        return other
    done = _podman("build", "--quiet", "--tag", other, "-f", "-", "--label", f"org.mcx.test={label}",
                   input=f"FROM {tag}\n", cwd="/tmp")
    if done.returncode != 0:
        raise RuntimeError(f"podman build failed: {done.stderr[-2000:]}")
    return other
