"""The process's place in the job: torch.distributed, Megatron-Core's parallel state, seeds.

The launcher (torchrun, srun, or nothing for a local in-process run) sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Without them the worker is a world of one; it still
initialises a process group (gloo on CPU) because MCore's parallel_state is built on one.
Slurm's own variables (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) are read when srun starts the
worker directly.

Determinism knobs that must be set before the first CUDA call (NCCL, cuBLAS, TE) are applied here,
before ``torch.cuda.set_device``; see :func:`deterministic_env`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from mcx.errors import EnvironmentProblem, InputError
from mcx.plan.memory import ALLOCATOR_ENV, with_expandable_segments
from mcx.contract.job import Job

# Megatron-LM's deterministic mode (arguments.py / initialize.py): ring all-reduce, a fixed cuBLAS
# workspace, no non-deterministic Transformer Engine kernels.
DETERMINISTIC_ENV = {
    "NCCL_ALGO": "Ring",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}


@dataclass
class World:
    """This rank in the job, with the few collectives the training loop needs."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    dp_rank: int = 0  # data-parallel rank (which share of each global batch this rank reads)
    records_batches: bool = True  # this rank writes its DP rank's batch hashes: TP 0, CP 0 of pipeline stage 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over all ranks, in float64."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over all ranks (NaN wins, as in torch's MAX all-reduce)."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        return self.sum([1.0 if flag else 0.0])[0] > 0

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def barrier(self) -> None:
        if self.size > 1:
            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def gather_object(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def deterministic_env() -> None:
    """Set what Megatron sets for bitwise-reproducible GPU runs (before CUDA and NCCL start)."""
    for key, value in DETERMINISTIC_ENV.items():
        os.environ[key] = value


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch (CPU and, lazily, CUDA) generators, as Megatron's _set_random_seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def distributed(job: Job) -> Iterator[World]:
    """Initialise torch.distributed and MCore's parallel_state for ``job``; tear both down after."""
    from megatron.core import parallel_state

    rank = _env_int("RANK", "SLURM_PROCID", default=0)
    size = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1)
    local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
    lay = job.layout
    if size != lay.world_size:
        raise InputError(f"the launcher started {size} process(es) but the job's layout needs {lay.world_size};",
                         "start the worker through `mcx run` (it picks the launcher), or fix layout.world_size.")
    cuda = job.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise EnvironmentProblem("the job asks for device \"cuda\" but torch sees no GPU;",
                                     "run it on a GPU machine or plan it for hardware.gpu = \"cpu\".")
        if job.spec.train.deterministic:
            deterministic_env()
        if job.spec.train.expandable_segments:  # read when CUDA's caching allocator starts, below
            os.environ[ALLOCATOR_ENV] = with_expandable_segments(os.environ.get(ALLOCATOR_ENV))
        if lay.tp > 1 or lay.cp > 1:
            # Megatron-LM requires it for tensor/context parallelism: kernels are queued in issue
            # order, so asynchronous TP communication overlaps compute as its schedule assumes.
            os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # MCore's fusions are torch.compile'd. Past dynamo's recompile limit (8), new variants run
        # eagerly with other rounding, so a process's numerics would hang on the order its shapes
        # arrived in (an MoE layer's fused SwiGLU reached 10 variants on H200: requires_grad, and
        # experts with 0 or 1 tokens). Keep every variant compiled.
        import torch._dynamo as dynamo  # (``import torch._dynamo`` would make ``torch`` local here)

        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 64)
    else:
        device = torch.device("cpu")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    # (a property of torch.utils.deterministic's module that torch's type stubs do not declare)
    was_filling = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    if job.spec.train.deterministic:
        torch.use_deterministic_algorithms(True)
        # Deterministic mode's NaN fill of every torch.empty guards code that reads memory it never wrote; it is
        # no source of determinism and costs a step dearly (D80). Bitwise reruns check what it would have hidden.
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]

    owns_group = not dist.is_initialized()
    if owns_group:
        backend = "nccl" if cuda else "gloo"
        timeout = datetime.timedelta(minutes=30)
        device_id = device if cuda else None  # NCCL binds this rank's GPU up front (None: torch's default)
        if size == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                    device_id=device_id)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=timeout,
                                    device_id=device_id)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.virtual_stages,
        context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep,
    )
    try:
        yield World(rank=rank, size=size, local_rank=local_rank, device=device,
                    dp_rank=parallel_state.get_data_parallel_rank(),
                    records_batches=parallel_state.get_tensor_model_parallel_rank() == 0
                    and parallel_state.get_context_parallel_rank() == 0
                    and parallel_state.get_pipeline_model_parallel_rank() == 0)
    finally:
        parallel_state.destroy_model_parallel()
        if owns_group:
            dist.destroy_process_group()
        torch.use_deterministic_algorithms(was_deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling  # type: ignore[attr-defined]
