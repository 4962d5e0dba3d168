"""System metrics: a daemon thread on each node's local-rank-0 worker samples the GPUs and the host.

Every ``tracking.system_metrics_interval_s`` seconds (0: off) the sampler appends one JSON line to
``STAGE_DIR/system.jsonl`` (node 0) or ``STAGE_DIR/system.<node>.jsonl`` (node N > 0: hosts never
append to one shared file, which a network filesystem may interleave), and one more when it stops:

    {"time": unix, "node": 0, "nodes": 1, "host": "...", "step": 120 | null,
     "cpu_utilization_percentage": ..., "system_memory_usage_megabytes": ...,
     "system_memory_usage_percentage": ..., "process_rss_megabytes": ...,
     "gpu_0_utilization_percentage": ..., "gpu_0_memory_usage_megabytes": ...,
     "gpu_0_memory_usage_percentage": ..., "gpu_0_power_usage_watts": ...,
     "gpu_0_temperature_celsius": ..., "gpu_0_sm_clock_mhz": ..., "gpu_1_...": ...}

Names are MLflow's own system metrics (mlflow/system_metrics, megabytes = 1e6 bytes) where MLflow has
one; the control plane logs each as ``system/<name>`` (mcx.track.forward). ``step`` is the last step
the training loop finished (null before the loop knows it). GPUs are numbered as CUDA numbers them for
this process (``CUDA_VISIBLE_DEVICES`` order), and sampled only for a CUDA job, through NVML
(``pynvml`` from nvidia-ml-py) or, without it, ``nvidia-smi --query-gpu``. Host values come from
psutil; ``process_rss_megabytes`` is the sampling (local rank 0) worker's resident memory. A value
that cannot be read is left out; a sampler with nothing to read writes nothing. Nothing here raises
into training, and the loop never waits on the sampler: the loop only keeps its step in an attribute,
which the sampler reads through ``step_of`` (no lock), and the sampler's own calls (NVML, a subprocess,
/proc) touch no CUDA context and release the GIL while they wait.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from mcx.contract.files import system_file
from mcx.fingerprint.hardware import visible
from mcx.fingerprint.tools import run_tool

log = logging.getLogger(__name__)

MB = 1e6  # MLflow's megabyte
MIB = 1 << 20
SMI_FIELDS = ("index", "uuid", "utilization.gpu", "memory.used", "memory.total", "power.draw", "temperature.gpu",
              "clocks.sm")
SMI_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0  # a hung nvidia-smi is killed after SMI_TIMEOUT_S; the stage never waits longer


def gpu_values(i: int, *, util: float | None = None, used_bytes: float | None = None,
               total_bytes: float | None = None, power_w: float | None = None, temp_c: float | None = None,
               sm_mhz: float | None = None) -> dict[str, float]:
    """One GPU's line fields (MLflow's names; temperature and SM clock are mcx's); None is left out."""
    out = {
        f"gpu_{i}_utilization_percentage": util,
        f"gpu_{i}_memory_usage_megabytes": None if used_bytes is None else used_bytes / MB,
        f"gpu_{i}_memory_usage_percentage": (None if used_bytes is None or not total_bytes
                                             else 100.0 * used_bytes / total_bytes),
        f"gpu_{i}_power_usage_watts": power_w,
        f"gpu_{i}_temperature_celsius": temp_c,
        f"gpu_{i}_sm_clock_mhz": sm_mhz,
    }
    return {k: float(v) for k, v in out.items() if v is not None}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]", "[Unknown Error]"
        return None


