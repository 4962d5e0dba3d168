"""One node, one worker process per GPU (or ``world_size`` CPU processes), through torchrun.

The agent (torch.distributed.run) runs with a SIGTERM handler that does nothing, and without
torchrun's own: on SIGTERM torchrun would re-signal the workers and SIGKILL them 30 s later,
cutting a large checkpoint short. The signal goes to the workers instead (here from the control
plane, under Slurm from slurmstepd, which signals every process of the step); the agent exits
when they do. A Python handler, unlike SIG_IGN, is not inherited across exec: the workers start
with the default SIGTERM action until they install their own handler.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.launch.base import Placement
from mcx.launch.container import start_in_podman, worker_python
from mcx.launch.env import check_env, omp_threads
from mcx.launch.local import WORKER_MODULE
from mcx.launch.process import ProcessHandle, child_pids
from mcx.launch.watchdog import watchdog_argv
from mcx.spec.schema import LaunchSpec

# ``python -c AGENT -- TORCHRUN ARGS``: torchrun whose SIGTERM does nothing (see the module doc).
AGENT = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGTERM, lambda signum, frame: None); "
    "sys.argv[0] = 'torchrun'; "
    "runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)"
)
# Every signal torchrun handles by default except SIGTERM.
AGENT_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_argv(
    *,
    python: str,
    nnodes: int | str,
    nproc_per_node: int,
    endpoint: str,
    rdzv_id: str,
    module: str,
    stage_dir: Path | str,
) -> list[str]:
    """The torchrun command for one node's agent (c10d rendezvous at ``endpoint``), no restarts:
    a failed worker fails the launch, and mcx resumes from the last checkpoint instead."""
    return [
        python,
        "-c",
        AGENT,
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--max-restarts",
        "0",
        "--signals-to-handle",
        AGENT_SIGNALS,
        "-m",
        module,
        str(stage_dir),
    ]


@frozen(kw_only=True)
class TorchrunLauncher:
    """Starts torchrun as a child of the control plane; result.json comes from rank 0.

    ``log``: None lets the processes write to this terminal; a path appends their output there.
    """

    python: str = sys.executable
    module: str = WORKER_MODULE
    log: Path | None = None

    def start(
        self,
        stage_dir: Path,
        where: Placement,
        launch_spec: LaunchSpec,
        env: Mapping[str, str],
    ) -> ProcessHandle:
        if where.nodes != 1:
            raise InputError(
                f"launch.kind = 'torchrun' runs on one node, but the layout spans {where.nodes} nodes",
                "Set launch.kind = 'slurm' for several nodes.",
            )
        stage_dir = Path(stage_dir).resolve()
        port = launch_spec.master_port or free_port()
        child_env = {**os.environ, **check_env(env)}
        # An equal share of this machine's CPUs per process, unless the caller chose.
        child_env.setdefault("OMP_NUM_THREADS", omp_threads(where.procs_per_node))
        container = launch_spec.container
        argv = torchrun_argv(
            python=worker_python(container, self.python),
            nnodes=1,
            nproc_per_node=where.procs_per_node,
            endpoint=f"127.0.0.1:{port}",
            rdzv_id=f"mcx-{stage_dir.parent.name}-{stage_dir.name}",
            module=self.module,
            stage_dir=stage_dir,
        )
        if container.image is not None:  # the agent and its workers in the spec's image (mcx.launch.container);
            # no watchdog there yet: it would run inside the image, and its process tree differs (D66)
            inside = {**check_env(env), "OMP_NUM_THREADS": child_env["OMP_NUM_THREADS"]}
            return start_in_podman(argv, stage_dir=stage_dir, where=where, container=container, env=inside,
                                   log=self.log, what=f"torchrun ({where.procs_per_node} processes)", depth=2)
        workers = child_pids
        policy = launch_spec.watchdog
        if policy.enabled:  # the watchdog starts the agent, again after a hang (one node: in place)
            argv = watchdog_argv(self.python, stage_dir, policy, argv, predicted_step_s=where.predicted_step_s,
                                 in_place=True)
            workers = grandchildren
        return ProcessHandle(
            argv,
            stage_dir=stage_dir,
            env=child_env,
            log=self.log,
            workers=workers,
            what=f"torchrun ({where.procs_per_node} processes)",
        )


def grandchildren(pid: int) -> list[int]:
    """The workers of a watchdog's agent: the children of ``pid``'s children."""
    return [g for c in child_pids(pid) for g in child_pids(c)]
