"""The README's commands work as written after its set-up: every program its tour types is one the
environment installs, and the set-up says how to put that environment on PATH (./dev shell, or activate)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SHELL_WORDS = {"source", "export", "cd", "for", "do", "done", "if", "then", "fi", "echo", "git", "./dev"}


def commands(block: str) -> list[str]:
    """The program of each command in a bash block: first words, of pipelines and of $(...) too."""
    found = []
    for line in block.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line or line.startswith(("--", "print(", "m,")) or re.match(r"\w+\(\) \{", line):
            continue  # a continued command, a quoted Python line, a function's definition (its name is below)
        for part in re.split(r"\$\(|\||&&|;", line):
            part = re.sub(r"^\s*[A-Z_]+=", "", part).strip()
            if part:
                found.append(part.split()[0].rstrip(")"))
    return found


def test_the_tour_types_only_programs_the_environment_puts_on_path():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    functions = set(re.findall(r"^(\w+)\(\) \{", "\n".join(blocks), re.M))  # last() { python3 ...; }
    used = {c for block in blocks for c in commands(block)} - SHELL_WORDS - functions
    assert {"mcx", "dvc"} <= used, used
    bin_dir = Path(sys.executable).parent  # the environment ./dev made (.venv/bin)
    missing = sorted(c for c in used if not (bin_dir / c).exists())
    assert not missing, f"the README types {missing}, which {bin_dir} does not hold"
    activation = README.index("source .venv/bin/activate")
    assert activation < README.index("\nmcx plan ") and "./dev shell" in README[activation - 400:activation + 200]


def test_dev_shell_puts_mcx_and_dvc_on_path(tmp_path):
    """`./dev shell -c ...` runs in a shell whose PATH starts with the environment's bin (no network: the
    environment is there already, ./dev only checks its lockfile stamp)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"  # nothing of the environment before ./dev adds it
    env["SHELL"] = shutil.which("bash") or "/bin/bash"
    proc = subprocess.run([str(ROOT / "dev"), "shell", "-c", "command -v mcx; command -v dvc; mcx --version"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    mcx_path, dvc_path, version = proc.stdout.splitlines()
    assert Path(mcx_path) == ROOT / ".venv" / "bin" / "mcx" and Path(dvc_path) == ROOT / ".venv" / "bin" / "dvc"
    assert version.startswith("mcx ")
