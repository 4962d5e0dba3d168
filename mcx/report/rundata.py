"""What a report knows about one run, independent of where it was read from.

``load_run_dir`` reads a run directory (docs/runs.md, "Run directory"); a loader from
MLflow builds the same ``RunData`` from its records. Reports never look past this class.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from mcx.contract.status import Status
from mcx.errors import InputError
from mcx.fingerprint.components import (CodeComponent, Component, ConfigComponent, DataComponent, EnvironmentComponent,
                                        HardwareComponent, InitComponent)
from mcx.fingerprint.record import INIT
from mcx.metrics.curves import Curve, read_metrics
from mcx.metrics.summary import spreads, summarize

STAGES = ("smoke", "full")


@frozen
class Drawn:
    """What a stage read from one component of a data mixture: the requested share (its normalised weight),
    the samples Megatron's blend drew from it and their share (result.json's ``details.mixture``, D60)."""

    requested: float
    samples: int
    share: float

    @classmethod
    def parse(cls, raw: object) -> Drawn | None:
        if not isinstance(raw, dict):
            return None
        req, n, share = raw.get("requested"), raw.get("samples"), raw.get("share")
        if not (isinstance(req, (int, float)) and isinstance(n, int) and isinstance(share, (int, float))):
            return None
        return cls(float(req), n, float(share))


@frozen(kw_only=True)
class StageData:
    """One stage directory: its result record and its metrics."""

    name: str  # "smoke" | "full"
    status: str  # result.json's status (a Status), or INCOMPLETE when the stage wrote no result
    passed: bool | None = None
    checks: dict[str, Any] = field(factory=dict)
    final: dict[str, Any] = field(factory=dict)  # result.json "final", verbatim
    error: str | None = None
    steps: int = 0  # training steps done
    world_size: int | None = None  # processes (GPUs) the stage ran on
    wall_time_s: float | None = None
    curves: dict[str, Curve] = field(factory=dict)
    notes: tuple[str, ...] = ()  # what reading skipped (an unfinished last line, ...)
    mixture: Mapping[str, Drawn] = field(factory=dict)  # component ("mix.web") -> what was drawn; {} for one dataset


@frozen(kw_only=True)
class RunData:
    """One run as reports see it.

    ``spec`` is the resolved spec flattened to dotted keys (``train.lr``); ``fingerprint`` the
    fingerprint record's components (``code``, ``environment``, ``config``, ``data``, ``hardware``),
    typed, each as recorded. ``curves`` and ``final`` are the main stage's (full, else smoke). Reports
    summarise curves; ``final`` (result.json's, or a loader's) is read only for a metric whose curve
    is absent, by its key in ``mcx.metrics.summary.METRICS``. ``wall_time_s`` and ``gpu_hours`` add
    up every stage: what the run cost.
    """

    run_id: str
    name: str
    spec: dict[str, Any] = field(factory=dict)
    fingerprint: RecordedFingerprint = field(factory=lambda: RecordedFingerprint())
    stages: dict[str, StageData] = field(factory=dict)
    final: dict[str, Any] = field(factory=dict)
    curves: dict[str, Curve] = field(factory=dict)
    wall_time_s: float | None = None
    gpu_hours: float | None = None
    status: str = "unknown"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted keys: ``{"train": {"lr": 3e-4}}`` -> ``{"train.lr": 3e-4}``.

    An empty table is kept as ``{}`` so that its presence still shows in a diff.
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


# Each component's typed class (mcx.fingerprint.components); a component of another name reads as a Component.
COMPONENT_TYPES: dict[str, type[Component]] = {
    "code": CodeComponent, "environment": EnvironmentComponent, "config": ConfigComponent, "data": DataComponent,
    "hardware": HardwareComponent, INIT: InitComponent}


@frozen(kw_only=True)
class RecordedFingerprint:
    """A run's fingerprint.json as reports read it: each component (``code``, ``environment``, ``config``, ``data``,
    ``hardware``, ``init``) typed, its ``id`` and ``info`` as recorded, and the tables kept beside them (the
    component hashes, the side data), which a comparison shows too. Read leniently, whatever mcx wrote it: a
    table that is not a component's ``{"id": {...}, "info": {...}}`` stays a table beside."""

    components: Mapping[str, Component] = field(factory=dict)
    beside: Mapping[str, Mapping[str, Any]] = field(factory=dict)

    @classmethod
    def read(cls, record: object) -> RecordedFingerprint:
        """From the record's JSON, its components nested under ``components`` (older records) or at the top."""
        if not isinstance(record, dict):
            return cls()
        nested = record.get("components")
        tables = nested if isinstance(nested, dict) else record
        components: dict[str, Component] = {}
        beside: dict[str, Mapping[str, Any]] = {}
        for name, table in tables.items():
            if not isinstance(table, dict):
                continue
            if set(table) == {"id", "info"} and isinstance(table["id"], dict) and isinstance(table["info"], dict):
                components[name] = COMPONENT_TYPES.get(name, Component)(id=table["id"], info=table["info"])
            else:
                beside[name] = table
        return cls(components=components, beside=beside)

    def names(self) -> set[str]:
        return {*self.components, *self.beside}

    def table(self, name: str) -> Mapping[str, Any] | None:
        """The table called ``name`` as the record holds it; None where it holds none."""
        component = self.components.get(name)
        return component.to_dict() if component is not None else self.beside.get(name)


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON ({exc});",
                         f"the run's {what} is damaged: restore the run directory or rerun.") from None


