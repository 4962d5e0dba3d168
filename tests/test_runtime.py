"""The worker's process settings for a job (mcx.train.runtime): deterministic mode's, set for the job and undone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcx.contract.job import Job
from mcx.plan.layout import Layout
from mcx.spec.load import load_spec
from mcx.train.runtime import distributed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_mode_uses_deterministic_kernels_without_filling_fresh_memory(deterministic):
    """Megatron-LM's deterministic mode sets torch's deterministic algorithms, which by default also fill every new
    tensor with NaN: a guard for code that reads memory it never wrote, 5.7% of the benchmark spec's step on an H100
    (D80). mcx turns the fill off for the job (bitwise reruns check the result) and leaves torch as it found it."""
    spec = load_spec(ROOT / "experiments" / "tiny.toml", [f"train.deterministic={str(deterministic).lower()}"])
    job = Job(run_id="f" * 12, stage="full", spec=spec, layout=Layout(), data_dir="", checkpoint_dir="", device="cpu")
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with distributed(job):
        inside = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    assert inside == ((True, False) if deterministic else before)
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before
