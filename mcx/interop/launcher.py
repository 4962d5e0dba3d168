"""torchrun, srun and #SBATCH options -> hardware.*, launch.* and launch.slurm.* spec keys."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mcx.interop.pretrain_args import Ctx
from mcx.interop.script import Field, Launch, Unknown
from mcx.interop.unmapped import SBATCH_OWNED, TORCHRUN_HANDLED, TORCHRUN_MAPPED

_SLURM_KEYS = {"--partition": "launch.slurm.partition", "--account": "launch.slurm.account",
               "--qos": "launch.slurm.qos", "--constraint": "launch.slurm.constraint"}
_GPU_COUNT = re.compile(r"(?:gpu:)?(?:[A-Za-z0-9_.-]+:)?(\d+)")


def slurm_time(value: str) -> str | None:
    """A Slurm time limit in any of its forms as [D-]HH:MM:SS; None when it is not one (or unlimited)."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not m:
        return None
    days, b, c = (int(g) if g is not None else None for g in m.group(1, 3, 4))
    a = int(m.group(2))
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    elif b is None:  # minutes
        seconds = a * 60
    elif c is None:  # minutes:seconds
        seconds = a * 60 + b
    else:  # hours:minutes:seconds
        seconds = (a * 60 + b) * 60 + c
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    hms = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{d}-{hms}" if d else hms


def _count(ctx: Ctx, option: str, value: Field | None) -> int | None:
    if isinstance(value, Unknown):
        ctx.problem(f"{option}: {value.reason}")
        return None
    if value is None or not value.isdigit() or int(value) < 1:
        ctx.problem(f"{option} {value!s} is not a fixed positive count; set it in the spec")
        return None
    return int(value)


def _torchrun(ctx: Ctx, options: Sequence[tuple[str, Field | None]], unsupported: list[tuple[str, str]]) -> dict:
    found: dict[str, int] = {}
    endpoint_port: int | None = None
    for name, value in options:
        if name == "?":
            ctx.problem(f"a torchrun option is unknown ({value.reason}); the options it holds are not imported")  # type: ignore[union-attr]
        elif name in TORCHRUN_MAPPED:
            n = _count(ctx, f"torchrun {name}", value)
            if n is not None:
                found[TORCHRUN_MAPPED[name]] = n
        elif name in TORCHRUN_HANDLED:
            unsupported.append((f"torchrun {name}", TORCHRUN_HANDLED[name]))
            if name == "--rdzv-endpoint" and isinstance(value, str) and re.search(r":(\d+)$", value):
                endpoint_port = int(value.rsplit(":", 1)[1])
        else:
            unsupported.append((f"torchrun {name}", "a torchrun option mcx's launcher does not take"))
    if "launch.master_port" not in found and endpoint_port is not None:
        found["launch.master_port"] = endpoint_port
    return found


def _sbatch(ctx: Ctx, sbatch: Sequence[tuple[str, str | None]], unsupported: list[tuple[str, str]]) -> dict:
    """#SBATCH lines -> {key: value}; options the spec does not hold go to extra_sbatch or unsupported."""
    found: dict = {}
    extra: list[str] = []
    for name, value in sbatch:
        where = f"#SBATCH {name}"
        if name == "--nodes":
            n = _count(ctx, where, value)
            if n is not None:
                found["hardware.nodes"] = n
        elif name in _SLURM_KEYS and value is not None:
            found[_SLURM_KEYS[name]] = value
        elif name == "--time" and value is not None:
            t = slurm_time(value)
            if t is None:
                ctx.problem(f"{where}={value} is not a fixed time limit; launch.slurm.time keeps mcx's default")
            else:
                found["launch.slurm.time"] = t
        elif name == "--signal" and value is not None:
            m = re.fullmatch(r"(?:[BR]+:)?\w+@(\d+)", value)
            if m:
                found["launch.slurm.signal_grace_seconds"] = int(m.group(1))
            else:
                ctx.problem(f"{where}={value} is not SIG@SECONDS; launch.slurm.signal_grace_seconds keeps mcx's default")
        elif name in ("--requeue", "--no-requeue"):
            found["launch.slurm.requeue"] = name == "--requeue"
        elif name in SBATCH_OWNED:
            unsupported.append((where, SBATCH_OWNED[name]))
            if name in ("--gpus-per-node", "--gres", "--ntasks-per-node") and value is not None:
                m = _GPU_COUNT.fullmatch(value)
                if m:
                    found.setdefault("#" + name, int(m.group(1)))
        else:
            extra.append(name if value is None else f"{name}={value}")
    if extra:
        found["launch.slurm.extra_sbatch"] = extra
    return found


