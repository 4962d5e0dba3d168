"""The container image's identity: the content ``[launch.container] image`` names, as ``sha256:<hex>``.

A squashfs file: the sha256 of its bytes, kept in ``.mcx/file-hashes.json`` like a dataset's (a ``stat`` per
unchanged file). A reference pinned by digest: that digest, with nothing to ask. A local Podman image: its
image ID, which Podman computes from the image's content (``podman image inspect``); the launcher then runs
that ID, never the name, so a name moved to another image after planning changes nothing under the run.
A name that no runtime here resolves is bad input (it could name anything tomorrow); see D67.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.fingerprint.filehashes import FileHashes
from mcx.spec.container import ImageKind, image_kind

KEY = "launch.container.image"
INSPECT_TIMEOUT_S = 60


@frozen
class ImageIdentity:
    """``reference`` as written, what it is, and the content it names (``sha256:<hex>``)."""

    reference: str
    kind: ImageKind
    digest: str


def image_file(reference: str, project_root: Path) -> Path:
    """The file a ``file`` reference names (relative to the project)."""
    return (Path(project_root) / reference).resolve()


def podman_image_id(reference: str) -> str:
    """The ID (``sha256:<hex>``) of the image ``reference`` names in this machine's Podman storage."""
    podman = shutil.which("podman")
    if podman is None:
        raise InputError(f"{KEY} = {reference!r} names a local Podman image, and podman is not installed here",
                         "install Podman and build or pull the image, or pin it by digest (name@sha256:<digest>).")
    try:
        done = subprocess.run([podman, "image", "inspect", "--format", "{{.Id}}", reference], capture_output=True,
                              text=True, timeout=INSPECT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InputError(f"{KEY}: `podman image inspect {reference}` gave no answer in {INSPECT_TIMEOUT_S} s",
                         "check that `podman images` works here, then run again.") from None
    ident = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    if len(ident) != 64 or ident.strip("0123456789abcdef"):
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise InputError(f"{KEY} = {reference!r} is not an image in this machine's Podman storage ({said})",
                         "build or pull it first (`podman images` lists them), or pin it by digest "
                         "(name@sha256:<digest>); a tag cannot be resolved offline.")
    return f"sha256:{ident}"


def image_identity(reference: str, project_root: Path, *, rehash: bool = False) -> ImageIdentity:
    """The identity of ``reference``; InputError when it names no content this machine can check."""
    kind = image_kind(reference)
    if kind == "digest":
        return ImageIdentity(reference=reference, kind=kind, digest=reference.rpartition("@")[2])
    if kind == "local":
        return ImageIdentity(reference=reference, kind=kind, digest=podman_image_id(reference))
    path = image_file(reference, project_root)
    if not path.is_file():
        raise InputError(f"{KEY} = {reference!r}: {path} is not a file",
                         "give the squashfs image's path (absolute, or relative to the project), e.g. "
                         "made by `enroot import -o image.sqsh docker://REGISTRY#IMAGE@sha256:<digest>`.")
    hashes = FileHashes.for_project(project_root, full=rehash)
    digest = hashes.hash(path, "sha256")
    hashes.save()
    return ImageIdentity(reference=reference, kind=kind, digest=f"sha256:{digest}")
