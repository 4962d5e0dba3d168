"""A stage's ``metrics.jsonl`` as compact per-metric curves.

Every line is one JSON object with ``kind`` and ``step`` (see docs/stage-directory.md); each other
numeric field becomes the curve ``"<kind>/<field>"`` (``train/loss``, ``valid/ppl``, ...) holding
``array('q')`` steps and ``array('d')`` values. ``null`` values are left out of a curve (``mfu`` is
null where the GPU's peak is unknown); ``NaN`` and ``Infinity`` are kept, they are results.

Speed: the whole file is parsed as one JSON array (one call, shared key strings) with orjson when it
is installed, else the standard library; a file that does not parse that way (NaN tokens, which
orjson rejects, or a damaged line) is read line by line with the standard library, which also names
the bad line.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from mcx.errors import InputError

try:  # an accelerator only: same results, about twice as fast on large files
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = json.loads


_kind = itemgetter("kind")
_step = itemgetter("step")


class Curve(NamedTuple):
    """One metric over steps: ``steps`` (int64) and ``values`` (float64), same length, step order."""

    steps: array
    values: array


def curve(steps: list[int] | array, values: list[float] | array) -> Curve:
    """A Curve from plain sequences (for loaders other than run directories, and for tests)."""
    if len(steps) != len(values):
        raise ValueError(f"curve needs as many steps as values, got {len(steps)} and {len(values)}")
    return Curve(array("q", steps), array("d", values))


def parse_records(data: bytes, source: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON objects of a JSON-lines text, and notes about what was skipped.

    A last line without its newline that does not parse is a write the worker did not finish (it
    was killed); it is skipped with a note. Any other bad line raises InputError naming it.
    """
    body = data.strip()
    if not body:
        return [], []
    try:
        records = _fast_loads(b"[" + body.replace(b"\n", b",") + b"]")
        if set(map(type, records)) == {dict}:
            return records, []
    except ValueError:  # JSONDecodeError, orjson.JSONDecodeError: both subclass ValueError
        pass
    records, notes = [], []
    lines = data.split(b"\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if lineno == len(lines) and not data.endswith(b"\n"):
                notes.append(f"{source}: skipped an unfinished last line {lineno} (the worker stopped mid-write)")
                continue
            raise InputError(f"{source}:{lineno} is not valid JSON ({exc});",
                             "the metrics file is damaged: restore it from the run's DVC record or rerun the stage.") from None
        if type(record) is not dict:
            raise InputError(f"{source}:{lineno} is {type(record).__name__}, not a JSON object;",
                             "the metrics file is damaged: restore it from the run's DVC record or rerun the stage.")
        records.append(record)
    return records, notes


def tail_records(path: Path, nbytes: int) -> list[dict[str, Any]]:
    """The JSON objects in the last ``nbytes`` of a JSON-lines file, however long it grew (a first line cut by
    the window and an unfinished last one are skipped); [] when it is missing, unreadable or damaged."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - nbytes))
            data = f.read()
    except OSError:
        return []
    if size > nbytes:
        data = data.split(b"\n", 1)[-1]
    try:
        return parse_records(data, str(path))[0]
    except InputError:
        return []


def _group_fast(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]] | None:
    """Records by kind when every record has a hashable "kind" and a "step"; else None."""
    try:
        kinds = list(map(_kind, records))
        uniq = dict.fromkeys(kinds)
    except (KeyError, TypeError):
        return None
    if len(uniq) == 1:
        return {kinds[0]: records}
    return {k: [r for r, rk in zip(records, kinds) if rk == k] for k in uniq}


def _group_checked(records: list[dict[str, Any]], source: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    skipped = 0
    for record in records:
        kind, step = record.get("kind"), record.get("step")
        if type(kind) is not str or type(step) is not int:
            skipped += 1
            continue
        groups.setdefault(kind, []).append(record)
    notes = [f"{source}: skipped {skipped} line(s) without a string 'kind' and an integer 'step'"] if skipped else []
    return groups, notes


def _kind_curves(kind: str, group: list[dict[str, Any]], steps: array, source: str,
                 curves: dict[str, Curve], notes: list[str]) -> None:
    fields = set().union(*group)
    fields.discard("kind")
    fields.discard("step")
    for name in sorted(fields):
        try:
            vals = list(map(itemgetter(name), group))
        except KeyError:
            vals = [r.get(name) for r in group]
        try:
            curves[f"{kind}/{name}"] = Curve(steps, array("d", vals))  # steps shared; nobody mutates curves
            continue
        except TypeError:  # None where a field was null, or not a number at all
            pass
        pairs = [(s, v) for s, v in zip(steps, vals) if v is not None]
        if not pairs:
            continue
        try:
            curves[f"{kind}/{name}"] = Curve(array("q", [p[0] for p in pairs]), array("d", [p[1] for p in pairs]))
        except TypeError:
            notes.append(f"{source}: '{kind}' field {name!r} holds values that are not numbers; it is not a curve")


def records_to_curves(records: list[dict[str, Any]], source: str) -> tuple[dict[str, Curve], list[str]]:
    """Group records by kind and turn each numeric field into a curve ``"<kind>/<field>"``.

    The fast path assumes well-formed records (string kind, integer step); anything else takes the
    checked path, which skips such records and says how many.
    """
    groups = _group_fast(records) if records else {}
    if groups is not None and all(type(k) is str for k in groups):
        try:
            steps = {k: array("q", map(_step, g)) for k, g in groups.items()}  # TypeError unless all int
        except (KeyError, TypeError):
            groups = None
    else:
        groups = None
    notes: list[str] = []
    if groups is None:
        groups, notes = _group_checked(records, source)
        steps = {k: array("q", map(_step, g)) for k, g in groups.items()}
    curves: dict[str, Curve] = {}
    for kind, group in groups.items():
        _kind_curves(kind, group, steps[kind], source, curves, notes)
    return curves, notes


def read_metrics(path: Path) -> tuple[dict[str, Curve], list[str]]:
    """Curves from one ``metrics.jsonl`` (empty when the file does not exist yet), and notes."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return {}, []
    records, notes = parse_records(data, str(path))
    curves, more = records_to_curves(records, str(path))
    return curves, notes + more
