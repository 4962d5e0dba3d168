"""The init component: the identity of the weights a run starts from (``[init] from``).

A run that starts from another run holds that run's ID and the content hash of the checkpoint it
loads; one that starts from a model directory (``hf:``, ``megatron:``) holds the directory's content
hash. The component is part of the run ID only when ``init.from`` is set, so every run that starts
from random weights keeps the ID it had. A changed parent (retrained, another step, one byte of a
model file) therefore changes the child's ID; moving the parent's directory does not.

A checkpoint's content hash is the digest of its ``checksums.json`` file list (size and CRC-32 of every
file, written at its commit: mcx.train.checksums), ``meta.json`` left out because it holds the save time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcx.errors import InputError, RunIdError, SpecError
from mcx.fingerprint.data import tree_sha256
from mcx.fingerprint.filehashes import FileHashes
from mcx.hashing import digest
from mcx.jsonfile import read_json
from mcx.spec import ExperimentSpec, loads_spec
from mcx.spec.schema import ModelSpec
from mcx.spec.rules import init_source

RUNS_DIR = Path(".mcx") / "runs"
POINTERS = Path(".mcx") / "checkpoints"  # <id>/<stage>.dvc: the committed pointers of a run's final checkpoints
CHECKSUMS = "checksums.json"
META = "meta.json"
STATE_FILE = "state.pt"  # the CPU backend's checkpoint (mcx.train.cpu); anything else is a dist checkpoint


def collect_init(spec: ExperimentSpec, project_root: Path, rehash: bool = False) -> dict[str, Any] | None:
    """``{"id", "info", "warnings"}`` of ``spec.init``'s source; None when the run starts from random weights.

    Raises RunIdError / InputError naming ``init.from`` (or ``init.step``) when the source is not there,
    is not finished, or is not a checkpoint mcx can read."""
    if spec.init.source is None:
        return None
    parsed = init_source(spec.init.source)
    if parsed is None:  # the spec's rules refuse it first; a hand-made spec object may not have been checked
        raise InputError(f"init.from: {spec.init.source!r} is not a source;", "see docs/spec.md, [init].")
    kind, rest = parsed
    root = Path(project_root).resolve()
    if kind == "run":
        source = run_source(root, rest, spec.init.step)
        parent = root / RUNS_DIR / rest / "spec.toml"  # absent in a clone: the worker's strict load checks shapes
        if parent.is_file():
            problems = model_mismatches(loads_spec(parent.read_text(encoding="utf-8"), str(parent)).model,
                                        spec.model, f"run {rest}")
            if problems:
                raise SpecError(problems)
        return source
    path = Path(rest).expanduser()
    path = (path if path.is_absolute() else root / path).resolve()
    if not path.is_dir():
        raise InputError(f"init.from: {rest!r} is not a directory (looked at {path});",
                         f"point init.from at the {'Hugging Face model' if kind == 'hf' else 'checkpoint'} directory.")
    hashes = FileHashes.for_project(root, full=rehash)
    content, files, size = tree_sha256(path, hashes)
    hashes.save()
    return {"id": {"kind": kind, "content": content},
            "info": {"path": str(path), "format": "hf" if kind == "hf" else "dist", "files": files, "bytes": size},
            "warnings": []}


def run_source(root: Path, run_id: str, step: int | None) -> dict[str, Any]:
    """The checkpoint of run ``run_id`` (its final one, or ``step``'s) as an init component."""
    run_dir = root / RUNS_DIR / run_id
    pointer = root / POINTERS / run_id / "full.dvc"
    if not run_dir.is_dir() and pointer.is_file():  # a clone: the run's final checkpoint, by its committed pointer
        return _pointed(run_id, pointer, step)
    if not run_dir.is_dir():
        raise RunIdError(f"init.from: no run {run_id} in this project (no {run_dir});",
                         "train it first, or start from a run of this project (`mcx ls`).")
    job = read_json(run_dir / "full" / "job.json")
    if not isinstance(job, dict) or not isinstance(job.get("checkpoint_dir"), str):
        raise InputError(f"init.from: run {run_id} has no full stage (it stopped at the smoke stage or never "
                         "started);", "start from a run whose full stage finished (`mcx ls`).")
    checkpoints = Path(job["checkpoint_dir"])
    if step is None:
        status = (read_json(run_dir / "run.json") or {}).get("status")
        latest = checkpoints / "latest"
        if status != "finished" or not latest.is_file():
            raise InputError(f"init.from: run {run_id} never finished (status {status or 'unknown'}), so it has no "
                             "final checkpoint;", f"finish it (`mcx run` of its spec resumes it), or start from a step "
                             f"it saved with init.step ({_saved_steps(checkpoints)}).")
        path = checkpoints / latest.read_text(encoding="utf-8").strip()
    else:
        path = checkpoints / f"iter_{step:07d}"
        if not path.is_dir():
            raise InputError(f"init.step: run {run_id} has no checkpoint of step {step};",
                             f"name a step it saved ({_saved_steps(checkpoints)}).")
    return _checkpoint(run_id, path)


def _pointed(run_id: str, pointer: Path, step: int | None) -> dict[str, Any]:
    """The final checkpoint of a run recorded in another clone, where its committed DVC pointer says."""
    import yaml  # PyYAML, a dvc dependency

    if step is not None:
        raise InputError(f"init.step: run {run_id} was trained in another clone, and only its final checkpoint "
                         "travels (its DVC pointer);", "unset init.step, or start from it where it was trained.")
    try:
        path = (pointer.parent / yaml.safe_load(pointer.read_text(encoding="utf-8"))["outs"][0]["path"]).resolve()
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"init.from: {pointer} is not a checkpoint pointer mcx wrote ({exc});",
                         "restore it from git (git checkout -- it).") from None
    if not path.is_dir():
        raise InputError(f"init.from: run {run_id}'s final checkpoint is in DVC but not in this clone ({path});",
                         f"`mcx pull {run_id}` fetches it.")
    return _checkpoint(run_id, path)


