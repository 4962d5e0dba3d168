"""mcx spec -> Megatron-LM: the ``pretrain_gpt.py`` arguments, and a complete launch script.

Every argument that matters is written explicitly, even where it equals Megatron-LM's default, so
the command means the same under another Megatron-LM version's defaults. Keys that do not matter for
the spec (fp8 settings without fp8, MoE settings without experts) are left out unless the spec sets a
non-default value. The parallel degrees come from the planned layout (or the spec when it fixes them).
The command always saves and resumes (``--save``, ``--load``, ``--save-interval``): an unset
``checkpoint.dir`` (mcx's run directory) becomes ``checkpoints/<name>``, which the whole script takes
from ``$CHECKPOINT_DIR`` when set. What no argument carries (``hardware.gpu``, ``smoke.*``, an open
parallel degree) travels in the whole script as ``# mcx:`` lines (mcx/interop/carried.py), so importing
it gives back the spec and its run ID (tests/test_interop.py round-trips this).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

from mcx.errors import InputError
from mcx.interop import carried
from mcx.interop.data_blend import export_data
from mcx.interop import flags as F
from mcx.interop.importer import import_script
from mcx.spec.keys import flatten, spec_keys
from mcx.interop.script import read_script
from mcx.plan.memory import ALLOCATOR_ENV, ALLOCATOR_VALUE
from mcx.spec.schema import ExperimentSpec

ENTRY = "pretrain_gpt.py"
_GROUPS = (("model", "MODEL_ARGS"), ("parallel", "MODEL_PARALLEL_ARGS"), ("train", "TRAINING_ARGS"),
           ("data", "DATA_ARGS"), ("checkpoint", "CHECKPOINT_ARGS"))
# Planned layout (mcx.plan.layout_rules.Layout, or the job contract's "layout" object) -> spec keys.
_LAYOUT = {"parallel.tensor": "tp", "parallel.pipeline": "pp", "parallel.virtual_pipeline": "vpp",
           "parallel.context": "cp", "parallel.expert": "ep", "parallel.sequence_parallel": "sequence_parallel",
           "parallel.distributed_optimizer": "distributed_optimizer"}


def _layout_value(layout: Any, name: str) -> Any:
    if isinstance(layout, Mapping):
        return layout.get(name)
    return getattr(layout, name, None)


def default_checkpoint_dir(spec: ExperimentSpec) -> str:
    """Where the exported command saves when the spec leaves checkpoint.dir to mcx's run directory."""
    return posixpath.join("checkpoints", spec.name)


def _values(spec: ExperimentSpec, layout: Any) -> dict[str, Any]:
    """The spec as {dotted.key: value}, parallel degrees from the layout; raise when a degree is open."""
    flat = flatten(spec)
    if flat["checkpoint.dir"] is None:
        flat["checkpoint.dir"] = default_checkpoint_dir(spec)
    if layout is not None:
        for key, name in _LAYOUT.items():
            v = _layout_value(layout, name)
            if v is not None or name == "vpp":
                flat[key] = v
    degrees = ["parallel.tensor", "parallel.pipeline", "parallel.context"]
    if flat["model.num_experts"] is not None:
        degrees.append("parallel.expert")
    open_keys = [k for k in degrees if flat[k] is None]
    if open_keys:
        raise InputError(f"{', '.join(open_keys)} {'is' if len(open_keys) == 1 else 'are'} unset, so the planner "
                         "chooses; the Megatron-LM command needs the numbers;",
                         "export with the plan's layout (mcx plan shows it) or set them in the spec.")
    return flat


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _resolved(key: str, flat: dict[str, Any]) -> Any:
    """Values Megatron-LM would read differently when left out."""
    v = flat[key]
    if key == "model.ffn_hidden_size" and v is None and flat["model.swiglu"]:
        return 4 * flat["model.hidden_size"]  # mcx's None; Megatron-LM would take 8/3 x hidden with --swiglu
    if key == "model.max_position_embeddings" and v is None:
        return flat["model.seq_length"]
    if key == "data.split" and (flat["data.valid"] or flat["data.test"]):
        return None  # per-split paths: Megatron-Core refuses a split beside them
    return v


