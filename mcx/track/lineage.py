"""Which runs start from which: each run's init component (fingerprint.json) names its parent run, or
the model directory it started from; the chain is read from the project's run directories. A Hugging Face
directory that `mcx export-hf` wrote names the run it came from (its mcx.json, recorded as
``exported_from``), so a chain continues through an export and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcx.track import paths


def _node(run_dir: Path) -> dict[str, Any]:
    fp = paths.read_json(run_dir / "fingerprint.json", {}) or {}
    run = paths.read_json(run_dir / "run.json", {}) or {}
    init = fp.get("init") or {}
    return {"run_id": run_dir.name, "name": run.get("name") or (run.get("summary") or {}).get("name"),
            "status": run.get("status"), "started": run.get("started"),
            "source": {**(init.get("id") or {}), "path": (init.get("info") or {}).get("path"),
                       "exported_from": (init.get("info") or {}).get("exported_from")} if init else None}


def _parent(source: dict[str, Any] | None) -> tuple[str | None, int | None]:
    """(run ID, step) a source's weights come from: the run itself, or the run a directory was exported from."""
    if not source:
        return None, None
    if source.get("kind") == "run":
        return source.get("run_id"), source.get("step")
    origin = source.get("exported_from") or {}
    return origin.get("run_id"), origin.get("step")


def nodes(project_root: Path) -> dict[str, dict[str, Any]]:
    """Every run directory of the project with its source (None: random initialisation)."""
    root = paths.runs_dir(project_root)
    if not root.is_dir():
        return {}
    return {d.name: _node(d) for d in sorted(root.iterdir()) if paths.RUN_ID_PATTERN.fullmatch(d.name)}


def lineage(project_root: Path, run_id: str) -> dict[str, Any]:
    """``{"run", "ancestors", "descendants"}``: ancestors from the parent up to the first source (a model
    directory, random weights, or a run not in this project: ``here`` false); descendants depth first, each
    with its ``depth`` (1: a child) and ``parent``."""
    runs = nodes(project_root)
    here = runs.get(run_id)
    if here is None:
        from mcx.errors import RunIdError

        raise RunIdError(f"unknown run ID {run_id}: no {paths.run_dir(project_root, run_id)}",
                         "list the runs of this project with `mcx ls`.")
    ancestors, seen, node = [], {run_id}, here
    while node["source"] is not None:
        source = node["source"]
        parent_id, step = _parent(source)
        if source.get("kind") != "run":
            ancestors.append({"kind": source.get("kind"), "content": source.get("content"), "path": source.get("path"),
                              "exported_from": source.get("exported_from")})
        if parent_id is None or parent_id in seen:  # a content-addressed chain cannot loop; a hand-edited one could
            break
        seen.add(parent_id)
        parent = runs.get(parent_id)
        entry = {"kind": "run", "run_id": parent_id, "step": step,
                 "checkpoint": source.get("checkpoint") or (source.get("exported_from") or {}).get("checkpoint"),
                 "here": parent is not None}
        if parent is None:
            ancestors.append(entry)
            break
        ancestors.append({**entry, "name": parent["name"], "status": parent["status"]})
        node = parent
    children: dict[str, list[str]] = {}
    for rid, n in runs.items():
        parent_id, _ = _parent(n["source"])
        if parent_id is not None:
            children.setdefault(parent_id, []).append(rid)
    descendants: list[dict[str, Any]] = []

    def walk(parent_id: str, depth: int) -> None:
        for child in sorted(children.get(parent_id, []), key=lambda r: (runs[r]["started"] or 0, r)):
            if child in seen:
                continue
            seen.add(child)
            n = runs[child]
            via = None if n["source"].get("kind") == "run" else f"{n['source'].get('kind')}:{n['source'].get('path')}"
            descendants.append({"run_id": child, "name": n["name"], "status": n["status"], "depth": depth,
                                "parent": parent_id, "step": _parent(n["source"])[1], "via": via})
            walk(child, depth + 1)

    walk(run_id, 1)
    return {"run": {"run_id": run_id, "name": here["name"], "status": here["status"]},
            "ancestors": ancestors, "descendants": descendants}


def describe_source(ancestor: dict[str, Any]) -> str:
    """One ancestor in a line: "run ID step N" or "hf:DIR (exported from run ID step N)"."""
    if ancestor["kind"] == "run":
        return f"{ancestor['run_id']} step {ancestor.get('step')}"
    origin = ancestor.get("exported_from") or {}
    where = f"{ancestor['kind']}:{ancestor.get('path') or '?'}"
    return f"{where} (exported from {origin['run_id']} step {origin.get('step')})" if origin.get("run_id") else where
