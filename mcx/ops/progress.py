"""What a long command says while it works, as typed events: ops never print.

An op takes ``progress``, a callable that receives each event as it happens; the CLI renders them on
stderr (``mcx.cli.output.show_progress``), a library caller passes ``quiet`` or its own. A ``Note`` is
also what a result carries for the CLI to print beside it (``RunResult.notes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from attrs import frozen

if TYPE_CHECKING:
    from mcx.ops.plan import PlanResult


@frozen(kw_only=True)
class Note:
    """A line for the person at the terminal: ``lead`` in bold, then ``text``, in the level's colour."""

    level: Literal["info", "warning", "error"] = "info"
    text: str
    lead: str = ""  # the words shown first, in bold ("smoke stage", "run 3f9c0a12b4de")
    copyable: bool = False  # commands to copy: never wrapped


@frozen(kw_only=True)
class PlanShown:
    """The plan, shown before the user is asked to confirm a run over its budget (its JSON, ``plan_json()``, is
    what the renderer reads, as it reads a run's plan.json)."""

    planned: PlanResult


@frozen(kw_only=True)
class Launched:
    """A stage's workers were started (a Slurm job submitted): what `mcx run --detach` waits for before it returns."""

    stage: str
    kind: str  # launch.kind: local | torchrun | slurm
    job_id: str | None  # the Slurm job ID; the launcher's process ID for local and torchrun
    log: str | None = None


Event = Note | PlanShown | Launched
Progress = Callable[[Event], None]


def quiet(event: Event) -> None:
    """A ``progress`` that drops every event."""
