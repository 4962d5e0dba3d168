"""Helpers of the GPU suite: mcx's worker on job files built as the control plane builds them.

``build_job`` and ``start_worker`` are benchmarks/gpu_validation.py's, which the GPU runs of 2026-11-30 used on
H200s: the spec plus overrides, ``resolve_layout``, the worker's environment, ``python -m mcx.train
STAGE_DIR`` (under torchrun for more than one GPU) in its own session.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

# The layout runs' small LLaMA-style model (8 layers, hidden 1024, seq 2048, global batch 16, 40 steps, bf16,
# Transformer Engine unless overridden): docs/benchmarks.md "Two-GPU layouts against one-GPU references".
from gpu_validation import DENSE, LAYOUTS, TOLERANCE, WINDOW, build_job, start_worker  # noqa: E402

SPEC = "experiments/tiny.toml"  # DENSE overrides every shape; the layout runs start from it too
LOCAL = 'model.transformer_impl="local"'
TE = 'model.transformer_impl="transformer_engine"'


@functools.cache
def present_gpu() -> str:
    """mcx's name of the GPU here ("H200", "H100"), asked in a child process so that the test process never
    initialises CUDA; the tests set ``hardware.gpu`` to it, so the plan, the memory check and the step-time
    model speak of the card that runs them (the device tool lends H100s as well as H200s)."""
    from mcx.plan.gpus import gpu_from_name

    name = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip().splitlines()[-1]
    model = gpu_from_name(name)
    assert model is not None, f"mcx's GPU table has no row for {name!r}"
    return model


def gpu_set() -> list[str]:
    return ["--set", f'hardware.gpu="{present_gpu()}"']


class Stage:
    """One worker on one stage directory: started, awaited, read back."""

    def __init__(self, stage_dir: Path, spec: str, overrides: list[str], *, stage: str = "full",
                 gpus: tuple[str, ...] = ("0",)) -> None:
        self.dir, self.gpus = stage_dir, list(gpus)
        self.job = build_job(stage_dir, spec, overrides, stage=stage, cpu=False)
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.t0 = 0.0
        self.wall = 0.0

    def start(self) -> "Stage":
        (self.dir / "result.json").unlink(missing_ok=True)  # a rerun on the same directory resumes
        self.t0 = time.monotonic()
        self.proc = start_worker(self.dir, self.job, self.gpus)
        return self

    def wait(self, timeout: float = 400) -> "Stage":
        assert self.proc is not None
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.rc = self.proc.wait()
        self.wall = time.monotonic() - self.t0
        return self

    def run(self, timeout: float = 400) -> "Stage":
        return self.start().wait(timeout)

    def wait_for_step(self, step: int, timeout: float = 300) -> None:
        """Until metrics.jsonl holds ``step``; fails if the worker ends first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(r["step"] >= step for r in self.records()):
                return
            assert self.proc.poll() is None, f"worker ended before step {step}:\n{self.tail()}"
            time.sleep(0.1)
        raise AssertionError(f"step {step} not reached in {timeout} s:\n{self.tail()}")

    # What the worker wrote.
    @property
    def result(self) -> dict[str, Any]:
        path = self.dir / "result.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def records(self, kind: str = "train") -> list[dict[str, Any]]:
        from mcx.contract.files import METRICS_FILE
        from mcx.train.metrics import read_records

        return [r for r in read_records(self.dir / METRICS_FILE) if r.get("kind") == kind]

    def curve(self) -> dict[str, list]:
        """Everything that must be equal bit for bit between two runs of one deterministic job."""
        return {"train": [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in self.records()],
                "valid": [(r["step"], r["loss"]) for r in self.records("valid")],
                "test": [(r["step"], r["loss"]) for r in self.records("test")]}

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records()]

    def log_lines(self, pattern: str) -> list[re.Match]:
        path = self.dir / "worker.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return [m for m in (re.search(pattern, line) for line in text.splitlines()) if m]

    def tail(self) -> str:
        out = []
        for name in ("worker.log", "launch.log"):
            path = self.dir / name
            if path.is_file():
                out.append(f"--- {name} ---\n{path.read_text(errors='replace')[-3000:]}")
        return f"rc {self.rc}, result {json.dumps({k: self.result.get(k) for k in ('status', 'error')})}\n" + "\n".join(out)

    def assert_finished(self) -> None:
        assert self.rc == 0 and self.result.get("status") == "finished", self.tail()


def run_together(stages: list[Stage], timeout: float = 400) -> list[Stage]:
    """Start every stage, then wait for all (several small jobs share a GPU; deterministic jobs give the
    same bits however the GPU is shared, which the reruns below check)."""
    for s in stages:
        s.start()
    for s in stages:
        s.wait(timeout)
    return stages


def tail_mean(losses: list[float], n: int = WINDOW) -> float:
    vals = [x for x in losses[-n:] if x is not None]
    assert vals, "no losses"
    return sum(vals) / len(vals)


# --- `mcx` as a user types it, in a project of its own (tests/conftest.py's end-to-end helpers) ---

def _top_conftest():
    """tests/conftest.py as a module of its own name (``conftest`` here is this directory's)."""
    import importlib.util

    name = "mcx_tests_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def make_project(root: Path) -> Path:
    """A user's project: git repository with the quickstart specs, data.dvc, the lockfile and
    data/quickstart, one commit (tests/conftest.py's make_e2e_project)."""
    return _top_conftest().make_e2e_project(root)


def mcx(project: Path, *args: str, timeout: float = 600):
    """`python -m mcx --project PROJECT ARGS` (tests/conftest.py's mcx_subprocess): exit code, stdout,
    stderr; no MLFLOW_TRACKING_URI, MCX_PROJECT or MCX_LOCKFILE from the caller reaches it."""
    top = _top_conftest()
    return top.mcx_subprocess(project, *args, env=top.e2e_env(), timeout=timeout)