def _checkpoint(run_id: str, path: Path) -> dict[str, Any]:
    checks = read_json(path / CHECKSUMS)
    if not (isinstance(checks, dict) and isinstance(checks.get("files"), dict)):
        raise InputError(f"init.from: {path} has no {CHECKSUMS}, so its content cannot be identified;",
                         f"`mcx pull {run_id}` restores the checkpoint from DVC, or train the run again.")
    meta = read_json(path / META) or {}
    files = {name: entry for name, entry in checks["files"].items() if name != META}
    return {"id": {"kind": "run", "run_id": run_id, "step": meta.get("step"),
                   "checkpoint": digest({"algorithm": checks.get("algorithm"), "files": files})},
            "info": {"path": str(path), "format": "torch" if (path / STATE_FILE).is_file() else "dist",
                     "consumed_samples": meta.get("consumed_samples"), "layout": meta.get("layout")},
            "warnings": []}


# [model] keys that shape the weights: a source and the run it starts must agree on each. Others (the
# sequence length and RoPE base of a long-context extension, dropout, the MoE router's settings) may change.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "kv_channels", "vocab_size", "make_vocab_size_divisible_by", "normalization", "swiglu",
              "position_embedding_type", "untie_embeddings_and_output_weights", "add_bias_linear", "add_qkv_bias",
              "num_experts", "moe_ffn_hidden_size")


def model_mismatches(source: ModelSpec, model: ModelSpec, what: str) -> list[tuple[str, str]]:
    """(model.key, problem) for every weight-shaping key where ``model`` differs from the source's."""
    return [(f"model.{key}", f"{getattr(model, key)!r} here, {getattr(source, key)!r} in {what} (init.from); "
                             "the weights only load into the same shapes")
            for key in SHAPE_KEYS if getattr(source, key) != getattr(model, key)]


def _saved_steps(checkpoints: Path) -> str:
    steps = sorted(int(p.name[5:]) for p in checkpoints.glob("iter_*") if p.is_dir() and p.name[5:].isdigit())
    return "saved steps: " + ", ".join(map(str, steps)) if steps else "it saved none"
