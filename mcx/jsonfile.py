"""Files that readers see whole: the one atomic writer (JSON, or bytes) and the forgiving JSON reader every layer uses."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON in ``path``; ``default`` when the file is absent, empty or torn."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default


def write_json_atomic(path: Path, obj: Any, *, allow_nan: bool = False) -> None:
    """Write ``obj`` as JSON so readers see the old or the new file, never a torn one. The temporary
    file's name is unique, so concurrent writers (ranks refusing the same stage) never share it."""
    text = json.dumps(obj, sort_keys=True, indent=1, allow_nan=allow_nan) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a uniquely named temporary file beside it, fsynced, renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
