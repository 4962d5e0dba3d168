"""What every launcher offers the control plane: start a worker, follow it, stop it.

A launcher turns a stage directory (``job.json`` written by the control plane) into running
workers (``python -m mcx.train STAGE_DIR``) and hands back a :class:`Handle`. The control plane
polls or waits on the handle while it tails ``metrics.jsonl``; when the handle reports a terminal
state, :class:`LaunchOutcome` says what happened, what the worker reported (``result.json``) and
what to do next.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Protocol

from attrs import frozen

from mcx.contract.checkpoints import latest_checkpoint
from mcx.errors import InputError
from mcx.plan.layout import Layout
from mcx.spec.schema import LaunchSpec

State = Literal["pending", "running", "finished", "failed", "cancelled", "timeout", "node_fail", "preempted"]

ACTIVE: frozenset[str] = frozenset({"pending", "running"})
TERMINAL: frozenset[str] = frozenset(
    {"finished", "failed", "cancelled", "timeout", "node_fail", "preempted"}
)

@frozen(kw_only=True)
class LaunchOutcome:
    """The state of a launch; final once ``done``.

    ``exit_code`` follows subprocess's convention: the worker's exit status, or ``-N`` when
    signal N ended it (None while it runs or when nothing reports it). ``result`` is the
    worker's ``result.json`` when it wrote one; ``log`` the file that holds the launch's output
    (Slurm's ``slurm-<job>.out``, or the file a local launcher was given). ``interrupted_by`` names the
    signal (SIGINT, SIGTERM) to the control plane on which it stopped the workers: the user's stop, which
    `mcx run` ends "interrupted" (exit 130), not a preemption (D47).
    """

    state: State
    exit_code: int | None = None
    detail: str = ""
    job_id: str | None = None
    result: dict[str, Any] | None = None
    log: Path | None = None
    restarts: int = 0
    interrupted_by: str | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "finished"


class Handle(Protocol):
    """One launched stage. ``poll`` never blocks; ``wait`` blocks at most ``timeout`` seconds
    (None: until the launch ends) and returns the outcome so far, final when ``outcome.done``."""

    @property
    def job_id(self) -> str | None: ...

    @property
    def stage_dir(self) -> Path: ...

    def poll(self) -> State: ...

    def wait(self, timeout: float | None = None) -> LaunchOutcome: ...

    def cancel(self) -> None: ...

    def forwarding_signals(self) -> AbstractContextManager[None]:
        """While inside, a Ctrl-C (SIGINT) or SIGTERM to the control plane stops the workers
        gracefully (they checkpoint) where mcx owns them; a Slurm job is left to Slurm."""
        ...


class Launcher(Protocol):
    def start(
        self,
        stage_dir: Path,
        where: Placement,
        launch_spec: LaunchSpec,
        env: Mapping[str, str],
    ) -> Handle: ...


@frozen(kw_only=True)
class Placement:
    """Where a stage's worker processes go: ``nodes`` x ``procs_per_node`` processes on ``device``
    (one per GPU on GPU machines, ``world_size`` processes on CPU). ``layout``: the degrees those
    ranks train with, for what a launcher shows of them (the sbatch script's ``# layout:`` line).
    ``predicted_step_s``: the plan's step time, one of the hang watchdog's references (mcx.launch.watchdog)."""

    world_size: int
    nodes: int = 1
    device: Literal["cpu", "cuda"] = "cpu"
    layout: Layout | None = None
    predicted_step_s: float | None = None

    def __attrs_post_init__(self) -> None:
        world_size, nodes = self.world_size, self.nodes
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise InputError(f"layout.world_size must be a positive integer, got {world_size!r}")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise InputError(f"layout.nodes must be a positive integer, got {nodes!r}")
        if world_size % nodes:
            raise InputError(
                f"layout.world_size={world_size} is not a multiple of layout.nodes={nodes}",
                "Every node runs the same number of processes: use a world size that nodes divides.",
            )
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"layout.device must be 'cpu' or 'cuda', got {self.device!r}")

    @property
    def procs_per_node(self) -> int:
        return self.world_size // self.nodes


def placement(layout: Layout, device: Literal["cpu", "cuda"], predicted_step_s: float | None = None) -> Placement:
    """The placement of a stage the planner laid out (the one place the control plane builds one)."""
    return Placement(world_size=layout.world_size, nodes=layout.nodes, device=device, layout=layout,
                     predicted_step_s=predicted_step_s)


def resume_note(stage_dir: Path) -> str:
    """One sentence on what a rerun resumes from."""
    latest = latest_checkpoint(stage_dir)
    if latest is None:
        return "No checkpoint was saved; running the stage again starts it from the beginning."
    return f"The last complete checkpoint is {latest}; running the stage again resumes from it."


def worker_said(result: Mapping[str, Any] | None) -> str:
    """What the worker reported, for an outcome's detail ("" when it wrote no result)."""
    if not result:
        return ""
    parts = [f"the worker reported status {result.get('status')!r} after {result.get('steps')} steps"]
    if result.get("error"):
        parts.append(f"error: {str(result['error']).rstrip('.')}")
    return "; ".join(parts) + "."
