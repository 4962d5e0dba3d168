"""The worker's environment: the one place that decides which variables a worker gets.

Every launcher starts workers with the parent's environment plus :func:`worker_env`'s variables
(plus the caller's extras), passed explicitly, so a local run, a torchrun run and a Slurm run of
the same spec see the same settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from mcx.errors import InputError
from mcx.spec.schema import ExperimentSpec

# Megatron-Core's deterministic mode (--deterministic-mode) needs these set before CUDA, cuBLAS,
# NCCL and Transformer Engine initialise; the worker cannot set them for itself in time.
DETERMINISTIC_ENV: Mapping[str, str] = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS reductions
    "NCCL_ALGO": "Ring",  # one fixed all-reduce algorithm: same summation order every step
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",  # Transformer Engine: deterministic kernels only
}

# MKL's GEMMs split their sums by the threads they use, and MKL may use fewer than it was given
# (D46). Its strict conditional-numerical-reproducibility mode gives the same bits whatever the
# thread count, on the machine's own instruction set; a value the user set is left as it is.
MKL_REPRODUCIBLE: Mapping[str, str] = {"MKL_CBWR": "AUTO,STRICT"}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def worker_env(spec: ExperimentSpec, inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables every worker of ``spec`` gets, whichever launcher starts it. ``inherited`` is
    the environment the workers start from (this process's by default)."""
    inherited = os.environ if inherited is None else inherited
    env = {
        "PYTHONHASHSEED": "0",  # stable hash() of str, hence stable set/dict iteration orders
        "PYTHONUNBUFFERED": "1",  # worker output reaches the log as it happens
    }
    env.update({k: v for k, v in MKL_REPRODUCIBLE.items() if k not in inherited})
    if spec.train.deterministic:
        env.update(DETERMINISTIC_ENV)
    if spec.train.cuda_graphs and spec.train.expandable_segments:
        env["NCCL_GRAPH_REGISTER"] = "0"  # NCCL cannot register expandable segments' memory in a graph (as Megatron-LM)
    return env


def check_env(env: Mapping[str, str], where: str = "env") -> dict[str, str]:
    """``env`` as a plain dict, after checking it can reach a process (or a batch script) intact.

    Names must be shell identifiers; values must be strings without NUL or newline characters
    (a newline would end an ``#SBATCH`` line or an ``export`` in a generated script).
    """
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(
                f"{where}: {name!r} is not a valid environment variable name",
                "Use letters, digits and underscores, not starting with a digit.",
            )
        if not isinstance(value, str):
            raise InputError(f"{where}.{name}: the value must be a string, got {type(value).__name__}")
        reject_control(value, f"{where}.{name}")
        checked[name] = value
    return checked


def reject_control(value: str, where: str) -> str:
    """``value`` unchanged, or InputError when it holds a newline, carriage return or NUL."""
    for char, label in (("\n", "newline"), ("\r", "carriage return"), ("\0", "NUL")):
        if char in value:
            raise InputError(
                f"{where}: the value {value!r} contains a {label}",
                "Values passed to workers and batch scripts must be single-line.",
            )
    return value


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def omp_threads(procs: int, cpus: int | None = None) -> str:
    """OMP_NUM_THREADS for ``procs`` processes sharing ``cpus`` CPUs: an equal share, at least 1."""
    return str(max(1, (cpus if cpus is not None else cpu_count()) // max(1, procs)))
