"""The fingerprint record and the run ID it hashes to.

A record holds five components, and a sixth, ``init``, when the run starts from another run's or a
model's weights (mcx.fingerprint.init_from), each a typed ``Component`` (mcx.fingerprint.components) written as
``{"id": {...}, "info": {...}}``: ``id`` is exactly what is hashed, ``info`` is what was observed along the
way (paths, probes, versions that cannot change a result). Warnings and side data (the code patch) are kept
beside them and never hashed.

    component hash = mcx.hashing.digest(component.id)
    run ID         = first 12 hex of digest({"schema": SCHEMA, "components": {name: component hash}})

So the same spec, code, environment, data and hardware give the same ID in any process on any
machine of the same kind, and ``mcx explain`` can say which component moved it.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from attrs import field, frozen

from mcx.errors import InputError, RunIdError
from mcx.fingerprint.code import collect_code
from mcx.fingerprint.components import (
    C,
    CodeComponent,
    Component,
    ConfigComponent,
    DataComponent,
    EnvironmentComponent,
    HardwareComponent,
    InitComponent,
    component_from,
)
from mcx.fingerprint.config import collect_config
from mcx.fingerprint.data import collect_data
from mcx.fingerprint.environment import collect_environment
from mcx.fingerprint.hardware import collect_hardware
from mcx.fingerprint.init_from import collect_init
from mcx.hashing import digest, short_id
from mcx.spec import ExperimentSpec

# Bump when the record's layout changes (old records then stop loading). Not bumped when a component hashes
# something else (D52: code by module content): an old record still hashes to its own ID, a spec plans anew.
SCHEMA = 1
COMPONENTS = ("code", "environment", "config", "data", "hardware")
INIT = "init"  # hashed only when present: runs from random weights keep their IDs
RUN_ID_PATTERN = re.compile(r"^[0-9a-f]{12}$")
RUNS_DIR = Path(".mcx") / "runs"  # <project>/.mcx/runs/<run_id>/fingerprint.json


# Converters: a component as given, or as its {"id", "info"} JSON (a collector's output, an older caller's dict).
def _code(data: object) -> CodeComponent:
    return component_from(CodeComponent, data, "fingerprint record", "code")


def _environment(data: object) -> EnvironmentComponent:
    return component_from(EnvironmentComponent, data, "fingerprint record", "environment")


def _config(data: object) -> ConfigComponent:
    return component_from(ConfigComponent, data, "fingerprint record", "config")


def _data(data: object) -> DataComponent:
    return component_from(DataComponent, data, "fingerprint record", "data")


def _hardware(data: object) -> HardwareComponent:
    return component_from(HardwareComponent, data, "fingerprint record", "hardware")


def _init(data: object) -> InitComponent | None:
    return None if data is None else component_from(InitComponent, data, "fingerprint record", INIT)


@frozen(kw_only=True)
class FingerprintRecord:
    """Everything a run ID stands for: the typed components, and what is kept beside them unhashed."""

    code: CodeComponent = field(converter=_code)
    environment: EnvironmentComponent = field(converter=_environment)
    config: ConfigComponent = field(converter=_config)
    data: DataComponent = field(converter=_data)
    hardware: HardwareComponent = field(converter=_hardware)
    init: InitComponent | None = field(default=None, converter=_init)
    warnings: tuple[str, ...] = ()
    # Not hashed: {"patch": str, "patch_encoding": "utf-8" | "base64"} when the tree is dirty.
    side: dict[str, Any] = field(factory=dict)

    def component(self, name: str) -> Component:
        """The component called ``name`` (one of ``names()``); KeyError for one this record does not hold."""
        found = getattr(self, name, None) if name in COMPONENTS + (INIT,) else None
        if not isinstance(found, Component):
            raise KeyError(name)
        return found

    def names(self) -> tuple[str, ...]:
        """The components this record hashes: COMPONENTS, and ``init`` when the run has a source."""
        return COMPONENTS + ((INIT,) if self.init is not None else ())


def _patch_side(patch: bytes | None) -> dict[str, Any]:
    if not patch:
        return {}
    try:
        return {"patch": patch.decode("utf-8"), "patch_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"patch": base64.b64encode(patch).decode("ascii"), "patch_encoding": "base64"}


def patch_bytes(record: FingerprintRecord) -> bytes | None:
    """The uncommitted change as ``git apply`` takes it; None for a clean tree."""
    if "patch" not in record.side:
        return None
    text = str(record.side["patch"])
    return base64.b64decode(text) if record.side.get("patch_encoding") == "base64" else text.encode("utf-8")


def collect(
    spec: ExperimentSpec,
    project_root: Path,
    *,
    lockfile: str | None = None,
    probe_hardware: bool = True,
    require_data: bool = True,
    allow_absent: bool = False,
    rehash_data: bool = False,
    state_root: Path | None = None,
    code_path: Path | None = None,
) -> FingerprintRecord:
    """Fingerprint ``spec`` as it would run from ``project_root`` on this machine.

    ``lockfile``: the name in ``lockfiles/`` (default ``$MCX_LOCKFILE``, else "cpu").
    ``probe_hardware=False``: identify hardware by the spec's declaration only (Slurm launches do
    this anyway: the training nodes are not this machine).
    ``require_data=False``: a DVC-tracked dataset that is not pulled yet is identified by its DVC
    record (for planning and explaining); training needs the default. ``allow_absent``: a missing
    untracked path is recorded as absent instead of raising (``mcx plan`` away from the data).
    ``rehash_data``: read every data file, trusting no kept hash (``mcx run --verify-data``).
    ``state_root``: the project whose runs (``.mcx/runs``) and relative paths ``[init] from`` names, when
    the code is fingerprinted elsewhere (a reproduction's worktree); default ``project_root``.
    ``code_path``: a reproduction's rebuilt tree, whose own mcx (where it holds one) the worker imports.

    Raises DataError for missing or modified data, InputError for a bad lockfile name, and
    EnvironmentProblem when git cannot read the repository.
    """
    root = Path(project_root).resolve()
    parts: dict[str, dict[str, Any]] = {
        "code": collect_code(root, code_path),
        "environment": collect_environment(root, lockfile, spec.launch.container, rehash_data),
        "config": collect_config(spec),
        "data": collect_data(spec, root, require_data, allow_absent, rehash_data),
        "hardware": collect_hardware(spec, probe_hardware),
    }
    init = collect_init(spec, Path(state_root).resolve() if state_root else root, rehash_data)
    if init is not None:
        parts[INIT] = init
    warnings = tuple(f"{name}: {w}" for name, part in parts.items() for w in part["warnings"])
    side = _patch_side(parts["code"].get("patch"))

    def typed(cls: type[C], name: str) -> C:
        return cls(id=parts[name]["id"], info=parts[name]["info"])

    return FingerprintRecord(code=typed(CodeComponent, "code"), environment=typed(EnvironmentComponent, "environment"),
                             config=typed(ConfigComponent, "config"), data=typed(DataComponent, "data"),
                             hardware=typed(HardwareComponent, "hardware"),
                             init=typed(InitComponent, INIT) if INIT in parts else None, warnings=warnings, side=side)


def component_hashes(record: FingerprintRecord) -> dict[str, str]:
    """Full sha256 of each component's ``id``."""
    return {name: record.component(name).digest() for name in record.names()}


def run_id(record: FingerprintRecord) -> str:
    """The 12-hex run ID: the hash of the component hashes."""
    return short_id(digest({"schema": SCHEMA, "components": component_hashes(record)}))


def record_to_dict(record: FingerprintRecord) -> dict[str, Any]:
    """The content of ``fingerprint.json`` (``run_id`` and hashes included for readers; checked on load)."""
    return {
        "schema": SCHEMA,
        "run_id": run_id(record),
        "component_hashes": component_hashes(record),
        **{name: record.component(name).to_dict() for name in record.names()},
        "warnings": list(record.warnings),
        "side": record.side,
    }


def record_from_dict(data: Any, source: str = "fingerprint record") -> FingerprintRecord:
    """Read ``record_to_dict``'s output back; raise InputError if it is not one or does not hash to its ID."""
    if not isinstance(data, dict):
        raise InputError(f"{source} is not a JSON object", "regenerate it by running the spec again.")
    if data.get("schema") != SCHEMA:
        raise InputError(f"{source} has fingerprint schema {data.get('schema')!r}; this mcx reads {SCHEMA}",
                         "compare runs recorded by the same mcx version, or run the spec again.")
    code = component_from(CodeComponent, data.get("code"), source, "code")
    environment = component_from(EnvironmentComponent, data.get("environment"), source, "environment")
    config = component_from(ConfigComponent, data.get("config"), source, "config")
    data_part = component_from(DataComponent, data.get("data"), source, "data")
    hardware = component_from(HardwareComponent, data.get("hardware"), source, "hardware")
    warnings = data.get("warnings", [])
    side = data.get("side", {})
    if not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings) and isinstance(side, dict)):
        raise InputError(f"{source}: warnings or side data malformed", "regenerate it by running the spec again.")
    init = data.get(INIT)
    if init is not None and not (isinstance(init, dict) and isinstance(init.get("id"), dict)
                                 and isinstance(init.get("info"), dict)):
        raise InputError(f"{source}: component {INIT!r} is malformed", "regenerate it by running the spec again.")
    record = FingerprintRecord(code=code, environment=environment, config=config, data=data_part,
                               hardware=hardware, init=init, warnings=tuple(warnings), side=side)
    if "run_id" in data and data["run_id"] != run_id(record):
        raise InputError(f"{source} says run ID {data['run_id']} but its content hashes to {run_id(record)}",
                         "the file was edited or damaged; run the spec again to record it anew.")
    return record


def load_record(project_root: Path, run_id_text: str) -> FingerprintRecord:
    """The record of a finished or started run: ``.mcx/runs/<id>/fingerprint.json``.

    Raises RunIdError for a malformed ID (anything but 12 lowercase hex digits: no paths, no shell
    characters reach the filesystem) or an unknown one, and InputError for a damaged record.
    """
    if not isinstance(run_id_text, str) or not RUN_ID_PATTERN.fullmatch(run_id_text):
        raise RunIdError(f"{run_id_text!r} is not a run ID",
                         "a run ID is 12 lowercase hex digits, e.g. 3f9c0a12b4de; list runs with `mcx ls`.")
    path = Path(project_root) / RUNS_DIR / run_id_text / "fingerprint.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunIdError(f"unknown run ID {run_id_text}: no {path}",
                         "list the runs of this project with `mcx ls`, or run from the project root.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc})",
                         "the record is damaged; run the spec again to record it anew.") from None
    record = record_from_dict(data, str(path))
    if (actual := run_id(record)) != run_id_text:
        raise InputError(f"{path} hashes to run ID {actual}, not {run_id_text}",
                         "the run directory was renamed or its record replaced; run the spec again.")
    return record
