"""Hooks on the model's modules, keyed by logical path: the traced step of a replay, and the output fault.

``Tracer`` (a replay's job file asks for it, mcx.contract.trace) records over one step, per rank and
micro-batch and in execution order: each micro-batch's input, every module's forward output (with a hash of
its inputs), the gradient of every module's output as backward produces it, each parameter's gradient as the
optimizer receives it, and each parameter after the optimizer's step. A record is a fingerprint: the sha256
of the tensors' bytes, exact, and float64 sum, abs-max and L2 norm, so a diff says how large a difference is;
the full tensors of the first records (up to a byte budget) and of the records the job names are kept.

``OutputFault`` is ``debug.perturb_output``: the amount added to one module's forward output in one
micro-batch of one step, on every rank (a fault at a known operation, which `mcx locate` must name).

Module paths are the unwrapped model's (no DDP / Float16Module prefix) with a transformer layer's index made
global (``decoder.layers.<layer_number - 1>``), so a path names the same module in every pipeline stage.
Nothing here is attached unless asked: a run without a trace or an output fault runs no hook.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mcx.contract.trace import LAYER_LEVEL, NOISED, TraceRequest, record_key, records_file, tensors_file
from mcx.errors import InputError
from mcx.spec.schema import OutputPerturbSpec
from mcx.train.backend import Batch
from mcx.train.runtime import World

log = logging.getLogger("mcx.train")

LAYER = re.compile(r"^decoder\.layers\.(\d+)(\..+)?$")


def model_chunks(model: Any) -> list[torch.nn.Module]:
    """The model chunks without their wrappers (DDP, Float16Module): the CPU backend's one module, the GPU
    backend's list (one a virtual pipeline stage)."""
    out = []
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        while isinstance(getattr(chunk, "module", None), torch.nn.Module):
            chunk = chunk.module
        out.append(chunk)
    return out


def _logical(chunk: torch.nn.Module, name: str) -> tuple[str, int | None]:
    """(the path with the layer index made global, the 1-based global layer number or None)."""
    m = LAYER.match(name)
    if not m:
        return name, None
    number = int(getattr(chunk.get_submodule(f"decoder.layers.{m.group(1)}"), "layer_number", int(m.group(1)) + 1))
    return f"decoder.layers.{number - 1}{m.group(2) or ''}", number


def logical_modules(chunks: list[torch.nn.Module]) -> Iterator[tuple[int, str, int | None, torch.nn.Module]]:
    """(chunk index, logical path, layer number, module) of every submodule but the roots."""
    for i, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if name:
                path, layer = _logical(chunk, name)
                yield i, path, layer, module


def logical_parameters(chunks: list[torch.nn.Module]) -> Iterator[tuple[str, int | None, torch.nn.Parameter]]:
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            path, layer = _logical(chunk, name)
            yield path, layer, p


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    return []


def digest(tensors: list[torch.Tensor]) -> str:
    """sha256 over each tensor's dtype, shape and bytes (exact: any changed bit changes it)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:32]


def fingerprint(tensors: list[torch.Tensor]) -> dict[str, Any]:
    """The exact hash and float64 sum, abs-max and L2 norm over ``tensors``."""
    total, peak, square = 0.0, 0.0, 0.0
    for t in tensors:
        if t.numel():
            d = t.detach().double()
            total += float(d.sum())
            peak = max(peak, float(d.abs().max()))
            square += float((d * d).sum())
    return {"sha": digest(tensors), "sum": total, "absmax": peak, "norm": math.sqrt(square),
            "shape": list(tensors[0].shape) if tensors else [], "dtype": str(tensors[0].dtype) if tensors else None}


def position(world: World) -> dict[str, int]:
    """This rank's parallel coordinates (TP, PP, CP, DP, EP)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return {"tp": 0, "pp": 0, "cp": 0, "dp": world.dp_rank, "ep": 0}
    return {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
            "cp": ps.get_context_parallel_rank(), "dp": ps.get_data_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank()}


