"""`mcx import-hf` and `mcx export-hf`: Hugging Face model directories <-> specs and runs."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.data.dataset import read_manifest
from mcx.errors import InputError, RunIdError, SpecError
from mcx.fingerprint.components import InitComponent
from mcx.fingerprint.init_from import check_checkpoint, EXPORT_RECORD, run_source
from mcx.spec import load_spec, loads_spec
from mcx.spec.load import apply_overrides
from mcx.weights.hfconfig import config_json, export_problems, model_table, read_config
from mcx.weights.hftensors import check_tensors
from mcx.weights.sources import open_weights

SEQ_LENGTH_CAP = 4096  # import-hf's default sequence length: the model's context, at most this
TABLES_NEEDED = ("train", "data")
TOKENIZER_CONFIG = "tokenizer_config.json"
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
              "GIB": 2**30, "TIB": 2**40}
PRECISION_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8-hybrid": "bf16", "fp8-e4m3": "bf16"}


@frozen
class ImportedHf:
    text: str  # the spec
    notes: tuple[str, ...]


def import_hf(directory: str, project: Path, *, out: str | None = None, extends: str | None = None,
              name: str | None = None, seq_length: int | None = None,
              overrides: Sequence[str] = ()) -> ImportedHf:
    """A spec whose [model] is the Hugging Face model in ``directory`` and whose weights start from it
    (``[init] from = "hf:..."``); [train] and [data] come from ``extends`` or ``overrides``. The spec is
    loaded and checked before it is written to ``out`` (which must not exist)."""
    import tomli_w

    source = Path(directory).expanduser().resolve()
    if not source.is_dir():
        raise InputError(f"{directory} is not a directory;", "give the Hugging Face model directory (config.json, "
                         "*.safetensors).")
    hf = read_config(source)
    check_tensors(source, hf)  # the weights must be the model config.json describes before a spec starts from them
    if seq_length is not None and seq_length < 1:
        raise InputError(f"--seq-length {seq_length} must be positive;", "give the training sequence length.")
    seq = seq_length or min(hf.max_position_embeddings, SEQ_LENGTH_CAP)
    dest = Path(out).resolve() if out else None
    if dest is not None and dest.exists():
        raise InputError(f"{out} already exists;", "choose another -o path or remove it first.")
    here = dest.parent if dest else Path.cwd()
    data: dict[str, Any] = {}
    if extends:
        base = Path(extends).expanduser().resolve()
        if not base.is_file():
            raise InputError(f"--extends {extends}: no such spec;", "name the spec whose [train] and [data] to use.")
        data["extends"] = os.path.relpath(base, here)
    data["name"] = name or _spec_name(source.name)
    data["description"] = f"{hf.architecture} from {source} (mcx import-hf)"
    data["model"] = model_table(hf, seq)
    data["init"] = {"from": "hf:" + _project_path(source, project)}
    data = apply_overrides(data, list(overrides))
    text = (f"# {hf.architecture} from {source}, by mcx import-hf: [model] from its config.json, the weights from\n"
            "# its safetensors ([init]); the model's keys must stay as they are for the weights to load.\n"
            + tomli_w.dumps(data))
    fd, tmp = tempfile.mkstemp(prefix=".import-hf-", suffix=".toml", dir=here)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            spec = load_spec(tmp)
        except SpecError as exc:
            raise _missing_tables(exc, out or "the spec") from None
        if dest is not None:
            os.link(tmp, dest)  # fails rather than replace a file that appeared meanwhile
    finally:
        os.unlink(tmp)
    return ImportedHf(text, tuple(_notes(hf, source, spec)))


def _spec_name(dirname: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", dirname).strip("-._") or "hf-model"
    return name[:100] if name[0].isalnum() else "m" + name[:99]


def _project_path(path: Path, project: Path) -> str:
    """``path`` relative to the project when inside it (init.from resolves against the project), else absolute."""
    try:
        return path.relative_to(Path(project).resolve()).as_posix()
    except ValueError:
        return str(path)


def _missing_tables(exc: SpecError, what: str) -> SpecError:
    """The loader's problems, and how to supply [train] and [data] when they are what is missing."""
    problems = list(exc.problems)
    if any(key.split(".")[0] in TABLES_NEEDED and "missing" in message for key, message in problems):
        problems.append(("--extends", f"{what} takes its [train] and [data] tables from another spec: give "
                         "--extends BASE.toml, or each missing key with --set KEY=VALUE"))
    return SpecError(problems, what)


