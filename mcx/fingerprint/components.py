"""The six fingerprint components as typed records: what each hashed (``id``) and observed (``info``).

Each component keeps its ``id`` and ``info`` exactly as collected or read (JSON objects), because the run
ID is the hash of those bytes: a record written by an older mcx, with keys this one no longer writes (a code
id of ``commit`` and ``diff_sha256`` before D52), must hash to its own ID. What the rest of mcx reads from a
component is a typed attribute here (``record.code.commit``, ``record.data.paths["dataset"].verified``,
``record.init.path``), so no caller digs into the JSON by key (D54).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import field, frozen

from mcx.errors import InputError
from mcx.hashing import digest

Json = dict[str, Any]
WeightsFormat = Literal["torch", "dist", "hf"]  # how an init source's weights are stored (mcx.weights.sources)
_FORMATS: dict[object, WeightsFormat] = {"torch": "torch", "dist": "dist", "hf": "hf"}

# What a data path's info says when the plan knew it only by its DVC record (mcx.ops.data takes it again once
# the run has pulled it).
NOT_PULLED = "not verified (not in the workspace)"


def _object(value: object) -> Json:
    return cast(Json, value) if isinstance(value, dict) else {}


@frozen(kw_only=True)
class Component:
    """One component: ``id`` is exactly what is hashed, ``info`` what was observed along the way."""

    id: Json = field(factory=dict)
    info: Json = field(factory=dict)

    def digest(self) -> str:
        """The full sha256 of ``id``: this component's share of the run ID."""
        return digest(self.id)

    def to_dict(self) -> Json:
        """The component as ``fingerprint.json`` holds it."""
        return {"id": self.id, "info": self.info}


C = TypeVar("C", bound=Component)


def component_from(cls: type[C], data: object, source: str, name: str) -> C:
    """``cls`` from its ``{"id": {...}, "info": {...}}`` JSON; InputError naming ``source`` if it is not one."""
    if isinstance(data, cls):
        return data
    if not (isinstance(data, Mapping) and isinstance(data.get("id"), dict) and isinstance(data.get("info"), dict)):
        raise InputError(f"{source}: component {name!r} is missing or malformed",
                         "regenerate it by running the spec again.")
    return cls(id=data["id"], info=data["info"])


@frozen(kw_only=True)
class CodeComponent(Component):
    """``id``: ``{"modules": {path: sha256}}`` (D52; before it, the commit and a diff hash). ``info``: provenance."""

    @property
    def modules(self) -> dict[str, str] | None:
        """The module files hashed by content; None for a record made before D52 (it hashed the commit)."""
        modules = self.id.get("modules")
        return cast(dict[str, str], modules) if isinstance(modules, dict) else None

    @property
    def commit(self) -> str | None:
        """The commit the code was recorded at: in its provenance, or (before D52) in its hashed part."""
        commit = self.info.get("commit") or self.id.get("commit")
        return commit if isinstance(commit, str) else None

    @property
    def branch(self) -> str | None:
        branch = self.info.get("branch")
        return branch if isinstance(branch, str) else None

    @property
    def dirty(self) -> bool | None:
        dirty = self.info.get("dirty", self.id.get("dirty"))
        return dirty if isinstance(dirty, bool) else None

    @property
    def changes(self) -> dict[str, str]:
        """Each path that differed from the commit -> "modified" | "deleted" | "untracked"."""
        return cast(dict[str, str], _object(self.info.get("changes")))

    @property
    def mcx_version(self) -> str | None:
        version = self.info.get("mcx_version", self.id.get("mcx_version"))
        return version if isinstance(version, str) else None


@frozen(kw_only=True)
class EnvironmentComponent(Component):
    """``id``: the lockfile's sha256, Python and the computing packages' versions; ``info``: the record keepers'."""

    @property
    def lockfile(self) -> str | None:
        """The lockfile name the environment was identified by (``lockfiles/<name>.txt``)."""
        name = self.info.get("lockfile")
        return name if isinstance(name, str) else None


@frozen(kw_only=True)
class ConfigComponent(Component):
    """``id``: the resolved spec less what cannot change a result (mcx.fingerprint.config); ``info``: its name."""

    @property
    def seed(self) -> Any:
        """The hashed ``train.seed``."""
        return _object(self.id.get("train")).get("seed")

    def without_seed(self) -> Json:
        """The hashed config with ``train.seed`` left out: what runs of a seed study share."""
        out = dict(self.id)
        if isinstance(out.get("train"), dict):
            out["train"] = {k: v for k, v in out["train"].items() if k != "seed"}
        return out