class _MicroBatches:
    """Counts each chunk's forward calls since ``reset``: the micro-batch (0-based) a hook runs in."""

    def __init__(self, chunks: list[torch.nn.Module]) -> None:
        self.count = [-1] * len(chunks)
        self.handles = [c.register_forward_pre_hook(self._pre(i)) for i, c in enumerate(chunks)]

    def _pre(self, i: int):
        def hook(module, args):
            self.count[i] += 1
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class OutputFault:
    """``debug.perturb_output``: checked against the model's module paths when built (every rank's, so a
    pipeline stage's own layers count), armed for its step only."""

    def __init__(self, spec: OutputPerturbSpec, model: Any, world: World, num_micro: int, train_iters: int) -> None:
        self.spec = spec
        self.chunks = model_chunks(model)
        self.targets = [(i, m) for i, path, _, m in logical_modules(self.chunks) if path == spec.module]
        known = world.gather_object(sorted({path for _, path, _, _ in logical_modules(self.chunks)}))
        if not any(spec.module in paths for paths in known):
            paths = sorted({p for ps in known for p in ps})
            raise InputError(f"debug.perturb_output.module = {spec.module!r} is not a module of this model; it has: "
                             f"{', '.join(paths)};", "give one of those paths (a layer's index is global, 0-based).")
        if spec.step <= train_iters and spec.micro_batch >= num_micro:
            raise InputError(f"debug.perturb_output.micro_batch = {spec.micro_batch}, but each step of this stage has "
                             f"{num_micro} micro-batch(es) a data-parallel rank;",
                             f"give a micro-batch from 0 to {num_micro - 1}.")

    @contextmanager
    def armed(self, step: int) -> Iterator[None]:
        if step != self.spec.step or not self.targets:
            yield
            return
        counter = _MicroBatches(self.chunks)
        handles = [m.register_forward_hook(self._hook(i, counter)) for i, m in self.targets]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            counter.remove()
        log.warning("debug.perturb_output: added %g to the output of %s in micro-batch %d of step %d (fault injection)",
                    self.spec.amount, self.spec.module, self.spec.micro_batch, step)

    def _hook(self, chunk: int, counter: _MicroBatches):
        def hook(module, args, output):
            if counter.count[chunk] != self.spec.micro_batch:
                return None
            if isinstance(output, torch.Tensor):
                return output + self.spec.amount
            first, *rest = output
            return type(output)([first + self.spec.amount, *rest]) if isinstance(output, (tuple, list)) else output
        return hook


def _rounded(t: torch.Tensor, tag: str) -> torch.Tensor:
    """``t`` times (1 + eps * u), u uniform in [-1, 1] from a generator seeded by ``tag``: one unit of rounding."""
    gen = torch.Generator().manual_seed(int(hashlib.sha256(tag.encode()).hexdigest()[:15], 16))
    u = torch.rand(t.shape, generator=gen, dtype=torch.float64).mul_(2).sub_(1)
    return (t.double() * (1 + torch.finfo(t.dtype).eps * u.to(t.device))).to(t.dtype)


def _noise(chunk: int, path: str, counter: _MicroBatches, step: int):
    """The band's replay (D74, D79): one unit of rounding, as a different summation order makes, on the output
    and on the gradient the backward brings to it (seeded by the module path, micro-batch and step): the second
    reaches each term of a weight gradient's sum on its own, as another order of that sum does."""
    def hook(module, args, output):
        first = output if isinstance(output, torch.Tensor) else output[0]
        tag = f"{path}/{counter.count[chunk]}/{step}"
        noised = _rounded(first, tag)
        if noised.requires_grad:
            noised.register_hook(lambda grad: _rounded(grad, f"{tag}/grad"))
        if isinstance(output, torch.Tensor):
            return noised
        return type(output)([noised, *output[1:]])
    return hook


