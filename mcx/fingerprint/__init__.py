"""Fingerprints: code (git), environment (lockfile, versions), config, data (DVC hash), hardware
-> one record -> a content-addressed run ID; ``explain`` says why two IDs differ.

Nothing here imports torch, megatron, mlflow or dvc: versions come from package metadata, data
hashes from the files DVC wrote.
"""

from mcx.fingerprint.explain import (
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