def _rule(key: str, v: Any, flat: dict[str, Any]) -> list[str]:
    if key == "model.num_query_groups":
        return [] if v is None else ["--group-query-attention", "--num-query-groups", _fmt(v)]
    if key == "model.position_embedding_type":
        return ["--position-embedding-type", v]
    if key == "model.transformer_impl":
        return [] if v == "auto" else ["--transformer-impl", v]
    if key == "parallel.virtual_pipeline":
        return _virtual_pipeline(v, flat)
    if key in ("train.train_iters", "train.lr_warmup_iters", "train.lr_decay_iters"):
        return [] if v is None else [F.BY_KEY[key].args[0], _fmt(v)]
    if key == "train.precision":
        return {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [], "fp8-hybrid": ["--bf16", "--fp8-format", "hybrid"],
                "fp8-e4m3": ["--bf16", "--fp8-format", "e4m3"]}[v]
    if key == "train.recompute_granularity":
        return [] if v == "none" else ["--recompute-granularity", v]
    if key == "train.cuda_graphs":  # Megatron-LM refuses a full-iteration graph with its NaN check on (a host sync)
        return ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"] if v else []
    if key == "data.path":
        return export_data(flat)
    if key == "data.tokenizer.kind":
        return _tokenizer(flat)
    if key == "checkpoint.dir":
        return ["--save", v, "--load", v]
    if key == "checkpoint.interval":  # Megatron-LM needs it with --save; 0 (only the final save) is train_iters
        return ["--save-interval", _fmt(v or flat["train.train_iters"])]
    if key == "checkpoint.async_save":
        return ["--async-save", "--use-persistent-ckpt-worker"] if v else []
    return []  # data.prefix, the mixtures and the tokenizer's files travel with data.path and data.tokenizer.kind


def _virtual_pipeline(v: Any, flat: dict[str, Any]) -> list[str]:
    if v is None or v == 1:
        return []
    pp, layers = flat["parallel.pipeline"], flat["model.num_layers"]
    if pp <= 1 or layers % (pp * v):
        raise InputError(f"parallel.virtual_pipeline={v} needs parallel.pipeline above 1 and model.num_layers={layers} "
                         f"divisible by pipeline x virtual_pipeline = {pp * v};",
                         "choose degrees that split the layers evenly.")
    return ["--num-layers-per-virtual-pipeline-stage", _fmt(layers // (pp * v))]


def _tokenizer(flat: dict[str, Any]) -> list[str]:
    kind, path = flat["data.tokenizer.kind"], flat["data.tokenizer.path"]
    if kind == "gpt2":
        return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", path, "--merge-file", flat["data.tokenizer.merges"]]
    if kind == "sentencepiece":
        return ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", path]
    if kind == "huggingface":  # Megatron-LM's HuggingFaceTokenizer takes the directory of tokenizer.json
        return ["--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", posixpath.dirname(path) if posixpath.basename(path) == "tokenizer.json" else path]
    # bpe: mcx data prepare saves the trained tokenizer.json into the dataset directory.
    first = next(iter(flat["data.mix"].values()), None) if flat["data.path"] is None else None  # one for all (D60)
    return ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
            flat["data.path"] if first is None else first.path]


def grouped_args(spec: ExperimentSpec, layout: Any = None) -> list[tuple[str, list[list[str]]]]:
    """The arguments by spec section: [(section, [[flag, value...], ...])], in the table's order."""
    flat = _values(spec, layout)
    keys = spec_keys()
    groups: dict[str, list[list[str]]] = {section: [] for section, _ in _GROUPS}
    for row in F.FLAGS:
        if row.kind in ("launcher", "mcx"):
            continue
        v = flat[row.key]
        if not F.matters(row, flat) and v == keys[row.key].default:
            continue
        if row.kind == "value":
            v = _resolved(row.key, flat)
            words = [] if v is None else [row.args[0], _fmt(v)]
        elif row.kind == "switch":
            words = [row.args[0]] if v else []
        elif row.kind == "negated":
            words = [] if v else [row.args[0]]
        else:
            words = _rule(row.key, v, flat)
        if words:
            groups[row.key.split(".")[0]].append(words)
    return [(section, groups[section]) for section, _ in _GROUPS if groups[section]]


def export_args(spec: ExperimentSpec, layout: Any = None) -> list[str]:
    """The pretrain_gpt.py arguments for the spec's experiment (layout: the plan's, for open degrees)."""
    return [word for _, items in grouped_args(spec, layout) for words in items for word in words]


def args_text(spec: ExperimentSpec, layout: Any = None) -> str:
    """The arguments as shell text, one flag a line (what `mcx export --megatron-args` prints)."""
    lines = [shlex.join(words) for _, items in grouped_args(spec, layout) for words in items]
    return " \\\n".join(lines) + "\n"


def _item(words: list[str]) -> str:
    if words[0] == "--save":  # the directory is the script's CHECKPOINT_DIR
        return '--save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR"'
    return shlex.join(words)


def _array(name: str, items: list[list[str]]) -> list[str]:
    return [f"{name}=(", *[f"    {_item(words)}" for words in items], ")", ""]


def _sbatch_lines(spec: ExperimentSpec) -> list[str]:
    s, hw = spec.launch.slurm, spec.hardware
    q = shlex.quote
    lines = [f"#SBATCH --job-name={q(spec.name)}", f"#SBATCH --nodes={hw.nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={hw.gpus_per_node}", f"#SBATCH --time={q(s.time)}"]
    for opt, v in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("constraint", s.constraint)):
        if v is not None:
            lines.append(f"#SBATCH --{opt}={q(v)}")
    lines.append(f"#SBATCH --signal=TERM@{s.signal_grace_seconds}")
    lines.append("#SBATCH --requeue" if s.requeue else "#SBATCH --no-requeue")
    lines.extend(f"#SBATCH {q(extra)}" for extra in s.extra_sbatch)
    return lines