class Tracer:
    """One step's trace on this rank (see the module docstring), written when the step ends."""

    def __init__(self, request: TraceRequest, model: Any, optimizer: Any, world: World, out_dir: Path) -> None:
        self.request, self.optimizer, self.world = request, optimizer, world
        self.chunks = model_chunks(model)
        self.out_dir = out_dir
        self.where = position(world)
        self.records: list[dict[str, Any]] = []
        self.kept: dict[str, torch.Tensor] = {}
        self.kept_bytes = 0
        self.seen: dict[tuple[int, str, str], int] = {}
        self.step = 0

    def _record(self, phase: str, module: str, layer: int | None, micro_batch: int, tensors: list[torch.Tensor],
                **extra: Any) -> None:
        occurrence = self.seen.get((micro_batch, phase, module), 0)
        self.seen[(micro_batch, phase, module)] = occurrence + 1
        rec = {**self.where, "step": self.step, "micro_batch": micro_batch, "phase": phase, "module": module,
               "layer": layer, "occurrence": occurrence, "rank": self.world.rank, **fingerprint(tensors), **extra}
        rec["key"] = key = record_key(rec)
        size = sum(t.numel() * t.element_size() for t in tensors[:1])
        forced = key in self.request.keep or (self.request.layers and (
            phase in ("batch", "update") or (phase == "forward" and LAYER_LEVEL.match(module) is not None)))
        if tensors and (forced or self.kept_bytes + size <= self.request.keep_bytes):
            self.kept[key] = tensors[0].detach().to("cpu", copy=True)
            self.kept_bytes += size
            rec["kept"] = True
        rec["index"] = len(self.records)
        self.records.append(rec)

    @contextmanager
    def traced(self, step: int, microbatches: list[Batch]) -> Iterator[None]:
        self.step = step
        for i, mb in enumerate(microbatches):
            fields = (mb["tokens"], mb["labels"], mb["loss_mask"], mb["position_ids"], mb.get("attention_mask"))
            self._record("batch", "input", None, i, [t for t in fields if t is not None])
        counter = _MicroBatches(self.chunks)
        handles = [m.register_forward_hook(self._forward(i, path, layer, counter))
                   for i, path, layer, m in logical_modules(self.chunks)]
        if self.request.noise:  # after the tracing hooks: the record holds the output, the next module gets it noised
            handles += [m.register_forward_hook(_noise(i, path, counter, step))
                        for i, path, _, m in logical_modules(self.chunks) if NOISED.match(path)]
        own = vars(self.optimizer).get("step")  # an instance attribute of its own, if any, comes back after
        self.optimizer.step = self._step(self.optimizer.step)  # this instance only, for this step
        try:
            yield
        finally:
            if own is None:
                del self.optimizer.step
            else:
                self.optimizer.step = own
            for h in handles:
                h.remove()
            counter.remove()
        self.write()

    def _forward(self, chunk: int, path: str, layer: int | None, counter: _MicroBatches):
        def hook(module, args, output):
            mb = counter.count[chunk]
            outs = _tensors(output)
            if not outs:
                return None
            self._record("forward", path, layer, mb, outs, inputs=digest(_tensors(args)))
            if outs[0].requires_grad:
                def on_grad(grad: torch.Tensor) -> None:
                    self._record("backward", path, layer, mb, [grad])
                outs[0].register_hook(on_grad)
            return None
        return hook

    def _step(self, step_fn):
        def traced_step(*args, **kwargs):
            params = list(logical_parameters(self.chunks))
            for path, layer, p in params:
                grad = getattr(p, "main_grad", None)  # Megatron's DDP accumulates into main_grad
                grad = p.grad if grad is None else grad
                if grad is not None:
                    self._record("grad", path, layer, -1, [grad])
            out = step_fn(*args, **kwargs)
            for path, layer, p in params:  # tp_dim: the dimension tensor parallelism splits it along (gathering)
                tp_dim = int(getattr(p, "partition_dim")) if getattr(p, "tensor_model_parallel", False) else None
                self._record("update", path, layer, -1, [p.data], tp_dim=tp_dim)
            return out
        return traced_step

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / records_file(self.world.rank), "w", encoding="utf-8") as f:
            for rec in self.records:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        torch.save(self.kept, self.out_dir / tensors_file(self.world.rank))
        log.info("traced step %d: %d records, %d kept (%.1f MiB) in %s", self.step, len(self.records), len(self.kept),
                 self.kept_bytes / 2**20, self.out_dir)