def parse_nvidia_smi(text: str, cuda_visible_devices: str | None) -> dict[str, float]:
    """Line fields from ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` for the
    GPUs CUDA gives this process (memory in MiB, power in W, clocks in MHz)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS) or not cells[0].isdigit():
            continue
        rows.append({"index": int(cells[0]), "uuid": cells[1], "cells": cells[2:]})
    out: dict[str, float] = {}
    for i, row in enumerate(visible(rows, cuda_visible_devices)):
        util, used, total, power, temp, sm = map(_number, row["cells"])
        out.update(gpu_values(i, util=util, used_bytes=None if used is None else used * MIB,
                              total_bytes=None if total is None else total * MIB, power_w=power, temp_c=temp,
                              sm_mhz=sm))
    return out


class Probe(Protocol):
    name: str

    def sample(self) -> dict[str, float]: ...
    def close(self) -> None: ...


class NvmlProbe:
    """GPUs through NVML; raises at construction when NVML is missing or finds no driver."""

    name = "nvml"

    def __init__(self, cuda_visible_devices: str | None) -> None:
        import pynvml

        pynvml.nvmlInit()
        try:
            devices = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                devices.append({"index": index, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                                "handle": handle})
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self.nvml = pynvml
        self.handles = [d["handle"] for d in visible(devices, cuda_visible_devices)]

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:  # not supported on this GPU, or a transient driver error
            return None

    def sample(self) -> dict[str, float]:
        nv = self.nvml
        out: dict[str, float] = {}
        for i, h in enumerate(self.handles):
            rates = self._read(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._read(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._read(nv.nvmlDeviceGetPowerUsage, h)
            temp = self._read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            sm = self._read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            util = None if rates is None else rates.gpu
            out.update(gpu_values(i, util=util, used_bytes=None if mem is None else mem.used,
                                  total_bytes=None if mem is None else mem.total,
                                  power_w=None if power is None else power / 1000.0, temp_c=temp, sm_mhz=sm))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class SmiProbe:
    """GPUs through ``nvidia-smi --query-gpu`` (one short subprocess a sample)."""

    name = "nvidia-smi"

    def __init__(self, cuda_visible_devices: str | None, executable: str | None = None) -> None:
        exe = executable or shutil.which("nvidia-smi")
        if exe is None:
            raise FileNotFoundError("nvidia-smi is not on PATH")
        self.argv = [exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
        self.cuda_visible_devices = cuda_visible_devices

    def sample(self) -> dict[str, float]:
        proc = run_tool(self.argv, timeout=SMI_TIMEOUT_S)
        if proc is None:
            raise FileNotFoundError(f"{self.argv[0]} is gone")
        if proc.returncode != 0:
            raise RuntimeError(f"nvidia-smi exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[:200]}")
        return parse_nvidia_smi(proc.stdout.decode("utf-8", "replace"), self.cuda_visible_devices)

    def close(self) -> None:
        pass


class HostProbe:
    """Host CPU and memory, and this process's resident memory, through psutil."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.process = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point

    def sample(self) -> dict[str, float]:
        vm = self.psutil.virtual_memory()
        return {
            "cpu_utilization_percentage": float(self.psutil.cpu_percent(interval=None)),
            "system_memory_usage_megabytes": vm.used / MB,
            "system_memory_usage_percentage": 100.0 * vm.used / vm.total,
            "process_rss_megabytes": self.process.memory_info().rss / MB,
        }

    def close(self) -> None:
        pass


def gpu_probe(cuda_visible_devices: str | None) -> Probe | None:
    """NVML, else nvidia-smi, else None (said once in worker.log)."""
    reasons = []
    for make in (NvmlProbe, SmiProbe):
        try:
            return make(cuda_visible_devices)
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, FileNotFoundError: try the next
            reasons.append(f"{make.name}: {type(exc).__name__}: {exc}")
    log.warning("no GPU system metrics (%s)", "; ".join(reasons))
    return None


def host_probe() -> Probe | None:
    try:
        return HostProbe()
    except Exception as exc:  # noqa: BLE001
        log.warning("no host system metrics (psutil: %s: %s)", type(exc).__name__, exc)
        return None


