"""The init component: the identity of the weights a run starts from (``[init] from``).

A run that starts from another run holds that run's ID and the content hash of the checkpoint it
loads; one that starts from a model directory (``hf:``, ``megatron:``) holds the directory's content
hash. The component is part of the run ID only when ``init.from`` is set, so every run that starts
from random weights keeps the ID it had. A changed parent (retrained, another step, one byte of a
model file) therefore changes the child's ID; moving the parent's directory does not.

A checkpoint's content hash is the digest of its ``checksums.json`` file list (size and CRC-32 of every
file, written at its commit: mcx.weights.checksums), ``meta.json`` left out because it holds the save time.
Collecting it also checks that every listed file is there at its recorded size (a stat each: a child's plan
reads no weights); the CRC-32 of every file is checked where the weights are read (`mcx run`, `export-hf`:
check_checkpoint), so a damaged parent is named, with its fix, before anything uses it (D48).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from mcx.contract.status import Status
from mcx.data.vocab import tokenizer_vocab_size
from mcx.errors import InputError, RunIdError, SpecError
from mcx.fingerprint.data import tree_sha256
from mcx.fingerprint.filehashes import FileHashes
from mcx.hashing import digest
from mcx.jsonfile import read_json
from mcx.spec import ExperimentSpec, loads_spec
from mcx.spec.rules import init_source
from mcx.spec.schema import ModelSpec
from mcx.weights.checkpoint_files import LATEST, STATE_FILE, checkpoint_dir, dist_directory_problem, iter_name
from mcx.weights.checksums import verify
from mcx.weights.hfconfig import as_model_spec, read_config
from mcx.weights.hftensors import check_tensors

RUNS_DIR = Path(".mcx") / "runs"
POINTERS = Path(".mcx") / "checkpoints"  # <id>/<stage>.dvc: the committed pointers of a run's final checkpoints
CHECKSUMS = "checksums.json"
META = "meta.json"
EXPORT_RECORD = "mcx.json"  # what `mcx export-hf` records of a directory's origin (mcx.ops.hf)


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
    fix = f"point init.from at the {'Hugging Face model' if kind == 'hf' else 'checkpoint'} directory."
    try:
        path = Path(rest).expanduser()
        path = (path if path.is_absolute() else root / path).resolve()
        found = path.is_dir()
    except (OSError, RuntimeError) as exc:  # ENAMETOOLONG, ELOOP; RuntimeError: ~user of no such user
        raise InputError(f"init.from: {rest[:80]!r}{'...' if len(rest) > 80 else ''} cannot be looked up "
                         f"({getattr(exc, 'strerror', None) or exc});", fix) from None
    if not found:
        raise InputError(f"init.from: {rest!r} is not a directory (looked at {path});", fix)
    info: dict[str, Any] = {}
    if kind == "hf":
        info = _hf_source(spec, root, path)
    else:
        path = megatron_checkpoint(path)
    hashes = FileHashes.for_project(root, full=rehash)
    content, files, size = tree_sha256(path, hashes)
    hashes.save()
    return {"id": {"kind": kind, "content": content},
            "info": {"path": str(path), "format": "hf" if kind == "hf" else "dist", "files": files, "bytes": size,
                     **info},
            "warnings": []}


def _hf_source(spec: ExperimentSpec, root: Path, path: Path) -> dict[str, Any]:
    """Check a Hugging Face source: its safetensors headers against its config.json (InputError naming each
    file or tensor), then its config.json against the spec's model (SpecError naming every differing key);
    what an export by mcx recorded of its origin (``mcx.json``), for the lineage."""
    hf = read_config(path)
    check_tensors(path, hf)
    model = spec.model
    # unknown here: the worker's strict load names a vocabulary that does not fit
    vocab = model.vocab_size or tokenizer_vocab_size(spec.data, root) or hf.vocab_size
    model = attrs.evolve(model, vocab_size=vocab)
    problems = model_mismatches(as_model_spec(hf, model.seq_length), model, f"hf:{path.name} (config.json)")
    if hf.sliding_window is not None and hf.sliding_window < model.seq_length:
        problems.append(("model.seq_length", f"{model.seq_length} is longer than the source's sliding_window "
                         f"({hf.sliding_window}), and mcx's attention is full causal attention; use at most "
                         f"{hf.sliding_window}"))
    if problems:
        raise SpecError(problems)
    origin = read_json(path / EXPORT_RECORD)
    return {"exported_from": origin} if isinstance(origin, dict) else {}


def megatron_checkpoint(path: Path) -> Path:
    """The checkpoint directory a ``megatron:`` source names (a save directory's newest iteration, or the
    iteration directory itself); InputError unless it is a torch_dist checkpoint."""
    path = checkpoint_dir(path)
    problem = dist_directory_problem(path)
    if problem is not None:
        raise InputError(f"init.from: {problem[0]}", problem[1])
    return path


def run_source(root: Path, run_id: str, step: int | None, key: str = "init.from",
               step_key: str = "init.step") -> dict[str, Any]:
    """The checkpoint of run ``run_id`` (its final one, or ``step``'s) as an init component; messages name
    ``key`` and ``step_key``, the input that asked for it."""
    run_dir = root / RUNS_DIR / run_id
    pointer = root / POINTERS / run_id / "full.dvc"
    if not run_dir.is_dir() and pointer.is_file():  # a clone: the run's final checkpoint, by its committed pointer
        return _pointed(root, run_id, pointer, step, key, step_key)
    if not run_dir.is_dir():
        raise RunIdError(f"{key}: no run {run_id} in this project (no {run_dir});",
                         "train it first, or start from a run of this project (`mcx ls`).")
    job = read_json(run_dir / "full" / "job.json")
    if not isinstance(job, dict) or not isinstance(job.get("checkpoint_dir"), str):
        raise InputError(f"{key}: run {run_id} has no full stage (it stopped at the smoke stage or never "
                         "started);", "start from a run whose full stage finished (`mcx ls`).")
    checkpoints = Path(job["checkpoint_dir"])
    if step is None:
        status = (read_json(run_dir / "run.json") or {}).get("status")
        latest = checkpoints / LATEST
        if status != Status.FINISHED or not latest.is_file():
            raise InputError(f"{key}: run {run_id} never finished (status {status or 'unknown'}), so it has no "
                             "final checkpoint;", f"finish it (`mcx run` of its spec resumes it), or start from a step "
                             f"it saved with {step_key} ({_saved_steps(checkpoints)}).")
        path = checkpoints / latest.read_text(encoding="utf-8").strip()
    else:
        path = checkpoints / iter_name(step)
        if not path.is_dir():
            raise InputError(f"{step_key}: run {run_id} has no checkpoint of step {step};",
                             f"name a step it saved ({_saved_steps(checkpoints)}).")
    return _checkpoint(root, run_id, path, key)


def _pointed(root: Path, run_id: str, pointer: Path, step: int | None, key: str, step_key: str) -> dict[str, Any]:
    """The final checkpoint of a run recorded in another clone, where its committed DVC pointer says."""
    import yaml  # PyYAML, a dvc dependency

    if step is not None:
        raise InputError(f"{step_key}: run {run_id} was trained in another clone, and only its final checkpoint "
                         "travels (its DVC pointer);", "unset init.step, or start from it where it was trained.")
    try:
        path = _pointed_path(pointer)
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"{key}: {pointer} is not a checkpoint pointer mcx wrote ({exc});",
                         "restore it from git (git checkout -- it).") from None
    if not path.is_dir():
        raise InputError(f"{key}: run {run_id}'s final checkpoint is in DVC but not in this clone ({path});",
                         f"`mcx pull {run_id}` fetches it.")
    return _checkpoint(root, run_id, path, key)


def _pointed_path(pointer: Path) -> Path:
    """The checkpoint directory a committed pointer names (its ``outs[0].path``, from the pointer's folder)."""
    import yaml  # PyYAML, a dvc dependency

    path: str = yaml.safe_load(pointer.read_text(encoding="utf-8"))["outs"][0]["path"]
    return (pointer.parent / path).resolve()


def _checkpoint(root: Path, run_id: str, path: Path, key: str = "init.from") -> dict[str, Any]:
    checks = read_json(path / CHECKSUMS)
    if not (isinstance(checks, dict) and isinstance(checks.get("files"), dict)):
        raise InputError(f"{key}: {path} has no {CHECKSUMS}, so its content cannot be identified;",
                         f"`mcx pull {run_id}` restores the checkpoint from DVC, or train the run again.")
    check_checkpoint(root, run_id, path, key, read=False)  # a stat a file: the plan stays fast, no weights are read
    meta = read_json(path / META) or {}
    files = {name: entry for name, entry in checks["files"].items() if name != META}
    return {"id": {"kind": "run", "run_id": run_id, "step": meta.get("step"),
                   "checkpoint": digest({"algorithm": checks.get("algorithm"), "files": files})},
            "info": {"path": str(path), "format": "torch" if (path / STATE_FILE).is_file() else "dist",
                     "consumed_samples": meta.get("consumed_samples"), "layout": meta.get("layout")},
            "warnings": []}


def check_checkpoint(root: Path, run_id: str, path: Path, key: str = "init.from", *, read: bool = True,
                     missing: bool = True) -> None:
    """InputError naming every file of run ``run_id``'s checkpoint ``path`` (in project ``root``) that does not match its
    ``checksums.json`` (``read=False``: missing or of another size; else also by CRC-32, reading every
    file; ``missing=False``: files not there are not damage), with the fix that exists for it: a final
    checkpoint in DVC comes back by ``mcx pull``."""
    problems, _ = verify(path, read=read, missing=missing)
    if not problems:
        return
    shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    in_dvc = any(_same_target(p, path) for p in (root / POINTERS / run_id).glob("*.dvc"))
    fix = (f"remove it (rm -r {shown}), then `mcx pull {run_id}` fetches the recorded version from DVC." if in_dvc
           else f"start from another checkpoint it saved ({_saved_steps(path.parent)}), or train run {run_id} "
                "again (`mcx run SPEC --force` of its spec).")
    many = len(problems) != 1
    raise InputError(f"{key}: run {run_id}'s checkpoint {shown} is damaged: {'; '.join(problems[:5])}"
                     f"{f' and {len(problems) - 5} more' if len(problems) > 5 else ''} (the file{'s' * many} "
                     f"{'do' if many else 'does'} not match {CHECKSUMS}, written when it was saved);", fix)


def _same_target(pointer: Path, path: Path) -> bool:
    import yaml  # PyYAML, a dvc dependency

    try:
        return _pointed_path(pointer) == path.resolve()
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):  # not a pointer to it: mcx pull names it
        return False


# [model] keys that shape the weights: a source and the run it starts must agree on each. Others (the
# sequence length and RoPE base of a long-context extension, dropout, the MoE router's settings) may change,
# and so may make_vocab_size_divisible_by: the padding rows are added or cut (mcx.weights.canonical).
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "kv_channels", "vocab_size", "normalization", "swiglu", "position_embedding_type",
              "untie_embeddings_and_output_weights", "add_bias_linear", "add_qkv_bias", "num_experts",
              "moe_ffn_hidden_size")


