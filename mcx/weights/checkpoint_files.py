"""Where a checkpoint's files are: the CPU backend's state.pt, the pointer files naming a directory's newest
iteration (mcx's and Megatron-LM's), iteration directories' names, and what makes a directory a torch_dist
checkpoint. Pure: the worker writes by these names, and the planner checks ``[init]`` sources with them
before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

from mcx.errors import InputError

STATE_FILE = "state.pt"  # the CPU backend's checkpoint: {"model", "optimizer", "scheduler"} (mcx.train.cpu)
LATEST = "latest"  # an mcx checkpoint directory's pointer to its newest iteration (mcx.train.checkpoint)
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's pointer to its newest iteration
DIST_METADATA = ".metadata"  # torch.distributed.checkpoint's metadata: what makes a torch_dist checkpoint
CONVERT = ("convert it with Megatron-LM's tools/checkpoint/convert.py --saver mcore, or load it in Megatron-LM "
           "and save it again with --ckpt-format torch_dist")


def iter_name(step: int) -> str:
    """The directory of a checkpoint of ``step``, as mcx and Megatron-LM name it."""
    return f"iter_{step:07d}"


def checkpoint_dir(path: Path) -> Path:
    """The iteration directory ``path`` means: a Megatron-LM save directory (its TRACKER file names the
    iteration, or "release"), an mcx checkpoint directory (its ``latest`` file), or the iteration
    directory itself."""
    path = Path(path)
    if (path / TRACKER).is_file():
        text = (path / TRACKER).read_text(encoding="utf-8").strip()
        if text != "release" and not text.isdigit():
            raise InputError(f"{path / TRACKER} names no iteration (it holds {text[:40]!r});",
                             "point at the iteration directory (iter_NNNNNNN) itself.")
        chosen = path / ("release" if text == "release" else iter_name(int(text)))
    elif (path / LATEST).is_file():
        chosen = path / (path / LATEST).read_text(encoding="utf-8").strip()
    else:
        return path
    if not chosen.is_dir():
        raise InputError(f"{path} names {chosen.name} as its newest checkpoint, and there is no {chosen};",
                         "point at an iteration directory that exists.")
    return chosen


def dist_directory_problem(path: Path) -> tuple[str, str] | None:
    """(message, hint) when ``path`` is not a torch_dist checkpoint directory mcx can read, else None."""
    if not path.is_dir():
        return f"{path} is not a directory;", "point at a Megatron-Core distributed checkpoint directory."
    if any(path.glob("mp_rank_*")):
        return (f"{path} is a legacy Megatron-LM checkpoint (mp_rank_*/model_optim_rng.pt), not a torch_dist "
                "distributed checkpoint;", f"{CONVERT}.")
    try:
        backend = json.loads((path / "metadata.json").read_text(encoding="utf-8")).get("sharded_backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    if backend not in (None, "torch_dist"):
        return f"{path} is a distributed checkpoint of the {backend!r} format; mcx reads torch_dist;", f"{CONVERT}."
    if not (path / DIST_METADATA).is_file():
        return (f"{path} is not a torch_dist distributed checkpoint (it has no {DIST_METADATA});",
                "point at a checkpoint's iteration directory (iter_NNNNNNN) or its parent, as Megatron-LM or mcx's "
                "GPU backend saved it.")
    return None
