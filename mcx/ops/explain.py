"""`mcx explain A B`: which fingerprint components differ between two specs or run IDs, and how."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from mcx.errors import InputError
from mcx.fingerprint.diff import Explanation
from mcx.fingerprint.diff import explain as diff
from mcx.fingerprint.record import FingerprintRecord, collect, load_record
from mcx.spec import load_spec

_RUN_ID = re.compile(r"^[0-9a-f]{12}$")


def _exists(ref: str) -> bool:
    try:
        return Path(ref).exists()
    except OSError as exc:
        raise InputError(f"{ref[:40]!r}...: {exc.strerror};", "give a path to a TOML spec or a 12-character run ID.") from None


def _record(ref: str, project: Path, overrides: list[str]) -> FingerprintRecord:
    if _RUN_ID.match(ref) and not _exists(ref):
        return load_record(project, ref)
    if not _exists(ref):
        raise InputError(f"{ref!r} is neither a spec file nor a run ID;",
                         "give a path to a TOML spec or a 12-character run ID from 'mcx ls'.")
    return collect(load_spec(ref, overrides), project, require_data=False)


def explain(a: str, b: str, *, project: Path, overrides: Sequence[str] = ()) -> Explanation:
    return diff(_record(a, project, []), _record(b, project, list(overrides)))
