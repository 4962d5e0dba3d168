"""The GPU suite (``pytest -m gpu``, ``pytest -m gpu2``): mcx's CUDA backend driven for real.

The worker is started on job.json files built as the control plane builds them (gpuwork.py), and
``mcx run`` / ``mcx reproduce`` as a user types them. Models and the bounds the tests assert are those of
docs/benchmarks.md; each test names where its bound was measured.

Where CUDA has fewer devices than a test's marker needs, the test is skipped with the reason; `./dev
test` (CI) leaves both markers out. On the GPU machine: ``bash benchmarks/gpu/suite.sh OUT``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the suite's modules import gpuwork by name

SUITE = "bash benchmarks/gpu/suite.sh OUT --only gpu,gpu2"
NEEDS = {"gpu": 1, "gpu2": 2}


@functools.cache
def cuda_devices() -> tuple[int, str]:
    """(CUDA devices visible, why there are none), asked of torch in a child process so that this
    process never initialises CUDA (the workers it starts get the GPUs whole)."""
    probe = "import torch; print(torch.cuda.device_count())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"torch could not be asked ({exc})"
    if done.returncode != 0:
        return 0, f"torch is not importable ({done.stderr.strip().splitlines()[-1:]})"
    return int(done.stdout.strip().splitlines()[-1]), "torch.cuda.device_count() is 0 here"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        need = max((NEEDS[m.name] for m in item.iter_markers() if m.name in NEEDS), default=0)
        if not need:
            continue
        have, why = cuda_devices()
        if have < need:
            reason = (f"needs {need} CUDA device{'s' if need > 1 else ''}, {have} visible"
                      f"{f' ({why})' if not have else ''}; on the GPU machine: {SUITE}")
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def quickstart() -> Path:
    """data/quickstart, which the GPU machine gets in the device call's carry (benchmarks/README.md)."""
    path = ROOT / "data" / "quickstart"
    assert (path / "manifest.json").is_file(), (
        f"{path} is missing: carry data/quickstart to the GPU machine (benchmarks/README.md), or run "
        "`./dev mcx data prepare` here first")
    return path


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory, quickstart: Path) -> Path:
    return tmp_path_factory.mktemp("gpu")


@pytest.fixture(scope="session")
def out_dir() -> Path | None:
    """Where the suite keeps what comes back from the GPU machine (benchmarks/gpu/suite.sh sets it)."""
    out = os.environ.get("MCX_GPU_OUT")
    return Path(out) if out else None

