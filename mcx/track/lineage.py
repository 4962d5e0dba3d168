"""Which runs start from which: each run's init component (fingerprint.json) names its parent run, or
the model directory it started from; the chain is read from the project's run directories. A Hugging Face
directory that `mcx export-hf` wrote names the run it came from (its mcx.json, recorded as
``exported_from``), so a chain continues through an export and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import frozen

from mcx.errors import RunIdError
from mcx.track import paths

Json = dict[str, Any]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@frozen(kw_only=True)
class Origin:
    """The run a model directory was exported from, as its mcx.json records it (``record``: the file, whole)."""

    run_id: str | None
    step: int | None
    checkpoint: str | None
    record: Json

    @classmethod
    def of(cls, record: object) -> Origin | None:
        if not isinstance(record, dict):
            return None
        return cls(run_id=_text(record.get("run_id")), step=_int(record.get("step")),
                   checkpoint=_text(record.get("checkpoint")), record=record)


@frozen(kw_only=True)
class ModelSource:
    """An ancestor that is a model directory (``kind`` "hf" or "megatron"), not a run of this project."""

    kind: str | None
    content: str | None
    path: str | None
    exported_from: Origin | None

    def to_dict(self) -> Json:
        return {"kind": self.kind, "content": self.content, "path": self.path,
                "exported_from": None if self.exported_from is None else self.exported_from.record}


@frozen(kw_only=True)
class RunAncestor:
    """An ancestor run: the step and checkpoint its weights were taken at; ``here`` false for a run not in this
    project (its name and status then unknown)."""

    run_id: str
    step: int | None
    checkpoint: str | None
    here: bool
    name: str | None = None
    status: str | None = None
    kind: str = "run"

    def to_dict(self) -> Json:
        out: Json = {"kind": "run", "run_id": self.run_id, "step": self.step, "checkpoint": self.checkpoint,
                     "here": self.here}
        return {**out, "name": self.name, "status": self.status} if self.here else out


Ancestor = RunAncestor | ModelSource


@frozen(kw_only=True)
class RunRef:
    run_id: str
    name: str | None
    status: str | None

    def to_dict(self) -> Json:
        return {"run_id": self.run_id, "name": self.name, "status": self.status}


@frozen(kw_only=True)
class Descendant:
    """A run started from this one or from a descendant: ``depth`` 1 for a child; ``via`` the model directory
    (``kind:path``) it went through, None when it started from ``parent``'s checkpoint."""

    run_id: str
    name: str | None
    status: str | None
    depth: int
    parent: str
    step: int | None
    via: str | None

    def to_dict(self) -> Json:
        return {"run_id": self.run_id, "name": self.name, "status": self.status, "depth": self.depth,
                "parent": self.parent, "step": self.step, "via": self.via}


@frozen(kw_only=True)
class Lineage:
    """`mcx lineage`: the ancestors from the parent up to the first source (a model directory, random weights,
    or a run not in this project), and the descendants depth first."""

    run: RunRef
    ancestors: tuple[Ancestor, ...]
    descendants: tuple[Descendant, ...]

    def to_dict(self) -> Json:
        return {"run": self.run.to_dict(), "ancestors": [a.to_dict() for a in self.ancestors],
                "descendants": [d.to_dict() for d in self.descendants]}


@frozen(kw_only=True)
class Init:
    """fingerprint.json's init component: ``id`` (a run's ID, step and checkpoint hash, or a model directory's
    kind and content hash) and ``info`` (its path, and an export's mcx.json as ``exported_from``). The
    fingerprint package's InitComponent is the same record; this layer cannot import it (it imports track)."""

    id: Json
    info: Json

    @property
    def kind(self) -> str | None:
        return _text(self.id.get("kind"))