def _stage_wall_time(result: dict[str, Any], curves: dict[str, Curve]) -> float | None:
    """result.json's ``wall_time_s`` if the worker wrote one, else the span of the train lines.

    The span runs from the start of the first logged step (its ``time`` minus its ``step_time_s``)
    to the last logged ``time``; it leaves out start-up before the first step and the final save.
    """
    given = result.get("wall_time_s")
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        return float(given)
    times = curves.get("train/time")
    if times is None or not times.values:
        return None
    first_step = curves.get("train/step_time_s")
    lead = first_step.values[0] if first_step is not None and first_step.steps[:1] == times.steps[:1] else 0.0
    return max(0.0, times.values[-1] - times.values[0] + lead)


def load_stage(stage_dir: Path, spec_world_size: int | None) -> StageData:
    curves, notes = read_metrics(stage_dir / "metrics.jsonl")
    result = _read_json(stage_dir / "result.json", "result record") or {}
    job = _read_json(stage_dir / "job.json", "job file") or {}
    layout = job.get("layout")
    world = layout.get("world_size") if isinstance(layout, dict) and isinstance(layout.get("world_size"), int) \
        else spec_world_size
    train_loss = curves.get("train/loss")
    steps = result.get("steps")
    if not isinstance(steps, int):
        steps = train_loss.steps[-1] if train_loss is not None and train_loss.steps else 0
    checks, final = result.get("checks"), result.get("final")
    details = result.get("details")
    mixed = details.get("mixture") if isinstance(details, dict) else None
    drawn = {name: d for name, raw in mixed.items() if (d := Drawn.parse(raw)) is not None} \
        if isinstance(mixed, dict) else {}
    return StageData(
        name=stage_dir.name,
        status=str(result.get("status") or Status.INCOMPLETE),
        passed=result.get("passed") if isinstance(result.get("passed"), bool) else None,
        checks=checks if isinstance(checks, dict) else {},
        final=final if isinstance(final, dict) else {},
        error=result.get("error") if isinstance(result.get("error"), str) else None,
        steps=steps,
        world_size=world,
        wall_time_s=_stage_wall_time(result, curves),
        curves=curves,
        notes=tuple(notes),
        mixture=drawn,
    )


def load_run_dir(path: str | Path) -> RunData:
    """A run directory (``.mcx/runs/<run_id>/``) as RunData; raises InputError when it is not one."""
    root = Path(path)
    spec_path = root / "spec.toml"
    if not root.is_dir():
        raise InputError(f"no run directory at {root};", "give a directory under .mcx/runs/ (`mcx ls` lists runs).")
    try:
        spec_tree = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{root} has no spec.toml, so it is not an mcx run directory;",
                         "give a directory under .mcx/runs/ (`mcx ls` lists runs).") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{spec_path} is not valid TOML ({exc});",
                         "the run directory is damaged: restore it or rerun.") from None
    record = _read_json(root / "fingerprint.json", "fingerprint record")
    if record is None:
        raise InputError(f"{root} has no fingerprint.json, so it is not a complete mcx run directory;",
                         "rerun `mcx run` for this spec to recreate it.")
    spec = flatten(spec_tree)
    nodes, per_node = spec.get("hardware.nodes", 1), spec.get("hardware.gpus_per_node", 1)
    spec_world = nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None
    stages = {name: load_stage(root / name, spec_world) for name in STAGES if (root / name).is_dir()}
    main = stages.get("full") or stages.get("smoke")
    run_json = _read_json(root / "run.json", "run record") or {}
    status = run_json.get("status")
    if not isinstance(status, str):
        status = main.status if main is not None else "planned"
    walls = [s.wall_time_s for s in stages.values() if s.wall_time_s is not None]
    gpu_h = [s.wall_time_s * s.world_size / 3600.0 for s in stages.values()
             if s.wall_time_s is not None and s.world_size is not None]
    return RunData(
        run_id=root.name,
        name=str(spec_tree.get("name", root.name)),
        spec=spec,
        fingerprint=RecordedFingerprint.read(record),
        stages=stages,
        final=dict(main.final) if main is not None else {},
        curves=dict(main.curves) if main is not None else {},
        wall_time_s=sum(walls) if walls else None,
        gpu_hours=sum(gpu_h) if gpu_h else None,
        status=status,
    )


def summarize_run(run: RunData) -> dict[str, float | None]:
    """Every summary metric of the run (``mcx.metrics.summary``): from its main stage's curves, the
    run's wall time and GPU-hours, and its recorded finals where a curve is absent."""
    return summarize(run.curves, {"wall_time_s": run.wall_time_s, "gpu_hours": run.gpu_hours}, run.final)


def run_spreads(run: RunData) -> dict[str, float]:
    """The step-to-step spread of each steady metric of the run's main stage."""
    return spreads(run.curves)
