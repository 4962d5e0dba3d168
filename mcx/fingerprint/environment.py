"""Environment identity, read from package metadata: nothing here imports torch or CUDA.

Hashed (``id``): the sha256 of the lockfile that describes the environment (``lockfiles/<name>.txt``
in the project), the Python version, the installed versions of the packages that compute
(``torch``, ``megatron-core``, ``transformer-engine``, ``numpy``), the CUDA, cuDNN and NCCL versions
the torch wheel brings, and whether ``transformer_engine`` is importable (with
``model.transformer_impl = "auto"`` that decides the layer spec, so it changes the numbers).

With ``[launch.container]``, also the image's content (``container_image``: ``sha256:<hex>``, D67): the same
spec in another image is another run. Without one the key is absent, so such runs keep their IDs.

Recorded only (``info``): the lockfile's name and where that name came from, the record keepers'
versions (``mlflow``, ``dvc``: they cannot change a result, and a lockfile bump already changes the
hash), and where the CUDA version was read.

The lockfile name is an argument; without one it is ``$MCX_LOCKFILE``, else "cpu". Guessing it from
the machine would make the ID depend on which probe ran first; the caller states it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
from pathlib import Path
from typing import Any

from mcx.errors import InputError
from mcx.fingerprint.image import image_identity
from mcx.spec.schema import ContainerSpec

LOCKFILE_ENV = "MCX_LOCKFILE"
DEFAULT_LOCKFILE = "cpu"
_LOCKFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# record key -> distribution names to try, first installed wins.
HASHED_PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "megatron_core": ("megatron-core",),
    "transformer_engine": ("transformer-engine", "transformer-engine-torch", "transformer-engine-cu13",
                           "transformer-engine-cu12"),
    "numpy": ("numpy",),
}
RECORDED_PACKAGES: dict[str, tuple[str, ...]] = {"mlflow": ("mlflow", "mlflow-skinny"), "dvc": ("dvc",)}

# CUDA major versions whose wheels mcx knows, newest first (nvidia-*-cuXX distribution suffixes).
_CUDA_MAJORS = ("13", "12", "11")


def dist_version(*names: str) -> str | None:
    """Version of the first installed distribution among ``names``; None if none is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _major_minor(version: str | None) -> str | None:
    if version is None:
        return None
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version


def cuda_version(torch_version: str | None) -> tuple[str | None, str]:
    """(CUDA "major.minor", where it was read). A "+cpu" torch has no CUDA, whatever else is installed."""
    local = torch_version.partition("+")[2] if torch_version else ""
    if m := re.fullmatch(r"cu(\d+)(\d)", local):
        return f"{m.group(1)}.{m.group(2)}", "torch local version"
    if local:  # +cpu, +rocm6.2, ...: not a CUDA build
        return None, f"torch local version +{local}"
    names = ["nvidia-cuda-runtime", *(f"nvidia-cuda-runtime-cu{m}" for m in _CUDA_MAJORS)]
    for name in names:
        if v := dist_version(name):
            return _major_minor(v), name
    return None, "no CUDA runtime package"


def _nvidia_lib(lib: str) -> str | None:
    return dist_version(*(f"nvidia-{lib}-cu{m}" for m in _CUDA_MAJORS), f"nvidia-{lib}")


def choose_lockfile(lockfile: str | None) -> tuple[str, str]:
    """(lockfile name, where the name came from: "argument", "$MCX_LOCKFILE" or "default")."""
    if lockfile is not None:
        return lockfile, "argument"
    if env := os.environ.get(LOCKFILE_ENV):
        return env, f"${LOCKFILE_ENV}"
    return DEFAULT_LOCKFILE, "default"


def collect_environment(project_root: Path, lockfile: str | None = None, container: ContainerSpec | None = None,
                        rehash: bool = False) -> dict[str, Any]:
    """The environment component: ``{"id": ..., "info": ..., "warnings": [...]}``. ``container``: the spec's
    ``[launch.container]``, whose image is identified by content (``rehash``: an image file read again)."""
    name, source = choose_lockfile(lockfile)
    where = "--lockfile" if source == "argument" else source
    if not _LOCKFILE_NAME.fullmatch(name):
        raise InputError(f"{where}: {name!r} is not a lockfile name",
                         "give a plain name such as cpu or cuda13 (the file lockfiles/<name>.txt).")
    warnings: list[str] = []
    path = Path(project_root) / "lockfiles" / f"{name}.txt"
    try:
        lock_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        if source == "argument":
            raise InputError(f"--lockfile {name}: {path} does not exist",
                             "name a file in lockfiles/ (without .txt), or leave the option out.") from None
        lock_sha = None
        warnings.append(f"lockfile {path} ({where}) not found; the environment is identified by package "
                        f"versions only; set {LOCKFILE_ENV} or add the lockfile")
    versions = {key: dist_version(*names) for key, names in HASHED_PACKAGES.items()}
    cuda, cuda_source = cuda_version(versions["torch"])
    ident = {
        "lockfile_sha256": lock_sha,
        "python": platform.python_version(),
        **versions,
        "cuda": cuda,
        "cudnn": _nvidia_lib("cudnn") if cuda else None,
        "nccl": _nvidia_lib("nccl") if cuda else None,
        "transformer_engine_importable": importlib.util.find_spec("transformer_engine") is not None,
    }
    info = {
        "lockfile": name,
        "lockfile_source": source,
        "python_implementation": platform.python_implementation(),
        "cuda_source": cuda_source,
        **{key: dist_version(*names) for key, names in RECORDED_PACKAGES.items()},
    }
    if container is not None and container.image is not None:
        image = image_identity(container.image, project_root, rehash=rehash)
        ident["container_image"] = image.digest
        info["container_image"] = image.reference
        info["container_image_kind"] = image.kind
    return {"id": ident, "info": info, "warnings": warnings}
