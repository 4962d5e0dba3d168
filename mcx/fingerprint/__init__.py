"""Fingerprints: code (git), environment (lockfile, versions), config, data (DVC hash), hardware
-> one record -> a content-addressed run ID; ``explain`` says why two IDs differ.

Nothing here imports torch, megatron, mlflow or dvc: versions come from package metadata, data
hashes from the files DVC wrote.

The components in detail: code (``code.py``: the mcx modules a run executes, by content, found by
``modules.py`` as the import closure of the worker, the planner and the stage launcher; the commit, branch
and uncommitted paths as provenance beside them, D52); environment (lockfile, versions, and with ``[launch.container]`` the image's content, ``image.py``, D67); config; data
(content: a DVC-tracked path is its record's md5 once the workspace hashes to it, ``dvcworkspace.py``, else
sha256 over its files; each file's hash kept by (inode, mtime, size) in ``.mcx/file-hashes.json``,
``filehashes.py``, D37, and beside a dataset ``.bin``'s hash its largest token id, which the planner checks
against the vocabulary, D51); hardware; and ``init.py`` the source of a run's weights (``[init] from``: a
parent run's ID and checkpoint content, or a model directory's content; docs/lineage.md). They make one
record and the run ID; ``explain`` diffs two records. Side effects: git, nvidia-smi, ``podman image inspect``, reads .dvc files and
the data files whose key changed (all with ``--verify-data``), writes ``.mcx/file-hashes.json``.
"""

from mcx.fingerprint.diff import (
    ComponentDiff,
    Explanation,
    KeyChange,
    explain,
    explanation_to_dict,
    load_record,
)
from mcx.fingerprint.record import (
    COMPONENTS,
    FingerprintRecord,
    collect,
    component_hashes,
    patch_bytes,
    record_from_dict,
    record_to_dict,
    run_id,
)

__all__ = [
    "COMPONENTS",
    "ComponentDiff",
    "Explanation",
    "FingerprintRecord",
    "KeyChange",
    "collect",
    "component_hashes",
    "explain",
    "explanation_to_dict",
    "load_record",
    "patch_bytes",
    "record_from_dict",
    "record_to_dict",
    "run_id",
]