@frozen(kw_only=True)
class DataPath:
    """One data path of the spec (``dataset``, ``tokenizer``, ``merges``): its hashed identity and what was seen."""

    name: str
    id: Json
    info: Json

    @property
    def source(self) -> str | None:
        """"dvc" (the DVC record's hash), "sha256" (hashed by content here) or "absent" (not on this machine)."""
        source = self.id.get("source")
        return source if isinstance(source, str) else None

    @property
    def value(self) -> str | None:
        """The hash (a DVC md5, with ``.dir`` for a directory, or a sha256)."""
        value = self.id.get("value")
        return value if isinstance(value, str) else None

    @property
    def subpath(self) -> str | None:
        """The path inside a DVC-tracked directory whose hash is the identity."""
        sub = self.id.get("subpath")
        return sub if isinstance(sub, str) else None

    @property
    def record(self) -> str | None:
        """The ``.dvc`` file that tracks it."""
        record = self.info.get("record")
        return record if isinstance(record, str) else None

    @property
    def pulled(self) -> bool:
        """False when the plan knew it only by its DVC record (not in the workspace)."""
        return self.info.get("verified") != NOT_PULLED

    @property
    def max_token_id(self) -> int | None:
        """A prepared dataset's largest token id (the planner checks it against the vocabulary)."""
        top = self.info.get("max_token_id")
        return top if isinstance(top, int) else None


@frozen(kw_only=True)
class DataComponent(Component):
    """``id`` and ``info``: one entry per data path of the spec, by name (mcx.fingerprint.data)."""

    @property
    def paths(self) -> dict[str, DataPath]:
        return {name: DataPath(name=name, id=_object(ident), info=_object(self.info.get(name)))
                for name, ident in self.id.items()}

    @property
    def absent(self) -> bool:
        """Whether a path was not on this machine: no run ID is made from such a record (mcx.ops.plan)."""
        return any(p.source == "absent" for p in self.paths.values())

    @property
    def max_token_id(self) -> int | None:
        """The largest token id in any of the spec's datasets (a mixture's components: each)."""
        tops = [p.max_token_id for p in self.paths.values() if p.max_token_id is not None]
        return max(tops) if tops else None

    def with_path(self, path: DataPath) -> DataComponent:
        """This component with ``path``'s info replaced (its identity is checked equal by the caller)."""
        return DataComponent(id=self.id, info={**self.info, path.name: path.info})


@frozen(kw_only=True)
class HardwareComponent(Component):
    """``id``: device, GPU model, driver major, interconnect, nodes, GPUs per node; ``info``: the probe."""

    @property
    def device(self) -> str | None:
        """"cuda" or "cpu"."""
        device = self.id.get("device")
        return device if isinstance(device, str) else None

    @property
    def visible_gpus(self) -> list[Json]:
        """The probed GPUs this process sees, in CUDA's order (``nvidia-smi`` rows); [] when none or not probed."""
        probe = _object(self.info.get("probe"))
        by_index = {g["index"]: g for g in probe.get("gpus") or [] if isinstance(g, dict) and "index" in g}
        return [by_index[i] for i in probe.get("visible") or [] if i in by_index]


@frozen(kw_only=True)
class InitComponent(Component):
    """``id``: a run's ID, step and checkpoint hash, or a model directory's kind and content hash (mcx.fingerprint.init_from)."""

    @property
    def kind(self) -> str:
        """"run", "hf" or "megatron"."""
        return str(self.id.get("kind"))

    @property
    def run_id(self) -> str | None:
        run = self.id.get("run_id")
        return run if isinstance(run, str) else None

    @property
    def step(self) -> int | None:
        step = self.id.get("step")
        return step if isinstance(step, int) else None

    @property
    def content(self) -> str | None:
        """The content hash: a run's checkpoint file list, or a model directory's files."""
        content = self.id.get("checkpoint") or self.id.get("content")
        return content if isinstance(content, str) else None

    @property
    def path(self) -> str:
        """The checkpoint or model directory the weights are read from."""
        return str(self.info.get("path"))

    @property
    def format(self) -> WeightsFormat:
        """"hf", "dist" (a torch_dist checkpoint) or "torch"; InputError for a record that names none of them."""
        found = _FORMATS.get(self.info.get("format"))
        if found is None:
            raise InputError(f"fingerprint record: init.info.format is {self.info.get('format')!r}, not torch, dist "
                             "or hf", "regenerate it by running the spec again.")
        return found
