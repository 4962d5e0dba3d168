"""Launchers: start ``python -m mcx.train STAGE_DIR`` locally, through torchrun, or with Slurm.

Modules: ``base.py`` (``Placement``: world size, nodes, device and the layout, built for a planned stage by
``placement``; what every launcher takes); ``result.py`` (``StageResult``: result.json as the control plane
reads it); ``site.py`` (what a job needs of the machine it starts on: Transformer Engine, the dataset and
tokenizer files, writable directories; warnings in ``mcx plan``, problems at ``mcx run`` where the job
starts here, and the worker's first check on its node); ``env.py`` (the one environment every worker gets:
a fixed hash seed, MKL's GEMMs in strict reproducible mode so their bits do not follow the threads MKL uses,
D46, Megatron's deterministic variables when ``train.deterministic``); ``container.py`` (the worker in ``[launch.container]``'s image: Podman for local and torchrun, pyxis' srun options for Slurm, D67); local; torchrun (``process.py``: the
child in its own session; SIGTERM forwarded once; its process group emptied once it exits, so a crashed
worker's helpers such as the checkpoint writer do not outlive it); slurm. Side effects: subprocess, sbatch, podman.
"""

from __future__ import annotations

from mcx.contract.result import read_result
from mcx.launch.base import TERMINAL, Handle, Launcher, LaunchOutcome, Placement, State, placement
from mcx.launch.env import worker_env
from mcx.launch.local import LocalLauncher
from mcx.launch.sbatch import render_sbatch
from mcx.launch.slurm import SlurmHandle, SlurmLauncher, submit
from mcx.launch.torchrun import TorchrunLauncher
from mcx.spec.schema import LaunchSpec


def launcher_for(launch_spec: LaunchSpec) -> LocalLauncher | TorchrunLauncher | SlurmLauncher:
    """The launcher for ``launch.kind``, with its defaults (this interpreter, ``mcx.train``)."""
    return {"local": LocalLauncher, "torchrun": TorchrunLauncher, "slurm": SlurmLauncher}[launch_spec.kind]()


__all__ = [
    "TERMINAL",
    "Handle",
    "LaunchOutcome",
    "Launcher",
    "Placement",
    "LocalLauncher",
    "SlurmHandle",
    "SlurmLauncher",
    "State",
    "TorchrunLauncher",
    "launcher_for",
    "placement",
    "read_result",
    "render_sbatch",
    "submit",
    "worker_env",
]
