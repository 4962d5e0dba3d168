"""Config identity: the resolved spec minus what cannot change a result.

The hash covers ``mcx.spec.spec_to_dict(spec)`` (every field, defaults included, so a default that
changes between mcx versions changes the ID) with the keys of ``NOT_HASHED`` removed. A table key
removes the whole table.

Data paths: ``data.path`` and the tokenizer's file paths are left out because the data component
carries the content identity of what they point to, and ``collect`` never makes a record without it
(missing data is a DataError). Moving a dataset (or renaming its directory) therefore keeps the run
ID; changing a byte in it does not. So are the paths of a mixture's components (``data.mix.NAME.path``);
their prefixes and weights are hashed here, their content in the data component (D60).
"""

from __future__ import annotations

import copy
from typing import Any

from mcx.spec import ExperimentSpec, spec_to_dict
from mcx.spec.load import MIXTURE_TABLES

# dotted spec key -> why it cannot change what a run computes.
NOT_HASHED: dict[str, str] = {
    "name": "a label; two specs that train the same thing share a run",
    "description": "free text",
    "tracking": "where results are recorded (MLflow URI, experiment, DVC remote), not what they are",
    "checkpoint.dir": "where checkpoints are written",
    "checkpoint.keep": "how many old checkpoints are deleted",
    "checkpoint.async_save": "whether saving blocks the loop; the saved state is the same",
    "checkpoint.track_intermediate": "whether intermediate checkpoints also go to DVC",
    "budget": "the cost gate and the estimate's assumptions; nothing the worker reads",
    "baseline": "what the finished run is compared against",
    "launch.kind": "local, torchrun or slurm start the same layout on the hardware the record names",
    "launch.master_port": "a rendezvous port",
    "launch.slurm.partition": "scheduler placement; the GPUs are named by hardware.*",
    "launch.slurm.account": "who pays",
    "launch.slurm.time": "the wall-clock limit of one job; a longer run continues from its checkpoint",
    "launch.slurm.qos": "scheduler priority",
    "launch.slurm.constraint": "scheduler placement; the GPUs are named by hardware.*",
    "launch.slurm.extra_sbatch": "scheduler options",
    "launch.slurm.signal_grace_seconds": "how early before the limit the worker checkpoints",
    "launch.slurm.requeue": "whether a preempted job comes back; resumption is exact either way",
    "launch.container": "how the worker enters its image; the environment component hashes the image's content "
                        "(D67); mounts, workdir and env say where the files and variables the job reads are",
    "launch.watchdog": "when a hung stage is stopped and restarted; it resumes from its checkpoint, exactly",
    "smoke.time_limit": "the wall-clock limit of the smoke stage's job",
    "eval": "how the finished weights are judged (lm-evaluation-harness tasks); the weights do not depend on it",
    "sweep": "how a sweep chooses its trials; each trial's values are in its own spec, which has no [sweep]",
    "init.from": "where the starting weights lie; the init component hashes their identity (run ID and "
                 "checkpoint content, or the model directory's content)",
    "data.path": "where the dataset lies; the data component hashes its content",
    "data.tokenizer.path": "where the tokenizer file lies; the data component hashes its content",
    "data.tokenizer.merges": "where the merges file lies; the data component hashes its content",
}


def _drop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            return
        node = child
    node.pop(leaf, None)


def canonical_config(spec: ExperimentSpec) -> dict[str, Any]:
    """The hashed part of the spec, as plain nested data."""
    tree = copy.deepcopy(spec_to_dict(spec))
    for key in NOT_HASHED:
        _drop(tree, key)
    for table in MIXTURE_TABLES:  # a component's path, like data.path: the data component hashes its content
        for part in tree["data"].get(table, {}).values():
            part.pop("path", None)
    return tree


def collect_config(spec: ExperimentSpec) -> dict[str, Any]:
    """The config component: ``{"id": canonical config, "info": {...}, "warnings": []}``."""
    return {"id": canonical_config(spec), "info": {"name": spec.name}, "warnings": []}
