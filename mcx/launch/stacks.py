"""Every Python thread's stack of a worker process, read from outside it: py-spy, else faulthandler.

``py-spy dump --nonblocking`` reads the process's memory without stopping it, so it works on a rank that is
stopped (SIGSTOP) or stuck in a collective; it needs ptrace rights over the process, which the watchdog has
as its ancestor (Yama's default ``ptrace_scope`` 1) unless a container or policy forbids it. Where py-spy is
missing or refused, the worker's own faulthandler writes the stacks on SIGUSR2 (mcx.train.rankfiles): the
signal is sent, then SIGCONT (a stopped rank handles nothing), and the new bytes of its stacks file are taken.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mcx.contract.files import RANKS_DIR, rank_stacks_file

PY_SPY_TIMEOUT_S = 60.0
FAULTHANDLER_WAIT_S = 5.0


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (the environment's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def dump_stacks(pid: int, rank: int, stage_dir: Path, out: Path) -> str:
    """Write rank ``rank``'s (process ``pid``) stacks to ``out``; returns how they were read ("py-spy",
    "faulthandler") or why they could not be."""
    exe, why = py_spy(), "py-spy is not installed"
    if exe is not None:
        try:
            proc = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                                  timeout=PY_SPY_TIMEOUT_S, check=False)
            if proc.returncode == 0 and proc.stdout.strip():
                out.write_text(proc.stdout, encoding="utf-8")
                return "py-spy"
            why = f"py-spy failed ({(proc.stderr or proc.stdout).strip()[:300]})"
        except subprocess.TimeoutExpired:
            why = f"py-spy took over {PY_SPY_TIMEOUT_S:g} s"
    stacks = stage_dir / RANKS_DIR / rank_stacks_file(rank)
    before = stacks.stat().st_size if stacks.is_file() else 0
    try:
        os.kill(pid, signal.SIGUSR2)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        out.write_text(f"{why}; the process {pid} had exited\n", encoding="utf-8")
        return f"none: {why}, and the process had exited"
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.2)
        size = stacks.stat().st_size if stacks.is_file() else 0
        if size > before:
            time.sleep(0.3)  # faulthandler writes thread by thread
            with open(stacks, "rb") as f:
                f.seek(before)
                out.write_bytes(f.read())
            return f"faulthandler ({why})"
    out.write_text(f"{why}; faulthandler wrote nothing within {FAULTHANDLER_WAIT_S:g} s\n", encoding="utf-8")
    return f"none: {why}, and faulthandler wrote nothing"
