"""``[launch.container]`` read as what it names: the image reference's kind, and each mount.

Pure: no runtime is asked anything here. An image reference must name content (D67):

* ``file``: a squashfs image on a shared filesystem (``.sqsh``, ``.squashfs``, ``.sqfs``), what pyxis runs
  (``enroot import -o image.sqsh docker://...`` makes one); hashed by content.
* ``digest``: a registry reference pinned by digest, ``[registry/]name@sha256:<64 hex>``.
* ``local``: a Podman image in this machine's storage by name or ID (``localhost/mcx:1``, ``3f2a...``),
  resolved to its image ID, which Podman computes from the image's content; runs under Slurm cannot use it
  (the nodes do not share this machine's storage).
"""

from __future__ import annotations

import re
from typing import Literal

from attrs import frozen

from mcx.spec.schema import ContainerSpec, ExperimentSpec

ImageKind = Literal["file", "digest", "local"]
SQUASHFS = (".sqsh", ".squashfs", ".sqfs")
APPTAINER = (".sif",)
DIGEST = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WHERE = "launch.container"


@frozen
class Mount:
    """``host`` seen at ``container`` inside, read-only when ``read_only``."""

    host: str
    container: str
    read_only: bool = False

    @property
    def text(self) -> str:
        """pyxis' and Podman's ``SRC:DST[:ro]``."""
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


def parse_mount(text: str) -> Mount:
    """``HOST:CONTAINER[:ro|rw]`` as a Mount; ValueError with the fix when it is not one."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"{text!r} is not HOST:CONTAINER or HOST:CONTAINER:ro (absolute paths, e.g. "
                         "\"/lustre/datasets:/datasets:ro\")")
    host, inside = parts[0], parts[1]
    if not (host.startswith("/") and inside.startswith("/")):
        raise ValueError(f"{text!r}: both paths must be absolute, e.g. \"/lustre/datasets:/datasets:ro\"")
    if "," in text:
        raise ValueError(f"{text!r} holds a ',', which separates mounts in pyxis' --container-mounts; "
                         "rename or link the directory")
    return Mount(host=host, container=inside, read_only=len(parts) == 3 and parts[2] == "ro")


def image_kind(image: str) -> ImageKind:
    """What ``image`` names (see the module docstring)."""
    if image.endswith(SQUASHFS + APPTAINER) or image.startswith(("/", "./", "../")):
        return "file"
    if DIGEST.match(image):
        return "digest"
    return "local"


def pyxis_image(image: str) -> str:
    """``image`` as pyxis' --container-image spells it: enroot writes the registry host before a '#'
    (``nvcr.io/nvidia/pytorch@sha256:...`` -> ``nvcr.io#nvidia/pytorch@sha256:...``)."""
    if image_kind(image) != "digest":
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost") and "@" not in first:
        return f"{first}#{rest}"
    return image


def _has_control(text: str) -> bool:
    return any(c in text for c in "\n\r\0")


def container_problems(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Every problem of ``[launch.container]``, each as (key, message with the fix)."""
    return check_container(spec.launch.container, spec.launch.kind)


def check_container(c: ContainerSpec, kind: str) -> list[tuple[str, str]]:
    """Every problem of the container table ``c`` for ``launch.kind = kind``: (key, message with the fix)."""
    out: list[tuple[str, str]] = []
    if c.image is None:
        if c != ContainerSpec():
            out.append((f"{_WHERE}.image", "is missing: mounts, workdir, env and python apply to a container; "
                                           "name the image, or remove [launch.container]"))
        return out
    if not c.image.strip() or any(ch.isspace() for ch in c.image) or _has_control(c.image):
        out.append((f"{_WHERE}.image", f"{c.image!r} is not an image reference; give a .sqsh file, a local Podman "
                                       "image or name@sha256:<digest>"))
        return out
    ikind = image_kind(c.image)
    if ikind == "file" and c.image.endswith(APPTAINER):
        out.append((f"{_WHERE}.image", f"{c.image!r} is an Apptainer image, and mcx runs containers with pyxis "
                                       "(Slurm) or Podman; convert it (e.g. to a squashfs for pyxis with "
                                       "`unsquashfs` + `mksquashfs`, or import its registry image into Podman)"))
    elif kind == "slurm" and ikind == "local":
        out.append((f"{_WHERE}.image", f"{c.image!r} names an image by a tag or a local name, which pyxis pulls "
                                       "again on each node and which can change under the run; pin it "
                                       "(name@sha256:<digest>) or give a squashfs file on a shared filesystem "
                                       f"(enroot import -o image.sqsh podman://{c.image})"))
    elif kind != "slurm" and ikind == "file":
        out.append((f"{_WHERE}.image", f"{c.image!r} is an image file, which pyxis runs on Slurm; launch.kind = "
                                       f"{kind!r} runs Podman: load the image into Podman and name it, or set "
                                       "launch.kind = \"slurm\""))
    for i, text in enumerate(c.mounts):
        try:
            if _has_control(text):
                raise ValueError(f"{text!r} holds a newline or NUL")
            parse_mount(text)
        except ValueError as e:
            out.append((f"{_WHERE}.mounts[{i}]", str(e)))
    if c.workdir is not None and (not c.workdir.startswith("/") or _has_control(c.workdir)):
        out.append((f"{_WHERE}.workdir", f"{c.workdir!r} must be an absolute path inside the container"))
    for i, name in enumerate(c.env):
        if not _NAME.match(name):
            out.append((f"{_WHERE}.env[{i}]", f"{name!r} is not an environment variable name (letters, digits, "
                                              "'_', not starting with a digit)"))
    if c.python is not None and (not c.python.strip() or _has_control(c.python)):
        out.append((f"{_WHERE}.python", f"{c.python!r} is not an interpreter; give its path or name inside the "
                                        "image, e.g. \"python\""))
    return out
