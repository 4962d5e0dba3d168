"""The CPU backend: every CPU-specific adaptation of Megatron-Core lives in this one module.

Megatron-Core 0.19.2 is written for CUDA. Its model code runs on CPU (``use_cpu_initialization``)
except in two places that move tensors to ``torch.cuda.current_device()`` unconditionally; its
training machinery (DDP, distributed optimizer, pipeline schedules, clip_grad, dist_checkpointing)
calls CUDA throughout. On CPU this module therefore:

1. patches, per model instance, RoPE's ``get_emb`` and the MoE router's ``gating`` so they keep
   their tensors where they are (same computation, no ``.to(cuda)``);
2. trains with ``torch.optim.AdamW`` over Megatron's parameter groups (no weight decay on biases
   and 1-D parameters such as norms: MCore's ``get_standard_config_overrides``), stepped by MCore's
   ``OptimizerParamScheduler`` like the GPU backend;
3. accumulates gradients over micro-batches itself, with the loss scaled exactly as MCore's
   schedule scales it (1/tokens, 1/micro-batches; the MoE aux-loss scale likewise);
4. averages gradients over data-parallel ranks with one gloo all-reduce of a flat buffer (MCore
   DDP: scale by 1/dp, then sum), for torchrun with several CPU processes;
5. clips gradients with torch (same coefficient as MCore's clip_grad_norm_fp32);
6. checkpoints with ``torch.save`` of plain state dicts: rank 0 writes model, optimizer and
   scheduler; every rank writes its RNG states, then records the checksums of what it wrote
   (synchronously: on the training path, D36).

Supported on CPU: data parallelism only, fp32, no recomputation (MCore's recompute checkpointing
saves CUDA RNG states). Anything else is an error naming the key, never a silent downgrade.
"""

from __future__ import annotations

import os
import random
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from megatron.core.transformer.moe.router import Router, router_gating_linear

from mcx.errors import InputError, SpecError
from mcx.weights import checksums
from mcx.train import model as model_lib
from mcx.train.backend import Batch, StepOutput, current_lr, make_scheduler, masked_loss
from mcx.contract.job import InitFrom, Job
from mcx.train.routing import tap_routers
from mcx.train.runtime import World, seed_everything
from mcx.weights.canonical import check_fits, is_extra_state
from mcx.weights.checkpoint_files import STATE_FILE


def check_cpu_job(job: Job) -> None:
    lay, t = job.layout, job.spec.train
    problems = []
    for key, value in (("parallel.tensor", lay.tp), ("parallel.pipeline", lay.pp),
                       ("parallel.context", lay.cp), ("parallel.expert", lay.ep)):
        if value != 1:
            problems.append((key, f"{value} needs the CUDA backend; the CPU backend runs data parallelism only (use 1)"))
    if lay.vpp not in (None, 1):
        problems.append(("parallel.virtual_pipeline", "needs the CUDA backend; unset it for CPU runs"))
    if t.precision != "fp32":
        problems.append(("train.precision", f"\"{t.precision}\" needs a GPU; set train.precision = \"fp32\" for CPU runs"))
    if t.recompute_granularity != "none":
        problems.append(("train.recompute_granularity", "needs the CUDA backend; set it to \"none\" for CPU runs"))
    if t.cuda_graphs:
        problems.append(("train.cuda_graphs", "needs the CUDA backend; set it to false for CPU runs"))
    if problems:
        raise SpecError(problems)


# -- 1. model adaptations ----------------------------------------------------------------------

def _rope_get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """RotaryEmbedding.get_emb without the unconditional move of inv_freq to CUDA."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]


def _router_gating(self, input: torch.Tensor) -> torch.Tensor:
    """Router.gating without the unconditional move of the router weights to CUDA."""
    dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
    return router_gating_linear(input, self.weight, self.bias, dtype)


def adapt_model(model: torch.nn.Module) -> list[str]:
    """Apply the per-instance CPU patches; returns what was patched (for the log)."""
    patched = []
    for name, module in model.named_modules():
        if isinstance(module, RotaryEmbedding):
            module.get_emb = types.MethodType(_rope_get_emb, module)
            patched.append(f"{name}.get_emb")
        elif isinstance(module, Router):
            module.gating = types.MethodType(_router_gating, module)
            patched.append(f"{name}.gating")
    return patched


# -- 2. optimizer ---------------------------------------------------------------------------------

def param_groups(model: torch.nn.Module, spec) -> list[dict[str, Any]]:
    """MCore's groups: default first, then wd_mult = 0 for biases and 1-D parameters."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim == 1 or name.endswith(".bias") else decay).append(p)
    common = {"lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
              "max_lr": spec.train.lr, "min_lr": spec.train.min_lr}
    groups = [{"params": decay, "wd_mult": 1.0, "default_config": True, **common}]
    if no_decay:
        groups.append({"params": no_decay, "wd_mult": 0.0, "default_config": True, **common})
    return groups


# -- 6. RNG state ---------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))


