"""What a run looks like in MLflow: params from the spec, tags from the fingerprint, the environment.

Params are the resolved spec flattened to dotted keys (``train.lr``, ``model.num_layers``); tables
inside lists and lists themselves are one value, as canonical JSON. Tags name every fingerprint
component under ``mcx.fp.<component>.<dotted key>`` from both the hashed part (``id``) and what was
observed (``info``), plus ``mcx.fp.<component>.hash``; the config component is the spec itself, so
it contributes only its hash, and the code component's two long maps one tag each (the modules hashed:
their count and the hash of the map; the paths changed since the commit: their count). Every value is a string, redacted, and clipped to MLflow's limits
(params at 500 characters, the oldest servers' limit; tags at 5,000): a clipped value ends with
``...[sha256:<12 hex of the full value>]`` so two different long values never look alike.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys
from typing import Any

from mcx.hashing import digest, digest_bytes
from mcx.track.redact import redact

PARAM_VALUE_LIMIT = 500
TAG_VALUE_LIMIT = 5000
KEY_LIMIT = 250
FP_TAG_PREFIX = "mcx.fp."
FINGERPRINT_COMPONENTS = ("code", "environment", "config", "data", "hardware")

# Packages named in the environment report (versions from metadata; nothing is imported).
REPORT_PACKAGES = ("mcx", "torch", "megatron-core", "transformer-engine", "numpy", "mlflow", "dvc",
                   "tokenizers", "sentencepiece", "attrs", "cattrs")
# Environment variables that change how training runs (or where it is recorded) go in the report.
REPORT_ENV_PREFIXES = ("CUDA", "NCCL", "NVTE", "NVIDIA", "TORCH", "PYTORCH", "CUBLAS", "CUDNN", "OMP_",
                       "MKL_", "SLURM", "MASTER_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MLFLOW", "MCX",
                       "HF_", "TRANSFORMERS", "TOKENIZERS", "PYTHONHASHSEED", "DVC")


def scalar_text(value: Any) -> str:
    """A param/tag value as text: TOML-like scalars, canonical JSON for anything structured."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def clip(text: str, limit: int) -> str:
    """``text`` if it fits, else a prefix plus the digest of the whole (total length == limit)."""
    if len(text) <= limit:
        return text
    tail = f"...[sha256:{digest_bytes(text.encode('utf-8'))[:12]}]"
    return text[: limit - len(tail)] + tail


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaves of nested dicts; lists, scalars and empty dicts are leaves."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def _clip_key(key: str) -> str:
    return key if len(key) <= KEY_LIMIT else clip(key, KEY_LIMIT)


def spec_params(spec_tree: dict[str, Any]) -> dict[str, str]:
    """MLflow params for a resolved spec (``spec_to_dict`` output, or the parsed spec.toml)."""
    flat = flatten(redact(spec_tree))
    return {_clip_key(k): clip(scalar_text(v), PARAM_VALUE_LIMIT) for k, v in sorted(flat.items())}


def fingerprint_tags(record: dict[str, Any]) -> dict[str, str]:
    """``mcx.fp.*`` tags for a fingerprint.json record (mcx.fingerprint.record_to_dict's output).

    Unknown top-level keys are ignored; ``side`` (the patch) and ``warnings`` are artifacts and the
    environment report, not tags.
    """
    record = redact(record)
    tags: dict[str, Any] = {}
    hashes = record.get("component_hashes") or {}
    for name in FINGERPRINT_COMPONENTS:
        comp = record.get(name)
        if name in hashes:
            tags[f"{name}.hash"] = hashes[name]
        if not isinstance(comp, dict) or name == "config":
            continue
        for part in ("id", "info"):
            sub = comp.get(part)
            if isinstance(sub, dict):
                base = name if part == "id" else f"{name}.info"
                tags.update(flatten(_counted(sub) if name == "code" else sub, base))
    if "schema" in record:
        tags["schema"] = record["schema"]
    if record.get("warnings"):
        tags["warnings"] = len(record["warnings"])
    return {_clip_key(FP_TAG_PREFIX + k): clip(scalar_text(v), TAG_VALUE_LIMIT) for k, v in sorted(tags.items())}


def _counted(code: dict[str, Any]) -> dict[str, Any]:
    """The code component with its module map and its changed paths as one value each (fingerprint.json holds them)."""
    out = dict(code)
    if isinstance(out.get("modules"), dict):
        out["modules"] = f"{len(out['modules'])} files, sha256 {digest(out['modules'])}"
    if isinstance(out.get("changes"), dict):
        out["changes"] = f"{len(out['changes'])} paths"
    return out


def _package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in REPORT_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment_report(fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The control plane's view of where a run was launched from, redacted (an artifact)."""
    env = {k: v for k, v in os.environ.items() if k.upper().startswith(REPORT_ENV_PREFIXES)}
    report = {
        "python": sys.version,
        "executable": sys.executable,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
        "packages": _package_versions(),
        "environment_variables": dict(sorted(env.items())),
    }
    if fingerprint is not None:
        report["fingerprint_warnings"] = list(fingerprint.get("warnings") or [])
        report["component_hashes"] = dict(fingerprint.get("component_hashes") or {})
    return redact(report)
