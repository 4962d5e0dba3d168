"""Launchers: start ``python -m mcx.train STAGE_DIR`` locally, through torchrun, or with Slurm."""

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
