"""Hardware identity: what the run computes on, probed where that is the machine that trains.

Probed (recorded in ``info``): every GPU from ``nvidia-smi --query-gpu`` (name, driver, memory),
the GPUs visible to this process (``CUDA_VISIBLE_DEVICES``), the interconnect class from
``nvidia-smi topo -m`` ("nvlink" when any two visible GPUs share NVLink, "pcie" otherwise,
"single" for one GPU), and the CPU model (``/proc/cpuinfo``) and core count.

Hashed (``id``):

- GPU run (a GPU is visible and ``hardware.gpu`` is not "cpu"): ``device: "cuda"``, the probed GPU
  model, the driver's major version, the interconnect class, and the spec's ``hardware.nodes`` and
  ``hardware.gpus_per_node``. Not the GPU count of this machine (the spec says how many train), not the
  driver's minor version, not the memory (the model implies it).
- CPU run: ``device: "cpu"``, the CPU model, nodes and gpus_per_node (processes per node).
- Slurm launch, or ``probe=False``: the machine running mcx is not the one that trains, so nothing is
  probed and the identity is the spec's declaration (``probed: false``, ``gpu: hardware.gpu``).
  ``hardware.gpu = "any"`` then names no model; the record warns.

The interconnect between nodes (InfiniBand, RoCE) is not probed: nodes > 1 is in the hash.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcx.fingerprint.tools import run_tool

if TYPE_CHECKING:
    from mcx.spec import ExperimentSpec

NVIDIA_SMI_TIMEOUT_S = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the topo header, even into a pipe
_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name,driver_version,memory.total", "--format=csv,noheader,nounits")


def parse_gpu_query(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        index, uuid, name, driver, memory = (f.strip() for f in line.split(","))
        gpus.append({"index": int(index), "uuid": uuid, "name": name, "driver": driver,
                     "memory_mib": int(memory) if memory.isdigit() else None})
    return gpus


def visible(gpus: list[dict[str, Any]], cuda_visible_devices: str | None) -> list[dict[str, Any]]:
    """The GPUs CUDA would give this process: ``CUDA_VISIBLE_DEVICES`` entries in order, up to the
    first entry that names no GPU (CUDA ignores the rest); all of them when it is unset."""
    if cuda_visible_devices is None:
        return gpus
    chosen = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = [g for g in gpus if (entry.isdigit() and g["index"] == int(entry))
                 or (entry.startswith("GPU-") and g["uuid"].startswith(entry))]
        if not match or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def parse_topology(text: str, indices: list[int]) -> str | None:
    """Interconnect class among the GPUs ``indices`` from ``nvidia-smi topo -m``: "nvlink", "pcie",
    "single"; None when there are no GPUs or the matrix does not name them."""
    if not indices:
        return None
    if len(indices) == 1:
        return "single"
    lines = [ln for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    if not lines:
        return None
    header = lines[0].split()
    rows = {}
    for ln in lines[1:]:
        cells = ln.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            rows[int(cells[0][3:])] = dict(zip(header, cells[1:], strict=False))
    if not all(i in rows for i in indices):
        return None
    links = [rows[a].get(f"GPU{b}", "") for a in indices for b in indices if a != b]
    return "nvlink" if any(link.startswith("NV") for link in links) else "pcie"


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU model name (``model name`` in /proc/cpuinfo; the architecture where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def _smi(*args: str) -> str | None:
    try:
        proc = run_tool(args, timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    if proc is None or proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace")


def probe() -> dict[str, Any]:
    """What this machine has. Missing or failing nvidia-smi means no GPUs."""
    query = _smi(*_QUERY)
    gpus = parse_gpu_query(query) if query is not None else []
    seen = visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    topo = _smi("nvidia-smi", "topo", "-m") if len(seen) > 1 else ""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 0
    return {
        "nvidia_smi": query is not None,
        "gpus": gpus,
        "visible": [g["index"] for g in seen],
        "interconnect": parse_topology(topo or "", [g["index"] for g in seen]),
        "cpu": cpu_model(),
        "cpu_cores": cores,
    }


def _gpu_matches(declared: str, probed_name: str) -> bool:
    """Does nvidia-smi's name (e.g. "NVIDIA A100-SXM4-80GB") fit the spec's ``hardware.gpu`` ("A100-80GB")?"""
    return all(token.lower() in probed_name.lower() for token in declared.split("-"))


def identity(spec: ExperimentSpec, probed: dict[str, Any] | None, warnings: list[str]) -> dict[str, Any]:
    """The hashed fields, from the spec and (when given) the probe."""
    hw = spec.hardware
    base = {"nodes": hw.nodes, "gpus_per_node": hw.gpus_per_node}
    if probed is None:
        if hw.gpu == "any":
            warnings.append('hardware.gpu = "any" and the training machine is not probed here: the run ID '
                            "names no GPU model; set hardware.gpu")
        return {"probed": False, "device": "cpu" if hw.gpu == "cpu" else "cuda", "gpu": hw.gpu, **base}
    by_index = {g["index"]: g for g in probed["gpus"]}
    seen = [by_index[i] for i in probed["visible"]]
    if hw.gpu == "cpu" or not seen:
        if hw.gpu not in ("cpu", "any"):
            warnings.append(f"hardware.gpu = {hw.gpu!r} but this machine shows no GPU; recorded as a CPU run")
        return {"probed": True, "device": "cpu", "cpu": probed["cpu"], **base}
    names = sorted({g["name"] for g in seen})
    drivers = sorted({g["driver"].split(".")[0] for g in seen})
    if len(names) > 1:
        warnings.append(f"visible GPUs differ ({', '.join(names)}); set CUDA_VISIBLE_DEVICES to one model")
    if len(seen) < hw.gpus_per_node:
        warnings.append(f"hardware.gpus_per_node = {hw.gpus_per_node} but {len(seen)} GPU(s) are visible here")
    if hw.gpu != "any" and not all(_gpu_matches(hw.gpu, n) for n in names):
        warnings.append(f"hardware.gpu = {hw.gpu!r} but this machine has {', '.join(names)}; the record "
                        "names the probed model")
    return {"probed": True, "device": "cuda", "gpu": names[0] if len(names) == 1 else names,
            "driver_major": drivers[0] if len(drivers) == 1 else drivers,
            "interconnect": probed["interconnect"], **base}


def collect_hardware(spec: ExperimentSpec, probe_hardware: bool = True) -> dict[str, Any]:
    """The hardware component: ``{"id": ..., "info": ..., "warnings": [...]}``."""
    warnings: list[str] = []
    do_probe = probe_hardware and spec.launch.kind != "slurm"
    probed = probe() if do_probe else None
    info = {"spec": {"nodes": spec.hardware.nodes, "gpus_per_node": spec.hardware.gpus_per_node,
                     "gpu": spec.hardware.gpu},
            "probe": probed,
            "not_probed_because": None if do_probe else ("slurm launch" if probe_hardware else "probe_hardware=False")}
    return {"id": identity(spec, probed, warnings), "info": info, "warnings": warnings}
