"""Slurm time limits (``launch.slurm.time``, ``smoke.time_limit``): read one, write one.

Pure, so the planner can read them too; ``mcx.launch.sbatch`` adds its control-character check.
"""

from __future__ import annotations

import re

from mcx.errors import InputError

# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (ASCII digits, at most 9 a field).
_TIME = re.compile(r"(?:(\d{1,9})-)?(\d{1,9})(?::(\d{1,9}))?(?::(\d{1,9}))?\Z", re.ASCII)


def time_limit_seconds(value: str, key: str = "launch.slurm.time") -> int | None:
    """Seconds in a Slurm time limit (None for no limit); InputError naming ``key``."""
    if value.strip().upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(value.strip())
    if not m:
        raise InputError(
            f"{key} = {value!r} is not a Slurm time limit",
            "Use minutes, 'HH:MM:SS' or 'D-HH:MM:SS', e.g. '04:00:00'.",
        )
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + a * 3600 + b * 60 + c
    elif c or m.group(4) is not None:  # H:M:S
        seconds = a * 3600 + b * 60 + c
    else:  # M or M:S
        seconds = a * 60 + b
    if seconds <= 0:
        raise InputError(f"{key} = {value!r} must be longer than zero", "Or 'UNLIMITED'.")
    return seconds


def slurm_time(seconds: int) -> str:
    """``seconds`` as Slurm writes a limit: 'HH:MM:SS', or 'D-HH:MM:SS' from a day on."""
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms
