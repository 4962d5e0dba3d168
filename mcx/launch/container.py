"""The worker inside ``[launch.container]``'s image: Podman for local and torchrun launches, pyxis under Slurm.

What the container sees, at the same paths as the host (so job.json's paths hold inside): the project
(the stage directory's, where ``.mcx/`` is), the job's data directory and ``[init]`` source, the Python
environment when the interpreter is this one (``python`` unset), the directory the worker's ``mcx`` is
imported from and each ``PYTHONPATH`` entry; then the spec's own ``mounts``. The working directory is the
stage directory unless ``workdir`` says otherwise.

The image run is the one the run's fingerprint names (``fingerprint.json`` in the run directory,
``environment.id.container_image``): a local Podman image runs by that ID, not by its name, so a tag moved
since the run was planned cannot change what trains under its ID.

Podman (``podman run --rm --init``): the host's network and IPC namespaces (torchrun's rendezvous and
NCCL as on the host; shared memory for data loaders), the worker's variables passed one by one with the
names in ``env`` (Podman passes nothing of the host's environment by default), GPUs through CDI
(``--device nvidia.com/gpu=all``) on GPU placements. The image is run by the ID the fingerprint recorded.
A stop reaches the worker processes by their host PIDs (under catatonit, the container's init), so a
Ctrl-C checkpoints as it does on the host; whatever is left when the launch ends is removed with the
container.

pyxis (``srun --container-image``): the srun line of the sbatch script carries the image, the mounts, the
working directory and ``--container-env`` with every variable the script exports and the names in ``env``
(so the image's own values of, say, ``OMP_NUM_THREADS`` do not win over the worker's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import mcx
from mcx.contract.files import JOB_FILE
from mcx.errors import EnvironmentProblem, InputError
from mcx.jsonfile import read_json
from mcx.launch.base import Placement
from mcx.launch.process import ProcessHandle, child_pids
from mcx.spec.container import Mount, check_container, image_kind, parse_mount, pyxis_image
from mcx.spec.schema import ContainerSpec

PODMAN_TIMEOUT_S = 60


def _project_of(stage_dir: Path) -> Path:
    """The project a stage directory belongs to (the parent of its ``.mcx``), else its run directory."""
    parts = stage_dir.parts
    if ".mcx" in parts:
        return Path(*parts[: parts.index(".mcx")])
    return stage_dir.parent


def _job_paths(stage_dir: Path) -> list[Path]:
    """The host directories job.json names: the data directory, the checkpoints, the ``[init]`` source."""
    job = read_json(stage_dir / JOB_FILE)
    if not isinstance(job, dict):
        return []
    found = [job.get("data_dir"), job.get("checkpoint_dir")]
    init = job.get("init")
    if isinstance(init, dict):
        found.append(init.get("path"))
    return [Path(p) for p in found if isinstance(p, str) and p.startswith("/")]


def checked(container: ContainerSpec, kind: str) -> ContainerSpec:
    """``container`` unchanged, or InputError naming its first problem (a table not read through a spec)."""
    problems = check_container(container, kind)
    if problems:
        key, message = problems[0]
        raise InputError(f"{key}: {message}")
    return container


def job_mounts(stage_dir: Path, container: ContainerSpec, env: Mapping[str, str]) -> list[Mount]:
    """Every mount of the launch: the job's own directories (same path inside), then the spec's mounts."""
    wanted = [_project_of(stage_dir), stage_dir, *_job_paths(stage_dir), Path(mcx.__file__).resolve().parents[1]]
    if container.python is None:  # this interpreter's environment (a venv, or an installation prefix)
        wanted.append(Path(sys.prefix))
    wanted += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p.startswith("/")]
    chosen: list[Path] = []
    for path in sorted({Path(os.path.abspath(p)) for p in wanted}, key=lambda p: len(p.parts)):
        if path != Path("/") and not any(path.is_relative_to(top) for top in chosen):
            chosen.append(path)
    own = [Mount(host=str(p), container=str(p)) for p in sorted(chosen)]
    return own + [parse_mount(text) for text in container.mounts]


def worker_python(container: ContainerSpec, python: str) -> str:
    """The interpreter the worker starts with inside the image."""
    return container.python if container.python is not None else python


def pyxis_options(container: ContainerSpec, stage_dir: Path, env: Mapping[str, str], exported: Sequence[str]) -> list[str]:
    """srun's pyxis options for the stage (``exported``: the variables the script exports)."""
    image = checked(container, "slurm").image
    if image is None:
        raise InputError("launch.container.image is not set", "name the image the worker runs in.")
    mounts = ",".join(m.text for m in job_mounts(stage_dir, container, env))
    names = sorted({*exported, *container.env})
    return [
        f"--container-image={pyxis_image(image)}",
        f"--container-mounts={mounts}",
        f"--container-workdir={container.workdir or stage_dir}",
        *([f"--container-env={','.join(names)}"] if names else []),
    ]