def _save_file(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CpuBackend:
    device = "cpu"
    layer_spec = "local"

    def __init__(self, job: Job, world: World, vocab_size: int) -> None:
        check_cpu_job(job)
        spec = job.spec
        self.job, self.world, self.spec = job, world, spec
        seed_everything(spec.train.seed)  # Megatron's _set_random_seed (one pipeline stage on CPU)
        self.config = model_lib.transformer_config(spec, job.layout, "cpu", "local")
        padded = model_lib.padded_vocab_size(vocab_size, spec.model.make_vocab_size_divisible_by, job.layout.tp)
        self.vocab_size, self.padded_vocab = vocab_size, padded
        self.model = model_lib.build_model_chunk(spec, self.config, model_lib.gpt_layer_spec(spec, "local"), padded)
        self.patched = adapt_model(self.model)
        self.router_tap = tap_routers([self.model], job)
        if world.size > 1:  # identical start on every data-parallel rank
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        t = spec.train
        self.optimizer = torch.optim.AdamW(param_groups(self.model, spec), lr=t.lr, betas=(t.adam_beta1, t.adam_beta2),
                                           eps=t.adam_eps, weight_decay=t.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, spec)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.details = {**model_lib.describe(self.config, "local", padded), "cpu_patches": sorted(
            {p.rsplit(".", 1)[-1] for p in self.patched})}

    # -- training ---------------------------------------------------------------------------------

    def _forward(self, mb: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.model(mb["tokens"], mb["position_ids"], mb.get("attention_mask"), labels=mb["labels"])
        return masked_loss(output, mb["loss_mask"])

    def train_step(self, microbatches: list[Batch]) -> StepOutput:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n = len(microbatches)
        if self.config.num_moe_experts:
            MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1) / n)
        total = torch.zeros(2, dtype=torch.float64)
        for mb in microbatches:
            loss_sum, tokens = self._forward(mb)
            (loss_sum / torch.clamp(tokens, min=1) / n).backward()
            total += torch.stack([loss_sum.detach().double(), tokens.double()])
        self._allreduce_grads()
        global_loss, global_tokens = self.world.sum(total.tolist())
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if self.spec.train.clip_grad > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.spec.train.clip_grad, grad_norm)
        lr = current_lr(self.optimizer)
        self.optimizer.step()
        self.scheduler.step(increment=1)
        routing = self.router_tap.read(self.world, n) if self.router_tap is not None else None
        return StepOutput(loss=global_loss / max(global_tokens, 1.0), grad_norm=float(grad_norm), lr=lr,
                          tokens=int(global_tokens), routing=routing)

    def _allreduce_grads(self) -> None:
        if self.world.size == 1:
            return
        grads = [p.grad for p in self.params]
        flat = torch._utils._flatten_dense_tensors(grads)
        flat.mul_(1.0 / self.world.size)
        dist.all_reduce(flat)
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    @torch.no_grad()
    def evaluate(self, microbatches: list[Batch]) -> tuple[float, int]:
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64)
        for mb in microbatches:
            loss_sum, tokens = self._forward(mb)
            total += torch.stack([loss_sum.double(), tokens.double()])
        self.model.train()
        global_loss, global_tokens = self.world.sum(total.tolist())
        return global_loss, int(global_tokens)

    # -- checkpoints ------------------------------------------------------------------------------

    def save(self, directory: Path, on_done) -> None:
        written = [directory / f"rng_rank{self.world.rank}.pt"]
        if self.world.is_main:
            written.insert(0, directory / STATE_FILE)
            _save_file({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict()}, written[0])
        _save_file(rng_state(), written[-1])
        checksums.record(directory, self.world.rank, written)
        self.world.barrier()
        on_done()
        self.world.barrier()

    def load(self, directory: Path) -> None:
        state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        # MCore's scheduler load *adds* the saved step count: load into a new one.
        self.scheduler = make_scheduler(self.optimizer, self.spec)
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(torch.load(directory / f"rng_rank{self.world.rank}.pt", weights_only=True))

    @torch.no_grad()
    def start_from(self, init: InitFrom, step: int) -> None:
        """The source's weights (warmstart.py), its optimizer state with ``init.load_optimizer``, and the
        schedule advanced to ``step`` (0 with ``init.reset_step``)."""
        from mcx.train import warmstart

        own = self.model.state_dict()
        weights = warmstart.canonical_weights(init, self.padded_vocab, self.vocab_size)
        check_fits(weights, {k: tuple(v.shape) for k, v in own.items() if isinstance(v, torch.Tensor)}, init.path)
        for name, tensor in own.items():  # one source tensor read at a time
            if not is_extra_state(name):
                tensor.copy_(weights[name])
        if init.load_optimizer:
            if init.format != "torch":
                raise InputError(f"init.load_optimizer: the CPU backend reads optimizer state from a CPU run's "
                                 f"checkpoint only, and {init.path} is a {init.format} checkpoint;",
                                 "set init.load_optimizer = false (the weights still load).")
            state = torch.load(Path(init.path) / STATE_FILE, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
        if step:
            self.scheduler.step(increment=step)

    def finalize_saves(self, blocking: bool) -> None:
        """Saves are synchronous on CPU."""

    def prepare_saves(self, scratch: Path) -> None:
        """Nothing to prepare: saves are synchronous on CPU."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything a resume restores, flat and named (for the save/load round-trip check)."""
        out = {f"model/{k}": v for k, v in self.model.state_dict().items() if isinstance(v, torch.Tensor)}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, st in self.optimizer.state.items():
            for key, value in st.items():
                out[f"optimizer/{names[id(p)]}/{key}"] = value if isinstance(value, torch.Tensor) else torch.tensor(value)
        for i, group in enumerate(self.optimizer.param_groups):
            out[f"optimizer/group{i}/lr"] = torch.tensor(group["lr"], dtype=torch.float64)
            out[f"optimizer/group{i}/weight_decay"] = torch.tensor(group["weight_decay"], dtype=torch.float64)
        out["scheduler/num_steps"] = torch.tensor(self.scheduler.num_steps)
        return out

    def peak_memory_bytes(self) -> int:
        """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def close(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
