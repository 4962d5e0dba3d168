"""Why two fingerprints differ: which components moved, and which keys inside each.

Only the hashed part (``id``) of each component is compared, so the explanation lists exactly what
changes the run ID: config keys as dotted paths (``train.lr``), the mcx module files whose content
differs (``modules.mcx/train/loop.py``), environment versions, data hashes, hardware fields.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from mcx.fingerprint.record import COMPONENTS, INIT, FingerprintRecord, component_hashes, load_record, run_id

__all__ = ["ComponentDiff", "Explanation", "KeyChange", "explain", "explanation_to_dict", "flatten",
           "load_record"]


@frozen
class KeyChange:
    key: str  # dotted path inside the component's id
    a: Any  # value in the first record (None with kind "added")
    b: Any  # value in the second record (None with kind "removed")
    kind: str  # "changed" | "added" (only in b) | "removed" (only in a)


@frozen
class ComponentDiff:
    component: str
    hash_a: str
    hash_b: str
    changes: tuple[KeyChange, ...]


@frozen
class Explanation:
    run_a: str
    run_b: str
    components: tuple[ComponentDiff, ...]  # only the components whose hashes differ, in COMPONENTS order

    @property
    def same(self) -> bool:
        return not self.components


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {dotted key: leaf}; lists and scalars are leaves, an empty dict is a leaf."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def diff_keys(a: dict[str, Any], b: dict[str, Any]) -> tuple[KeyChange, ...]:
    fa, fb = flatten(a), flatten(b)
    changes = []
    for key in sorted(fa.keys() | fb.keys()):
        if key not in fb:
            changes.append(KeyChange(key, fa[key], None, "removed"))
        elif key not in fa:
            changes.append(KeyChange(key, None, fb[key], "added"))
        elif fa[key] != fb[key] or type(fa[key]) is not type(fb[key]):
            changes.append(KeyChange(key, fa[key], fb[key], "changed"))
    return tuple(changes)


def _code_keys(a: dict[str, Any], b: dict[str, Any]) -> tuple[KeyChange, ...]:
    """Module by module; against a record made before modules were hashed (D52), one line saying so rather
    than every module added and the commit removed."""
    if isinstance(a.get("modules"), dict) == isinstance(b.get("modules"), dict):
        return diff_keys(a, b)

    def what(ident: dict[str, Any]) -> str:
        if isinstance(ident.get("modules"), dict):
            return f"{len(ident['modules'])} mcx modules by content"
        return f"commit {str(ident.get('commit'))[:12]}{' + changes' if ident.get('dirty') else ''} (recorded before D52)"

    return (KeyChange("modules", what(a), what(b), "changed"),)


def explain(rec_a: FingerprintRecord, rec_b: FingerprintRecord) -> Explanation:
    """Which components of ``rec_b`` differ from ``rec_a``, key by key."""
    ha, hb = component_hashes(rec_a), component_hashes(rec_b)
    names = COMPONENTS + ((INIT,) if INIT in ha or INIT in hb else ())  # a run with a source and one without

    def ident(rec: FingerprintRecord, name: str) -> dict[str, Any]:
        return rec.component(name).id if name in rec.names() else {}

    diffs = tuple(
        ComponentDiff(name, ha.get(name, ""), hb.get(name, ""),
                      (_code_keys if name == "code" else diff_keys)(ident(rec_a, name), ident(rec_b, name)))
        for name in names
        if ha.get(name) != hb.get(name)
    )
    return Explanation(run_a=run_id(rec_a), run_b=run_id(rec_b), components=diffs)


def explanation_to_dict(expl: Explanation) -> dict[str, Any]:
    """JSON form (for ``mcx explain --json``)."""
    return {
        "run_a": expl.run_a,
        "run_b": expl.run_b,
        "same": expl.same,
        "components": [
            {"component": d.component, "hash_a": d.hash_a, "hash_b": d.hash_b,
             "changes": [{"key": c.key, "a": c.a, "b": c.b, "kind": c.kind} for c in d.changes]}
            for d in expl.components
        ],
    }