def podman_argv(argv: Sequence[str], *, name: str, image: str, mounts: Sequence[Mount], workdir: str,
                env: Mapping[str, str], passthrough: Sequence[str], device: str, podman: str = "podman") -> list[str]:
    """``podman run`` of ``argv`` in ``image`` (see the module docstring)."""
    out = [podman, "run", "--rm", "--init", f"--name={name}", "--network=host", "--ipc=host",
           f"--workdir={workdir}"]
    out += [f"--volume={m.text}" for m in mounts]
    out += [f"--env={k}={v}" for k, v in sorted(env.items())]
    out += [f"--env={k}" for k in passthrough if k not in env]
    if device == "cuda":
        out.append("--device=nvidia.com/gpu=all")
    return [*out, image, *argv]


def recorded_image(stage_dir: Path, container: ContainerSpec) -> str:
    """What ``podman run`` runs: a local image by the ID the run's fingerprint recorded, a pinned reference as
    written. A stage directory outside a recorded run (no fingerprint.json) runs the reference as written."""
    assert container.image is not None
    if image_kind(container.image) != "local":
        return container.image
    record = read_json(stage_dir.parent / "fingerprint.json")
    env = record.get("environment") if isinstance(record, dict) else None
    ident = env.get("id") if isinstance(env, dict) else None
    digest = ident.get("container_image") if isinstance(ident, dict) else None
    if isinstance(digest, str) and digest.startswith("sha256:"):
        return digest.removeprefix("sha256:")
    return container.image


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


class ContainerHandle(ProcessHandle):
    """A ``podman run`` child: stops go to the worker processes inside by their host PIDs, and the container
    is removed once the launch ends, whatever ended it."""

    def __init__(self, argv: Sequence[str], *, name: str, depth: int, stage_dir: Path, env: Mapping[str, str],
                 log: Path | None, what: str) -> None:
        self._name = name
        self._depth = depth  # 1: the worker is init's child; 2: torchrun's workers are the agent's children
        super().__init__(argv, stage_dir=stage_dir, env=env, log=log, workers=self._inside, what=what)

    def _inside(self, podman_pid: int) -> list[int]:
        try:
            done = _podman("inspect", "--format", "{{.State.Pid}}", self._name)
        except subprocess.TimeoutExpired:
            return []
        pids = [int(done.stdout.strip())] if done.returncode == 0 and done.stdout.strip().isdigit() else []
        for _ in range(self._depth):
            pids = [child for pid in pids if pid > 0 for child in child_pids(pid)]
        return pids

    def kill(self) -> None:
        super().kill()
        self._remove()

    def _reap_group(self) -> None:
        super()._reap_group()
        self._remove()

    def _remove(self) -> None:
        try:
            _podman("rm", "--force", "--ignore", "--time=0", self._name)
        except subprocess.TimeoutExpired:
            pass


def start_in_podman(argv: Sequence[str], *, stage_dir: Path, where: Placement, container: ContainerSpec,
                    env: Mapping[str, str], log: Path | None, what: str, depth: int) -> ContainerHandle:
    """Start ``argv`` (the worker or the torchrun agent, ``env``: its variables) in the spec's image."""
    if checked(container, "local").image is None:
        raise InputError("launch.container.image is not set", "name the image the worker runs in.")
    podman = shutil.which("podman")
    if podman is None:
        raise EnvironmentProblem("launch.container needs podman for launch.kind = 'local' or 'torchrun', and it is "
                                 "not installed here", "install Podman (apt-get install podman), or run under Slurm "
                                 "with pyxis.")
    image = recorded_image(stage_dir, container)
    name = f"mcx-{stage_dir.parent.name}-{stage_dir.name}-{uuid.uuid4().hex[:8]}"
    full = podman_argv(argv, name=name, image=image, mounts=job_mounts(stage_dir, container, env),
                       workdir=container.workdir or str(stage_dir), env=env, passthrough=container.env,
                       device=where.device, podman=podman)
    return ContainerHandle(full, name=name, depth=depth, stage_dir=stage_dir, env=dict(os.environ), log=log,
                           what=f"{what} in container {container.image}")
