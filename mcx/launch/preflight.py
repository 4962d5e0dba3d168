"""What a job needs of the machine it starts on: Transformer Engine, its data files, writable directories.

``mcx plan`` describes the job on the spec's hardware, so these facts about the machine it is typed
on are warnings there. ``mcx run`` checks them before anything starts where the job runs here
(local, torchrun); on Slurm the worker checks them in its first seconds on the compute node
(mcx.train.worker), so the smoke stage fails fast. Each problem is (key, what is wrong and the fix).
Standard library only: the worker runs this before it imports torch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from mcx.plan.layout_rules import te_features
from mcx.spec.schema import ExperimentSpec

Problems = list[tuple[str, str]]

MANIFEST = "manifest.json"  # what `mcx data prepare` writes beside the .bin/.idx


def te_importable() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def transformer_engine(spec: ExperimentSpec, *, cp: int, sequence_parallel: bool, where: str) -> Problems:
    """What the job asks of Transformer Engine when it is not importable ``where`` (e.g. "on node gpu-17")."""
    if te_importable():
        return []
    out: Problems = []
    if spec.model.transformer_impl == "transformer_engine":
        out.append(("model.transformer_impl", f"\"transformer_engine\" needs Transformer Engine, which is not "
                    f"importable {where}; install it in the job's environment, or set it to \"auto\" or \"local\""))
    for key, what, alternative in te_features(spec, cp=cp, sequence_parallel=sequence_parallel):
        out.append((key, f"{what} needs Transformer Engine, which is not importable {where}; install it in the "
                    f"job's environment, or {alternative}"))
    return out


def prepared_dataset(path: Path, prefix: str, shown: str, key: str = "data.path") -> Problems:
    """A dataset directory as the worker reads it: <prefix>.bin/.idx and mcx's manifest (``shown``: as the spec says
    it, under ``key``: data.path, or a mixture component's data.mix.NAME.path)."""
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "is not on this machine"
        return [(key, f"{shown!r}: {path} {what}; fetch the dataset there (`dvc pull`), prepare it "
                 f"(`mcx data prepare SOURCE --out {shown}`), or fix the path")]
    missing = [f"{prefix}{ext}" for ext in (".bin", ".idx") if not (path / f"{prefix}{ext}").is_file()]
    if missing:
        return [(key.removesuffix("path") + "prefix", f"{prefix!r}: {path} has no {' or '.join(missing)}; set it to "
                 "the dataset's file prefix (<prefix>.bin and <prefix>.idx)")]
    if not (path / MANIFEST).is_file():
        return [(key, f"{shown!r}: {path} holds {prefix}.bin/.idx but no {MANIFEST}, so it was not prepared "
                 "by mcx, which trains on datasets whose tokens, tokenizer and counts are recorded together; prepare "
                 f"it from its source documents with `mcx data prepare SOURCE --out {shown}`")]
    return []


def dataset(spec: ExperimentSpec, root: Path, *, skip: frozenset[str] = frozenset()) -> Problems:
    """The dataset and tokenizer files the spec names, relative to ``root``; ``skip``: keys not to check
    (a DVC-tracked path that `mcx run` pulls before it starts)."""
    data, tok = spec.data, spec.data.tokenizer
    out: Problems = []
    for key, path, prefix in data.datasets().values():
        if key not in skip:
            out += prepared_dataset(root / path, prefix, path, key)
    for key, value in (("data.tokenizer.path", tok.path), ("data.tokenizer.merges", tok.merges)):
        if value is not None and key not in skip and not (root / value).exists():
            out.append((key, f"{value!r}: {root / value} is not on this machine; copy the tokenizer file there, or "
                        "fix the path"))
    return out


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable(path: Path, key: str) -> Problems:
    """A directory the job writes (created if missing): it, or its nearest existing parent, must be writable."""
    path = Path(os.path.abspath(path))
    base = _existing_ancestor(path)
    if not base.is_dir():
        return [(key, f"{path}: {base} is a file, not a directory; choose another directory")]
    try:  # a real write: permissions, read-only mounts and full disks all show here
        fd, probe = tempfile.mkstemp(prefix=".mcx-write-check-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        made = "" if base == path else f" (it would be made inside {base})"
        return [(key, f"{path} is not writable on this machine{made}: {exc.strerror or exc}; choose a directory the "
                 "job can write, or fix its permissions or free space")]
    return []


def free_space(path: Path, need: int, key: str, what: str) -> Problems:
    """Room for ``need`` bytes (``what``: e.g. "one checkpoint of this model") where ``path`` is or would be made."""
    base = _existing_ancestor(Path(os.path.abspath(path)))
    try:
        free = shutil.disk_usage(base).free
    except OSError:
        return []  # writable() says what is wrong with the place itself
    if free >= need:
        return []
    gib = 1 << 30
    return [(key, f"{path}: {free / gib:,.1f} GiB free on its file system, but {what} takes about {need / gib:,.1f} "
             "GiB; free space there or choose a directory on a larger file system")]