def _notes(hf: Any, source: Path, spec: Any) -> list[str]:
    notes = []
    tokenizer = next((source / f for f in ("tokenizer.json", "tokenizer.model") if (source / f).is_file()), None)
    tok = spec.data.tokenizer
    if tokenizer is not None and (tok.path is None or Path(tok.path).name != tokenizer.name):
        notes.append(f"the model's tokenizer is {tokenizer}: train on data tokenized with it (`mcx data prepare "
                     f"CORPUS --tokenizer {tokenizer} --out datasets/NAME`, then data.path = \"datasets/NAME\"); "
                     f"this spec's data.path is {spec.data.path!r}")
    if hf.rope_scaling_factor is not None:
        notes.append(f"RoPE scaling: LLaMA 3's, factor {hf.rope_scaling_factor:g} (model.rope_scaling)")
    if spec.model.seq_length > hf.max_position_embeddings:
        notes.append(f"model.seq_length {spec.model.seq_length} is beyond the model's max_position_embeddings "
                     f"({hf.max_position_embeddings}): a long-context extension")
    return notes


# -- export ------------------------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """Bytes from "5GB", "500MB", "2GiB" or a plain number (decimal units as Hugging Face's max_shard_size)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in SIZE_UNITS or float(m.group(1)) <= 0:
        raise InputError(f"--max-shard-size {text!r} is not a size;", "write e.g. 5GB, 500MB or 2GiB.")
    return max(1, int(float(m.group(1)) * SIZE_UNITS[unit]))