class SystemSampler:
    """Appends one line of ``probes``' values to ``path`` every ``interval_s`` seconds, from a daemon
    thread, and one more on :meth:`stop`. ``step_of`` says the training loop's step (it must not block)."""

    def __init__(self, path: Path, probes: list[Probe], *, interval_s: float, node: int = 0, nodes: int = 1,
                 host: str | None = None) -> None:
        self.path, self.probes, self.interval_s = Path(path), list(probes), interval_s
        self.node, self.nodes, self.host = node, nodes, host or socket.gethostname()
        self.step_of: Callable[[], int | None] = lambda: None
        self.samples = 0  # lines written
        self.failures = 0  # probe reads or writes that failed (each kind said once in worker.log)
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SystemSampler:
        if self._thread is None and self.probes:
            self._thread = threading.Thread(target=self._loop, name="mcx-system-metrics", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Take the last sample and end the thread; never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for probe in self.probes:
            with contextlib.suppress(Exception):
                probe.close()

    def _warn(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if what not in self._warned:
            self._warned.add(what)
            log.warning("system metrics: %s failed (%s: %s); going on without it", what, type(exc).__name__, exc)

    def sample(self) -> dict[str, Any] | None:
        """One line: the time, where, the step, and what every probe could read (None: nothing)."""
        values: dict[str, float] = {}
        for probe in self.probes:
            try:
                values.update(probe.sample())
            except Exception as exc:  # noqa: BLE001 - a failed read leaves its values out of this line
                self._warn(probe.name, exc)
        if not values:
            return None
        try:
            step = self.step_of()
        except Exception as exc:  # noqa: BLE001
            self._warn("reading the step", exc)
            step = None
        return {"time": time.time(), "node": self.node, "nodes": self.nodes, "host": self.host,
                "step": step if type(step) is int else None, **values}

    def _loop(self) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                while True:
                    stopping = self._stop.wait(self.interval_s)
                    line = self.sample()
                    if line is not None:
                        try:
                            f.write(json.dumps(line, sort_keys=True, allow_nan=False) + "\n")
                            f.flush()
                            self.samples += 1
                        except (OSError, ValueError) as exc:  # a full disk, a NaN: this sample is lost
                            self._warn(f"writing {self.path.name}", exc)
                    if stopping:
                        return
        except Exception as exc:  # noqa: BLE001 - the thread ends; training goes on
            self._warn("the sampler", exc)


def node_place(env: dict[str, str] | os._Environ = os.environ) -> tuple[int, int, int]:
    """(node, nodes, local rank) of this process: torchrun's GROUP_RANK/GROUP_WORLD_SIZE/LOCAL_RANK,
    else Slurm's SLURM_NODEID/SLURM_NNODES/SLURM_LOCALID, else one node."""
    def first(*names: str) -> int | None:
        for name in names:
            value = env.get(name, "")
            if value.isdigit():
                return int(value)
        return None

    node = first("GROUP_RANK", "SLURM_NODEID") or 0
    nodes = first("GROUP_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1
    local_rank = first("LOCAL_RANK", "SLURM_LOCALID") or 0
    return node, max(nodes, node + 1), local_rank


@contextlib.contextmanager
def system_metrics(stage_dir: Path, interval_s: float, device: str) -> Iterator[SystemSampler | None]:
    """The node's sampler for one stage (None on other ranks, when off, or with nothing to read);
    stopped, with a last sample, when the block ends however it ends."""
    node, nodes, local_rank = node_place()
    if interval_s <= 0 or local_rank != 0:
        yield None
        return
    sampler = None
    try:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        probes = [p for p in (gpu_probe(cvd) if device == "cuda" else None, host_probe()) if p is not None]
        if probes:
            sampler = SystemSampler(Path(stage_dir) / system_file(node), probes, interval_s=interval_s, node=node,
                                    nodes=nodes).start()
            log.info("system metrics every %gs from %s into %s", interval_s, ", ".join(p.name for p in probes),
                     system_file(node))
    except Exception as exc:  # noqa: BLE001 - no metrics, never a failed stage
        log.warning("system metrics off: %s: %s", type(exc).__name__, exc)
        sampler = None
    try:
        yield sampler
    finally:
        if sampler is not None:
            sampler.stop()