def model_mismatches(source: ModelSpec, model: ModelSpec, what: str) -> list[tuple[str, str]]:
    """(model.key, problem) for every weight-shaping key where ``model`` differs from the source's, each
    compared as it resolves (an unset num_query_groups is the number of heads, and so on)."""
    a, b = _resolved(source), _resolved(model)
    return [(f"model.{key}", f"{b[key]!r} here, {a[key]!r} in {what} (init.from); "
                             "the weights only load into the same shapes")
            for key in SHAPE_KEYS if a[key] != b[key]]


def _resolved(m: ModelSpec) -> dict[str, Any]:
    """The SHAPE_KEYS of ``m`` with unset sizes replaced by what Megatron-Core derives for them."""
    out = {key: getattr(m, key) for key in SHAPE_KEYS}
    out["num_query_groups"] = m.num_query_groups or m.num_attention_heads
    out["kv_channels"] = m.kv_channels or m.hidden_size // max(m.num_attention_heads, 1)
    out["ffn_hidden_size"] = m.ffn_hidden_size or 4 * m.hidden_size
    out["moe_ffn_hidden_size"] = (m.moe_ffn_hidden_size or out["ffn_hidden_size"]) if m.num_experts else None
    if m.num_experts:  # every MLP is the experts' (Mixtral style): the dense size shapes nothing
        out["ffn_hidden_size"] = None
    return out


def _saved_steps(checkpoints: Path) -> str:
    steps = sorted(int(p.name[5:]) for p in checkpoints.glob("iter_*") if p.is_dir() and p.name[5:].isdigit())
    return "saved steps: " + ", ".join(map(str, steps)) if steps else "it saved none"