def export_hf(run_id: str, project: Path, out: str, *, step: int | None = None, dtype: str | None = None,
              max_shard_size: str = "5GB", progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Write run ``run_id``'s final checkpoint (or ``step``'s) as a Hugging Face model directory ``out``:
    config.json, safetensors shards with their index, the dataset's tokenizer files, and ``mcx.json`` (the
    run ID and checkpoint content it came from). Any layout the run trained with (TP, PP, EP)."""
    root = Path(project).resolve()
    run_dir = root / ".mcx" / "runs" / run_id
    if not re.fullmatch(r"[0-9a-f]{12}", run_id) or not (run_dir / "spec.toml").is_file():
        raise RunIdError(f"no run {run_id} in this project;", "`mcx ls` lists the runs here.")
    dest = Path(out).expanduser()
    dest = dest if dest.is_absolute() else root / dest  # as every directory option: relative to the project
    if dest.exists():
        raise InputError(f"-o {out} already exists;", "choose a new directory: the export never replaces one.")
    spec = loads_spec((run_dir / "spec.toml").read_text(encoding="utf-8"), str(run_dir / "spec.toml"))
    problems = export_problems(spec.model)
    if problems:
        raise SpecError(problems, f"run {run_id}")
    found = run_source(root, run_id, step, key="export-hf", step_key="--step")
    source = InitComponent(id=found["id"], info=found["info"])
    check_checkpoint(root, run_id, Path(source.path), "export-hf")  # every file's CRC-32, before a read
    manifest = _manifest(root, spec, read_manifest)
    vocab = spec.model.vocab_size or (manifest or {}).get("tokenizer", {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise InputError(f"export-hf: run {run_id}'s vocabulary size is unknown here (its dataset "
                         f"{_dataset_dir(root, spec).relative_to(root)} "
                         "is not on this machine);", f"`mcx pull {run_id}` fetches it, or set model.vocab_size.")
    dtype_name = dtype or PRECISION_DTYPE[spec.train.precision]
    files, special = _tokenizer_files(root, spec, manifest)
    files[EXPORT_RECORD] = (json.dumps({"run_id": run_id, "stage": "full", **source.id,
                                        "spec": spec.name}, indent=2, sort_keys=True) + "\n").encode()
    shard_bytes = parse_size(max_shard_size)
    dest.parent.mkdir(parents=True, exist_ok=True)
    return _write(source, spec, vocab, dest, dtype_name, shard_bytes, files, special, progress)


def _write(source: InitComponent, spec: Any, vocab: int, dest: Path, dtype_name: str, shard_bytes: int,
           files: dict[str, bytes], special: dict[str, int | None], progress: Callable[[str], None]) -> dict[str, Any]:
    from mcx.weights.hf_convert import DTYPES, HF_DTYPE_NAMES, Shapes, write_hf
    m = spec.model
    shapes = Shapes(m.num_layers, m.num_attention_heads, m.num_query_groups or m.num_attention_heads,
                    m.kv_channels or m.hidden_size // m.num_attention_heads, m.num_experts,
                    not m.untie_embeddings_and_output_weights)
    dtype = DTYPES[dtype_name]
    config = config_json(m, vocab, HF_DTYPE_NAMES[dtype], special)
    weights = open_weights(Path(source.path), source.format)
    written = write_hf(weights, shapes, dest, config, dtype, shard_bytes, files, progress)
    return {"run_id": source.run_id, "step": source.step, "out": str(dest),
            "architecture": config["architectures"][0], "dtype": dtype_name, **written,
            "tokenizer": sorted(f for f in files if f not in (EXPORT_RECORD,))}


def _dataset_dir(root: Path, spec: Any) -> Path:
    """Where the run's tokenizer lies: its dataset, or a mixture's first component (all share one; D60)."""
    path: str = next(iter(spec.data.datasets().values()))[1]
    return root / path


def _manifest(root: Path, spec: Any, read_manifest: Callable[[Path], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return read_manifest(_dataset_dir(root, spec))
    except InputError:
        return None


def _tokenizer_files(root: Path, spec: Any, manifest: dict[str, Any] | None) -> tuple[dict[str, bytes], dict[str, int | None]]:
    """The dataset's tokenizer files and a tokenizer_config.json that lets AutoTokenizer load them; the special
    token ids for config.json. Nothing when the dataset is not here (the weights still export)."""
    if manifest is None:
        return {}, {}
    tok = manifest["tokenizer"]
    directory = _dataset_dir(root, spec)
    files = {name: (directory / name).read_bytes() for name in tok["files"] if (directory / name).is_file()}
    special = {"eos": tok.get("eod"), "pad": tok.get("pad"), "bos": None}
    names = _token_names(tok["kind"], files, special)
    cls = {"bpe": "PreTrainedTokenizerFast", "huggingface": "PreTrainedTokenizerFast", "gpt2": "GPT2TokenizerFast",
           "sentencepiece": "LlamaTokenizer"}[tok["kind"]]
    config = {"tokenizer_class": cls, "model_max_length": spec.model.seq_length, "clean_up_tokenization_spaces": False,
              **{f"{k}_token": v for k, v in names.items() if v is not None}}
    files[TOKENIZER_CONFIG] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    return files, special


def _token_names(kind: str, files: dict[str, bytes], special: dict[str, int | None]) -> dict[str, str | None]:
    """The strings of the special token ids, from tokenizer.json's added tokens or GPT-2's vocab.json."""
    by_id: dict[int, str] = {}
    if "tokenizer.json" in files:
        raw = json.loads(files["tokenizer.json"])
        by_id = {t["id"]: t["content"] for t in raw.get("added_tokens", [])}
        vocab = (raw.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            by_id = {**{i: t for t, i in vocab.items()}, **by_id}
    elif "vocab.json" in files:
        by_id = {i: t for t, i in json.loads(files["vocab.json"]).items()}
    return {k: by_id.get(v) if v is not None else None for k, v in special.items() if k != "bos"}
