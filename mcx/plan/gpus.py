"""GPU facts as a literal table: peak FLOP/s, memory, node shape.

Peak numbers are NVIDIA's *dense* Tensor Core figures (the datasheets print the 2:4-sparse ones,
twice as large). MFU in mcx is always model FLOPs (Megatron's accounting, see ``mcx.plan.flops``)
divided by the **bf16 dense** peak, whatever precision the run uses, as Megatron users quote it; an
FP8 run can therefore show an MFU that is low against its FP8 peak. A GPU that is not in this table
(or ``hardware.gpu = "any"`` / ``"cpu"``) has no peak: MFU is "unknown", never a guess.

``memory_bytes`` is what PyTorch reports as ``total_memory`` (nvidia-smi's Total less the driver's
reservation). H200: measured on an H200 SXM (nvidia-smi 143771 MiB total, 616 MiB reserved ->
150109880320 bytes). The others: nvidia-smi's Total for the SXM/PCIe part less the same ~0.6 GiB.
"""

from __future__ import annotations

import re

from attrs import frozen

from mcx.spec.schema import GpuModel

MiB = 1 << 20
GiB = 1 << 30


@frozen(kw_only=True)
class Gpu:
    model: str
    bf16_tflops: float  # dense, also the fp16 figure
    fp8_tflops: float | None  # dense; None: no FP8 Tensor Cores
    memory_bytes: int  # usable, as torch.cuda.get_device_properties().total_memory
    compute_capability: tuple[int, int]
    gpus_per_node: int  # a typical server (HGX board / PCIe chassis)
    nvlink: bool
    nvlink_gb_per_s: float | None  # per GPU, bidirectional
    hbm_tb_per_s: float  # memory bandwidth
    net_gb_per_s: float  # network per GPU, one direction (a typical server: one 400 Gb/s NIC a GPU on HGX H100)
    architecture: str


def _mib(total: int, reserved: int = 616) -> int:
    return (total - reserved) * MiB


GPUS: dict[str, Gpu] = {
    g.model: g
    for g in (
        Gpu(model="H200", bf16_tflops=989.0, fp8_tflops=1979.0, memory_bytes=150_109_880_320,
            compute_capability=(9, 0), gpus_per_node=8, nvlink=True, nvlink_gb_per_s=900.0,
            hbm_tb_per_s=4.8, net_gb_per_s=50.0, architecture="Hopper"),
        Gpu(model="H100", bf16_tflops=989.0, fp8_tflops=1979.0, memory_bytes=_mib(81559),
            compute_capability=(9, 0), gpus_per_node=8, nvlink=True, nvlink_gb_per_s=900.0,
            hbm_tb_per_s=3.35, net_gb_per_s=50.0, architecture="Hopper"),
        Gpu(model="A100-80GB", bf16_tflops=312.0, fp8_tflops=None, memory_bytes=_mib(81920),
            compute_capability=(8, 0), gpus_per_node=8, nvlink=True, nvlink_gb_per_s=600.0,
            hbm_tb_per_s=2.039, net_gb_per_s=25.0, architecture="Ampere"),
        Gpu(model="A100-40GB", bf16_tflops=312.0, fp8_tflops=None, memory_bytes=_mib(40960),
            compute_capability=(8, 0), gpus_per_node=8, nvlink=True, nvlink_gb_per_s=600.0,
            hbm_tb_per_s=1.555, net_gb_per_s=25.0, architecture="Ampere"),
        Gpu(model="L40S", bf16_tflops=362.05, fp8_tflops=733.0, memory_bytes=_mib(46068),
            compute_capability=(8, 9), gpus_per_node=8, nvlink=False, nvlink_gb_per_s=None,
            hbm_tb_per_s=0.864, net_gb_per_s=25.0, architecture="Ada Lovelace"),
        Gpu(model="B200", bf16_tflops=2250.0, fp8_tflops=4500.0, memory_bytes=_mib(183359),
            compute_capability=(10, 0), gpus_per_node=8, nvlink=True, nvlink_gb_per_s=1800.0,
            hbm_tb_per_s=8.0, net_gb_per_s=50.0, architecture="Blackwell"),
    )
}

FP8_MIN_CAPABILITY = (8, 9)  # Transformer Engine's FP8 GEMMs: Ada, Hopper and newer

# nvidia-smi / torch device names -> model key. Variants with other peaks (H100 PCIe and NVL,
# H200 NVL, GH200) are deliberately absent: MFU "unknown" beats a wrong number.
_NAMES: tuple[tuple[str, GpuModel], ...] = (
    (r"\bH200\b(?!.*\bNVL\b)", "H200"),
    (r"\bH100\b.*\b(SXM|HBM3)\b|\bH100 SXM", "H100"),
    (r"\bA100\b.*\b80\s?GB\b", "A100-80GB"),
    (r"\bA100\b.*\b40\s?GB\b", "A100-40GB"),
    (r"\bL40S\b", "L40S"),
    (r"\bB200\b", "B200"),
)
_NAME_PATTERNS = tuple((re.compile(p, re.IGNORECASE), model) for p, model in _NAMES)


def gpu_from_name(name: str) -> GpuModel | None:
    """Map a device name ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB") to a table key."""
    if re.search(r"\bGH200\b", name, re.IGNORECASE):
        return None
    for pattern, model in _NAME_PATTERNS:
        if pattern.search(name):
            return model
    return None


def gpu_info(gpu: str) -> Gpu | None:
    """The table row for ``hardware.gpu``; None for "any", "cpu" or an unknown model."""
    return GPUS.get(gpu)


def peak_flops(gpu: str, precision: str = "bf16") -> float | None:
    """Dense peak FLOP/s of one GPU for ``precision`` ("bf16", "fp16", "fp8*"; "fp32" -> the bf16
    Tensor Core peak is not the fp32 one, so None). None when the GPU is unknown."""
    info = GPUS.get(gpu)
    if info is None:
        return None
    if precision in ("bf16", "fp16"):
        return info.bf16_tflops * 1e12
    if precision.startswith("fp8"):
        return info.fp8_tflops * 1e12 if info.fp8_tflops is not None else None
    return None


def mfu_peak_flops(gpu: str) -> float | None:
    """The denominator of MFU: the bf16 dense peak, for every precision (Megatron users' convention)."""
    return peak_flops(gpu, "bf16")


def supports_fp8(gpu: str) -> bool | None:
    """True/False for a known GPU, None for "any" (cannot know); "cpu" -> False."""
    if gpu == "cpu":
        return False
    info = GPUS.get(gpu)
    if info is None:
        return None
    return info.compute_capability >= FP8_MIN_CAPABILITY
