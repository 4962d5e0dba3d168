"""One worker process on this machine (CPU, or one GPU): ``python -m mcx.train STAGE_DIR``."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from attrs import frozen

from mcx.errors import InputError
from mcx.launch.base import Placement
from mcx.launch.container import start_in_podman, worker_python
from mcx.launch.env import check_env
from mcx.launch.process import ProcessHandle
from mcx.spec.schema import LaunchSpec

WORKER_MODULE = "mcx.train"


def worker_argv(python: str, module: str, stage_dir: Path) -> list[str]:
    return [python, "-m", module, str(stage_dir)]


@frozen(kw_only=True)
class LocalLauncher:
    """Starts the worker as a child of the control plane.

    ``log``: None lets the worker write to this terminal (its progress bar); a path appends
    its stdout and stderr to that file. ``module`` and ``python`` name what runs (tests start
    small real modules in place of the worker).
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
        if where.world_size != 1:
            raise InputError(
                f"launch.kind = 'local' runs one process, but the layout needs {where.world_size}",
                "Set launch.kind = 'torchrun' (one node) or 'slurm' (several nodes).",
            )
        stage_dir = Path(stage_dir).resolve()
        container = launch_spec.container
        if container.image is not None:  # the worker in the spec's image (mcx.launch.container)
            argv = worker_argv(worker_python(container, self.python), self.module, stage_dir)
            return start_in_podman(argv, stage_dir=stage_dir, where=where, container=container, env=check_env(env),
                                   log=self.log, what="the worker", depth=1)
        child_env = {**os.environ, **check_env(env)}
        return ProcessHandle(
            worker_argv(self.python, self.module, stage_dir),
            stage_dir=stage_dir,
            env=child_env,
            log=self.log,
            workers=lambda pid: [pid],
            what="the worker",
        )