def export_script(spec: ExperimentSpec, layout: Any = None) -> str:
    """A complete bash script running the experiment with Megatron-LM: torchrun on one node, torchrun
    on each node (NODE_RANK and MASTER_ADDR from the environment), or srun + torchrun under Slurm.
    Its `# mcx:` lines carry what the command does not, for `mcx import` (mcx/interop/carried.py)."""
    groups = grouped_args(spec, layout)
    hw, port = spec.hardware, spec.launch.master_port
    q = shlex.quote
    slurm = spec.launch.kind == "slurm"
    out = ["#!/bin/bash"]
    if slurm:
        out.extend(_sbatch_lines(spec))
    out += ["", f"# {spec.name}: {' '.join(spec.description.split())}".rstrip(),
            "# Written by `mcx export` from an mcx spec: the same experiment with Megatron-LM's pretrain_gpt.py.",
            "# Run it from the root of a Megatron-LM checkout."]
    header = len(out)  # the `# mcx:` lines go here, once the command is known
    out += ["", "set -euo pipefail", "", "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    if spec.train.expandable_segments:
        out.append(f"export {ALLOCATOR_ENV}={ALLOCATOR_VALUE}")
    out += ["", f"GPUS_PER_NODE={hw.gpus_per_node}"]
    if slurm:
        out += ['NUM_NODES="$SLURM_NNODES"',
                'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"MASTER_PORT={port if port is not None else 6000}", "",
                "DISTRIBUTED_ARGS=(", '    --nproc_per_node "$GPUS_PER_NODE"', '    --nnodes "$NUM_NODES"',
                '    --rdzv_id "$SLURM_JOB_ID"', "    --rdzv_backend c10d",
                '    --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"', ")", ""]
    else:
        one = hw.nodes == 1
        out += [f"NUM_NODES={hw.nodes}",
                'NODE_RANK="${NODE_RANK:-0}"' if one else 'NODE_RANK="${NODE_RANK:?set NODE_RANK on each node}"',
                'MASTER_ADDR="${MASTER_ADDR:-localhost}"' if one else
                'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the first node}"',
                f"MASTER_PORT={port if port is not None else 6000}", "",
                "DISTRIBUTED_ARGS=(", '    --nproc_per_node "$GPUS_PER_NODE"', '    --nnodes "$NUM_NODES"',
                '    --node_rank "$NODE_RANK"', '    --master_addr "$MASTER_ADDR"', '    --master_port "$MASTER_PORT"',
                ")", ""]
    ckpt = spec.checkpoint.dir or default_checkpoint_dir(spec)
    out += ["# Megatron-LM saves here and resumes from the latest checkpoint on a restart.",
            f"CHECKPOINT_DIR=${{CHECKPOINT_DIR:-{q(ckpt)}}}", ""]
    names = dict(_GROUPS)
    for section, items in groups:
        out += _array(names[section], items)
    if slurm:
        out += _array("SIGNAL_ARGS", [["--exit-signal-handler"]])
    arrays = " ".join(f'"${{{names[section]}[@]}}"' for section, _ in groups)
    if slurm:
        arrays += ' "${SIGNAL_ARGS[@]}"'
    launcher = "srun torchrun" if slurm else "torchrun"
    out.append(f'{launcher} "${{DISTRIBUTED_ARGS[@]}}" {q(ENTRY)} {arrays}')
    text = "\n".join(out) + "\n"
    plain = import_script(text, name=spec.name, description=spec.description).spec
    lines = carried.lines(spec, plain, carried.command_digest(read_script(text)))
    return "\n".join([*out[:header], *lines, *out[header:]]) + "\n"


def export(spec: ExperimentSpec, layout: Any = None, *, script: bool = False) -> str:
    """What `mcx export SPEC --megatron-args` prints: the arguments, or with ``script`` a whole script."""
    return export_script(spec, layout) if script else args_text(spec, layout)