def _srun(ctx: Ctx, options: Sequence[tuple[str, Field | None]]) -> dict:
    found: dict[str, int] = {}
    for name, value in options:
        key = {"-N": "hardware.nodes", "--nodes": "hardware.nodes", "--ntasks-per-node": "#--ntasks-per-node",
               "--gpus-per-node": "#--gpus-per-node"}.get(name)
        if key is not None:
            n = _count(ctx, f"srun {name}", value)
            if n is not None:
                found[key] = n
    return found


def launcher_values(ctx: Ctx, launch: Launch, sbatch: Sequence[tuple[str, str | None]],
                    unsupported: list[tuple[str, str]]) -> None:
    """Set hardware.*, launch.kind, launch.master_port and launch.slurm.* from how the script launches."""
    slurm = bool(sbatch) or launch.srun is not None
    kind = "slurm" if slurm else ("torchrun" if launch.torchrun is not None else "local")
    how = "#SBATCH lines" if sbatch else ("srun" if launch.srun is not None else (
        "torchrun" if launch.torchrun is not None else "plain python"))
    ctx.set("launch.kind", kind, how, "derived: the script launches with " + how)
    from_sbatch = _sbatch(ctx, sbatch, unsupported) if sbatch else {}
    from_srun = _srun(ctx, launch.srun) if launch.srun is not None else {}
    if launch.torchrun is not None:
        from_torchrun = _torchrun(ctx, launch.torchrun, unsupported)
        nodes = from_torchrun.get("hardware.nodes", 1)
        gpus = from_torchrun.get("hardware.gpus_per_node", 1)
        origin = "torchrun"
        if "launch.master_port" in from_torchrun:
            ctx.set("launch.master_port", from_torchrun["launch.master_port"], "torchrun --master_port", "torchrun")
        for where, count in (("#SBATCH --nodes", from_sbatch.get("hardware.nodes")),
                             ("srun --nodes", from_srun.get("hardware.nodes"))):
            if count is not None and count != nodes:
                ctx.problem(f"torchrun --nnodes {nodes} but {where}={count}; hardware.nodes = {nodes}")
        for where, count in (("#SBATCH --gpus-per-node", from_sbatch.get("#--gpus-per-node")),
                             ("#SBATCH --gres", from_sbatch.get("#--gres"))):
            if count is not None and count != gpus:
                ctx.problem(f"torchrun --nproc_per_node {gpus} but {where} asks for {count} GPUs; "
                            f"hardware.gpus_per_node = {gpus}")
    elif slurm:  # srun starts one pretrain_gpt.py process per GPU
        nodes = from_srun.get("hardware.nodes") or from_sbatch.get("hardware.nodes") or 1
        gpus = (from_srun.get("#--ntasks-per-node") or from_sbatch.get("#--ntasks-per-node")
                or from_srun.get("#--gpus-per-node") or from_sbatch.get("#--gpus-per-node")
                or from_sbatch.get("#--gres") or 1)
        origin = "srun / #SBATCH"
    else:
        nodes, gpus, origin = 1, 1, "plain python: one process"
    ctx.set("hardware.nodes", nodes, "--nnodes", origin)
    ctx.set("hardware.gpus_per_node", gpus, "--nproc_per_node", origin)
    for key, value in from_sbatch.items():
        if key.startswith("launch."):
            ctx.set(key, value, "#SBATCH", "#SBATCH")