@frozen(kw_only=True)
class Node:
    """A run directory as the lineage reads it: run.json's name, status and start, fingerprint.json's source
    (None: random initialisation)."""

    run_id: str
    name: str | None
    status: str | None
    started: float | None
    source: Init | None

    @property
    def origin(self) -> Origin | None:
        return None if self.source is None else Origin.of(self.source.info.get("exported_from"))

    @property
    def parent(self) -> tuple[str | None, int | None]:
        """(run ID, step) its weights come from: the run itself, or the run a directory was exported from."""
        if self.source is None:
            return None, None
        if self.source.kind == "run":
            return _text(self.source.id.get("run_id")), _int(self.source.id.get("step"))
        origin = self.origin
        return (None, None) if origin is None else (origin.run_id, origin.step)


def _node(run_dir: Path) -> Node:
    fp = paths.read_json(run_dir / "fingerprint.json", {}) or {}
    run = paths.read_json(run_dir / "run.json", {}) or {}
    init = fp.get("init") or {}
    source = Init(id=dict(init.get("id") or {}), info=dict(init.get("info") or {})) if init else None
    started = run.get("started")
    return Node(run_id=run_dir.name, name=run.get("name") or (run.get("summary") or {}).get("name"),
                status=run.get("status"), started=started if isinstance(started, (int, float)) else None,
                source=source)


def nodes(project_root: Path) -> dict[str, Node]:
    """Every run directory of the project with its source (None: random initialisation)."""
    root = paths.runs_dir(project_root)
    if not root.is_dir():
        return {}
    return {d.name: _node(d) for d in sorted(root.iterdir()) if paths.RUN_ID_PATTERN.fullmatch(d.name)}


def lineage(project_root: Path, run_id: str) -> Lineage:
    """The chain of ``run_id``: where its weights came from, and the runs that started from it."""
    runs = nodes(project_root)
    here = runs.get(run_id)
    if here is None:
        raise RunIdError(f"unknown run ID {run_id}: no {paths.run_dir(project_root, run_id)}",
                         "list the runs of this project with `mcx ls`.")
    ancestors: list[Ancestor] = []
    seen, node = {run_id}, here
    while node.source is not None:
        source = node.source
        parent_id, step = node.parent
        origin = node.origin
        if source.kind != "run":
            ancestors.append(ModelSource(kind=source.kind, content=_text(source.id.get("content")),
                                         path=_text(source.info.get("path")), exported_from=origin))
        if parent_id is None or parent_id in seen:  # a content-addressed chain cannot loop; a hand-edited one could
            break
        seen.add(parent_id)
        parent = runs.get(parent_id)
        checkpoint = _text(source.id.get("checkpoint")) or (origin.checkpoint if origin is not None else None)
        if parent is None:
            ancestors.append(RunAncestor(run_id=parent_id, step=step, checkpoint=checkpoint, here=False))
            break
        ancestors.append(RunAncestor(run_id=parent_id, step=step, checkpoint=checkpoint, here=True,
                                     name=parent.name, status=parent.status))
        node = parent
    children: dict[str, list[str]] = {}
    for rid, n in runs.items():
        parent_id, _ = n.parent
        if parent_id is not None:
            children.setdefault(parent_id, []).append(rid)
    descendants: list[Descendant] = []

    def walk(parent_id: str, depth: int) -> None:
        for child in sorted(children.get(parent_id, []), key=lambda r: (runs[r].started or 0, r)):
            if child in seen:
                continue
            seen.add(child)
            n = runs[child]
            source = n.source
            via = None if source is None or source.kind == "run" else \
                f"{source.id.get('kind')}:{source.info.get('path')}"
            descendants.append(Descendant(run_id=child, name=n.name, status=n.status, depth=depth, parent=parent_id,
                                          step=n.parent[1], via=via))
            walk(child, depth + 1)

    walk(run_id, 1)
    return Lineage(run=RunRef(run_id=run_id, name=here.name, status=here.status), ancestors=tuple(ancestors),
                   descendants=tuple(descendants))


def describe_source(ancestor: Ancestor) -> str:
    """One ancestor in a line: "run ID step N" or "hf:DIR (exported from run ID step N)"."""
    if isinstance(ancestor, RunAncestor):
        return f"{ancestor.run_id} step {ancestor.step}"
    origin = ancestor.exported_from
    where = f"{ancestor.kind}:{ancestor.path or '?'}"
    return f"{where} (exported from {origin.run_id} step {origin.step})" if origin and origin.run_id else where
