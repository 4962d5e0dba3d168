"""Running the external tools the probes read (git, nvidia-smi): fixed argv, never a shell."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Stable, non-interactive git: English messages, no credential prompts, no optional index writes
# (another mcx process or the user's editor may hold the index lock).
GIT_ENV = {"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}


def run_tool(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes] | None:
    """Run ``argv`` (resolved on PATH) and capture its output; None when the tool is not installed.

    Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds; callers decide what that means.
    """
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    full_env = {**os.environ, **env} if env else None
    return subprocess.run(
        [exe, *argv[1:]],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
