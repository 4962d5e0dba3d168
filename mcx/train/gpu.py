"""The CUDA backend: Megatron-Core's own training machinery, wired as Megatron-LM's training.py does.

* parallel state (tp, pp, vpp, cp, ep, dp) comes from runtime.distributed; one GPTModel per virtual
  pipeline chunk, ``Float16Module`` for bf16/fp16, each chunk in MCore ``DistributedDataParallel``
  (grads reduced in fp32 unless ``train.grad_reduce_in_bf16``; overlapped reduce / param gather;
  distributed optimizer);
* ``get_megatron_optimizer`` (Adam with Megatron's weight-decay groups, fp32 main params, dynamic
  loss scaling for fp16, grad clipping) and MCore's ``OptimizerParamScheduler`` (shared with CPU);
* ``get_forward_backward_func``: no pipelining, 1F1B, or interleaved 1F1B with virtual stages;
* ``dist_checkpointing`` (torch_dist format, fully parallel save over DP) of model + optimizer +
  scheduler + every rank's RNG states (Python, NumPy, torch, CUDA and MCore's CUDA RNG tracker);
  async saves go through MCore's ``AsyncCallsQueue`` with a persistent writer process and a save
  plan cached after the first save (D19), and are committed when every rank has written; each rank's
  files are checksummed right after their write, in the writer for async saves (D36);
* FP8 (Transformer Engine spec only), recompute and deterministic mode are TransformerConfig fields
  (model.py); the deterministic environment is set in runtime.py before CUDA starts;
* ``train.cuda_graphs`` (D75): Megatron-Core's full-iteration graph (``FullCudaGraphWrapper``) around the
  training schedule: the first ``GRAPH_WARMUP_STEPS`` steps eager, the next one captured (and run once by a
  replay), every later one replayed; graph-safe RNG states, DDP built on the capture stream, evaluation and the
  optimizer step eager.

Megatron-LM details kept: forward pre-hooks (overlapped param all-gather) are off for the first
step and during evaluation, params are force-synced before a checkpoint, the scheduler steps only
after a successful update (fp16 skips), and the loss is averaged over tokens of the global batch.
"""

from __future__ import annotations

import logging
import os
import random
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
from megatron.core.dist_checkpointing.strategies.torch import HAVE_NVRX, TorchDistSaveShardedStrategy
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader, get_shared_capture_stream
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import convert_cuda_rng_state
from megatron.core.transformer.module import Float16Module
from megatron.core.utils import get_batch_on_this_cp_rank, unwrap_model

from mcx.errors import InputError
from mcx.plan.fusions import GRAPH_WARMUP_STEPS
from mcx.plan.memory import ALLOCATOR_ENV
from mcx.train import model as model_lib
from mcx.train import writer
from mcx.train.backend import Batch, StepOutput, current_lr, make_scheduler, masked_loss
from mcx.contract.job import InitFrom, Job
from mcx.train.routing import tap_routers
from mcx.train.runtime import World, seed_everything

log = logging.getLogger("mcx.train")

_SHARDING = "dp_reshardable"  # Megatron-LM's distributed-optimizer checkpoint format (MCore >= 0.14)
_TE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


@contextmanager
def _own_te_extra_state():
    """Let Transformer Engine read the FP8 delayed-scaling state of a checkpoint this worker's stage wrote.

    TE >= 2.20 refuses to unpickle a module's ``_extra_state`` (the amax histories and scales of delayed
    scaling, mcx's FP8 recipe) unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1, since a pickle from an
    untrusted checkpoint can run code. The worker loads only checkpoints of its own stage directory,
    written by an mcx worker of the same run ID (the smoke stage's round trip, a resume), so it allows
    it for the load and for nothing else (D25).
    """
    before = os.environ.get(_TE_PICKLE_ENV)
    os.environ[_TE_PICKLE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_TE_PICKLE_ENV, None)
        else:
            os.environ[_TE_PICKLE_ENV] = before


def reset_graphs() -> None:
    """Forget Megatron-Core's full-iteration graph, its captured outputs and its static input buffers.

    They are class-level state in 0.19.2: one graphed model a process. A backend built after another (the smoke
    check's fresh model) or reloaded from a checkpoint (its RNG generators are new objects, which a captured
    graph would not advance) starts again from eager steps and captures its own."""
    FullCudaGraphWrapper(None).reset_cuda_graph()
    StaticBufferLoader.static_buffers = {"training": [], "validation": []}


def save_strategy() -> FullyParallelSaveStrategyWrapper:
    """Megatron-LM's --ckpt-format torch_dist --ckpt-fully-parallel-save --ckpt-assume-constant-structure:
    each DP rank writes its share, and the plan and metadata of the first save are reused (D19)."""
    return FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy("torch_dist", 1, cached_metadata=True),
        parallel_state.get_data_parallel_group(with_context_parallel=True), do_cache_distribution=True)


class GpuBackend:
    device = "cuda"

    def __init__(self, job: Job, world: World, vocab_size: int, stage_dir: Path) -> None:
        spec, lay, t = job.spec, job.layout, job.spec.train
        self.job, self.world, self.spec = job, world, spec
        self.layer_spec = model_lib.choose_layer_spec(spec, lay, "cuda")
        # A locate replay's hooks and an output fault's must run on every step: a replayed graph runs none (D75).
        self.graphed = t.cuda_graphs and job.trace is None and spec.debug.perturb_output is None
        self.config = model_lib.transformer_config(spec, lay, "cuda", self.layer_spec)
        padded = model_lib.padded_vocab_size(vocab_size, spec.model.make_vocab_size_divisible_by, lay.tp)
        self.vocab_size, self.padded_vocab = vocab_size, padded
        # Megatron's _set_random_seed: a different seed per pipeline stage, then MCore's CUDA RNG tracker.
        seed = t.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
        seed_everything(seed)
        # Graph-safe states (generators a graph advances on replay) start from the same seeds, so they draw what
        # the eager tracker draws.
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True, use_cudagraphable_rng=self.graphed)
        if self.graphed:
            reset_graphs()
        layer_spec = model_lib.gpt_layer_spec(spec, self.layer_spec)
        model_lib.compiled_rope(spec, self.layer_spec)
        chunks = []
        vpp = lay.virtual_stages
        for i in range(vpp or 1):
            vp_stage = i if vpp else None
            chunk = model_lib.build_model_chunk(
                spec, self.config, layer_spec, padded,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                vp_stage=vp_stage)
            for p in chunk.parameters():
                tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
            chunk.cuda(torch.cuda.current_device())
            if self.config.fp16 or self.config.bf16:
                chunk = Float16Module(self.config, chunk)
            chunks.append(chunk)
        par = spec.parallel
        dist_opt = par.distributed_optimizer
        overlap_grad_reduce = par.overlap_grad_reduce and not self.graphed  # one GPU: nothing to overlap
        self.overlap_param_gather = par.overlap_param_gather and dist_opt and not self.graphed
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=not t.grad_reduce_in_bf16,
            overlap_grad_reduce=overlap_grad_reduce,
            overlap_param_gather=self.overlap_param_gather,
            use_distributed_optimizer=dist_opt,
            check_for_nan_in_grad=False,  # the divergence guard reports NaN/Inf (as "diverged", not a crash)
            bucket_size=max(40_000_000, 1_000_000 * parallel_state.get_data_parallel_world_size(with_context_parallel=True))
            if overlap_grad_reduce else None,
        )
        # DDP keeps each parameter's gradient-accumulation node, bound to the stream it was made on; a graph can
        # capture them only if that is the capture stream (Megatron-LM's train() builds DDP on it likewise).
        stream = get_shared_capture_stream() if self.graphed else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.model = [DistributedDataParallel(self.config, ddp_config, chunk, disable_bucketing=i > 0)
                          for i, chunk in enumerate(chunks)]
        torch.cuda.current_stream().wait_stream(stream)
        self.router_tap = tap_routers(self.model, job)
        self.optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=t.adam_eps, clip_grad=t.clip_grad,
            bf16=self.config.bf16, fp16=self.config.fp16, params_dtype=self.config.params_dtype,
            use_distributed_optimizer=dist_opt, overlap_param_gather=self.overlap_param_gather,
            # Megatron-LM's fp16 dynamic loss scaling defaults.
            initial_loss_scale=2.0 ** 32, min_loss_scale=1.0, loss_scale_window=1000, hysteresis=2,
        ), self.model)
        self.scheduler = make_scheduler(self.optimizer, spec)
        # What Megatron-LM's train() sets on the config for the schedules.
        cfg = self.config
        cfg.grad_scale_func = self.optimizer.scale_loss
        if overlap_grad_reduce:
            syncs = [m.no_sync for m in self.model]
            cfg.no_sync_func = syncs[0] if len(syncs) == 1 else syncs
            # Megatron-LM's default --align-grad-reduce: launch each chunk's reduce at the same
            # point across pipeline stages.
            grad_syncs = [m.start_grad_sync for m in self.model]
            cfg.grad_sync_func = grad_syncs[0] if len(grad_syncs) == 1 else grad_syncs
        self._param_sync_func = None
        if self.overlap_param_gather:
            # Off until the first step has run (training.py: errors in checkpoint loading or init
            # must not be all-gathered); cfg.param_sync_func stays None (align_param_gather off).
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=False)
        self._pre_hook_enabled = False
        cfg.finalize_model_grads_func = finalize_model_grads
        self.forward_backward = get_forward_backward_func()
        self.train_forward_backward = FullCudaGraphWrapper(
            self.forward_backward, cuda_graph_warmup_steps=GRAPH_WARMUP_STEPS, use_single_mempool=True) \
            if self.graphed else self.forward_backward
        # Megatron-LM's --async-save --use-persistent-ckpt-worker --ckpt-assume-constant-structure: one
        # long-lived writer process, and one save strategy whose plan and metadata are computed at the
        # first save and reused (the state dict's structure does not change within a run).
        self.async_queue = AsyncCallsQueue(persistent=True) if spec.checkpoint.async_save else None
        writer.start(world.rank, persistent=self.async_queue is not None)  # the stage started it already (D31)
        self._save_strategy = save_strategy()
        self._saves = 0
        self._rehearsal: int | None = None  # the async call index of prepare_saves' request
        self._stage_dir = stage_dir  # the persistent writer logs each save's timing to its worker.log
        self.details = {**model_lib.describe(self.config, self.layer_spec, padded),
                        "distributed_optimizer": dist_opt, "precision": t.precision,
                        "allocator": os.environ.get(ALLOCATOR_ENV) or "default",
                        "deterministic": t.deterministic, "cuda_graphs": "full_iteration" if self.graphed else "off",
                        "pipeline_schedule": (
                            "interleaved_1f1b" if vpp else "1f1b" if lay.pp > 1 else "no_pipelining")}

    # -- forward / loss ---------------------------------------------------------------------------

    @staticmethod
    def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
        loss, num_tokens = masked_loss(output_tensor, loss_mask)
        report = torch.cat([loss.clone().detach().view(1), num_tokens.view(1).float()])
        return loss, num_tokens, {"lm loss": report}

    @staticmethod
    def _on_device(microbatches: list[Batch]) -> list[dict[str, Any]]:
        """Every micro-batch of a step copied to the GPU up front, from pinned host memory, without waiting.

        A copy from pageable memory blocks the host until the stream has drained up to it, so copying each
        micro-batch as its forward starts kept the host from running ahead of the GPU (issue 41). Pinned
        copies (torch's caching host allocator keeps a buffer until its copy has run) are asynchronous; the
        values are the same bytes. A plain dict: Megatron's context-parallel split (untyped) takes one."""
        return [{k: (v.pin_memory().cuda(non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in mb.items()}
                for mb in microbatches]

    def _forward_step(self, data_iterator, model):
        batch: dict[str, Any] = next(data_iterator)
        if self.job.layout.cp > 1:
            batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                              cp_group=parallel_state.get_context_parallel_group())
        output = model(batch["tokens"], batch["position_ids"], batch.get("attention_mask"), labels=batch["labels"])
        return output, partial(self._loss_func, batch["loss_mask"])

    def _run(self, microbatches: list[Batch], forward_only: bool) -> tuple[float, int]:
        n_chunks = len(self.model)
        staged = self._on_device(microbatches)
        iterators = [iter(staged) for _ in range(n_chunks)]
        seq = self.spec.model.seq_length
        schedule = self.forward_backward if forward_only else self.train_forward_backward
        capture = self.graphed and not forward_only and \
            FullCudaGraphWrapper.curr_iteration["training"] == GRAPH_WARMUP_STEPS
        t0 = time.perf_counter()
        # A replayed graph's losses are its captured output tensors, rewritten by each replay: read below, before
        # the next step.
        losses = schedule(
            forward_step_func=self._forward_step,
            data_iterator=iterators if n_chunks > 1 else iterators[0],
            model=self.model, num_microbatches=len(microbatches), seq_length=seq,
            micro_batch_size=self.spec.train.micro_batch_size, decoder_seq_length=seq, forward_only=forward_only)
        if capture:
            log.info("CUDA graph captured: the step's forward and backward over %d micro-batches, in %.2f s; "
                     "%.2f GiB reserved", len(microbatches), time.perf_counter() - t0,
                     torch.cuda.memory_reserved() / 2**30)
        # Only the last pipeline stage has losses; count each (dp, cp) replica once (tp rank 0).
        contributes = parallel_state.is_pipeline_last_stage(ignore_virtual=True) and \
            parallel_state.get_tensor_model_parallel_rank() == 0
        local = torch.stack([x["lm loss"].double() for x in losses]).sum(0).tolist() if contributes and losses else [0.0, 0.0]
        loss_sum, tokens = self.world.sum(local)
        return loss_sum, int(tokens)

    # -- training ---------------------------------------------------------------------------------

    def train_step(self, microbatches: list[Batch]) -> StepOutput:
        for m in self.model:
            m.train()
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss_sum, tokens = self._run(microbatches, forward_only=False)
        lr = current_lr(self.optimizer)
        ok, grad_norm, _ = self.optimizer.step()
        ok = self.world.all(bool(ok))
        grad_norm = self.world.max([float("nan") if grad_norm is None else float(grad_norm)])[0] if ok else None
        if ok:
            self.scheduler.step(increment=1)
            if self.overlap_param_gather and not self._pre_hook_enabled:
                for m in self.model:
                    m.enable_forward_pre_hook()
                self._pre_hook_enabled = True
        routing = self.router_tap.read(self.world, len(microbatches)) if self.router_tap is not None else None
        return StepOutput(loss=loss_sum / max(tokens, 1), grad_norm=grad_norm, lr=lr, tokens=tokens, skipped=not ok,
                          routing=routing)

    def _sync_params(self) -> None:
        """Bring model params up to date with the optimizer (overlapped param gather is lazy)."""
        if self.overlap_param_gather:
            for m in self.model:
                m.start_param_sync(force_sync=True)

    @torch.no_grad()
    def evaluate(self, microbatches: list[Batch]) -> tuple[float, int]:
        if self._pre_hook_enabled:
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=True)
        for m in self.model:
            m.eval()
        try:
            return self._run(microbatches, forward_only=True)
        finally:
            for m in self.model:
                m.train()
            if self._pre_hook_enabled:
                for m in self.model:
                    m.enable_forward_pre_hook()

    # -- checkpoints ------------------------------------------------------------------------------

    def _rng_state(self) -> dict[str, Any]:
        # The tracker's states as tensors whether or not they are graph-safe generators: one checkpoint format.
        tracker = {k: convert_cuda_rng_state(v, to_graphable=False)
                   for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()}
        return {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(), "tracker": tracker}

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        random.setstate(state["random"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(
            {k: convert_cuda_rng_state(v, to_graphable=self.graphed) for k, v in state["tracker"].items()})

    def _model_sharded_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model chunks' sharded state dicts ("model", or "model0", "model1", ... with VPP) and the metadata."""
        metadata = {"distrib_optim_sharding_type": _SHARDING, "singleton_local_shards": False,
                    "chained_optim_avoid_prefix": True,
                    "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
        sd: dict[str, Any] = {}
        for i, m in enumerate(self.model):
            if len(self.model) > 1:
                parallel_state.set_virtual_pipeline_model_parallel_rank(i)
            sd["model" if len(self.model) == 1 else f"model{i}"] = unwrap_model(m).sharded_state_dict(metadata=metadata)
        if len(self.model) > 1:
            parallel_state.set_virtual_pipeline_model_parallel_rank(0)
        return sd, metadata

    def _sharded_state_dict(self, is_loading: bool) -> dict[str, Any]:
        sd, metadata = self._model_sharded_state_dict()
        sd["optimizer"] = self.optimizer.sharded_state_dict(sd, is_loading=is_loading, metadata=metadata)
        sd["opt_param_scheduler"] = self.scheduler.state_dict()
        # Every rank's RNG states (ranks of one DP group differ, e.g. by expert-parallel rank).
        sd["rng_state"] = ShardedObject("rng_state", self._rng_state(), (self.world.size,), (self.world.rank,),
                                        replica_id=0)
        return sd

    def save(self, directory: Path, on_done) -> None:
        t0 = time.perf_counter()
        writer.results_queue_ready()  # at once, unless the first save comes within seconds of the start
        self._sync_params()
        is_async = self.async_queue is not None
        state = self._sharded_state_dict(is_loading=False)
        t1 = time.perf_counter()
        # A synchronous save is this request executed in place, as MCore's own synchronous save does it,
        # so that both kinds record their checksums alike, right after the write (writer.checksummed).
        request = dist_checkpointing.save(
            state, str(directory), sharded_strategy=self._save_strategy,
            validate_access_integrity=self._saves == 0,  # the structure is checked once, then assumed
            async_sharded_save=True, async_strategy="nvrx" if is_async and HAVE_NVRX else "mcore",
            content_metadata={"distrib_optim_sharding_type": _SHARDING})
        t2 = time.perf_counter()
        self._saves += 1
        if isinstance(request, AsyncRequest):  # MCore's writer; nvidia-resiliency-ext's leaves them to the commit
            request = writer.checksummed(request, directory, self.world.rank)
        committing: list[float] = []  # when a synchronous save's finalization (its commit) began
        if not is_async:
            request.add_finalize_fn(lambda: committing.append(time.perf_counter()))
        request.add_finalize_fn(on_done)
        request.add_finalize_fn(self.world.barrier)
        if self.async_queue is not None:  # is_async, said so that the queue's type narrows
            if isinstance(request, AsyncRequest):
                request = writer.timed(request, self._saves, self._stage_dir, self.world.rank)
            self.async_queue.schedule_async_request(request)  # the copy to host memory; writing goes on
            phases = f"plan {t2 - t1:.2f} s, copy to host {time.perf_counter() - t2:.2f} s"
        else:
            request.execute_sync()
            sums = getattr(request.async_fn, "figures", None) or {"seconds": 0.0}
            phases = (f"plan and write {committing[0] - t1 - sums['seconds']:.2f} s, checksums {sums['seconds']:.2f} s, "
                      f"commit {time.perf_counter() - committing[0]:.2f} s")
        # Where a save's stall goes (D28): the state dict; the save plan
        # (built at the first saves, then cached), with the whole write, the checksums of this rank's files
        # and the commit when synchronous; the copy to host memory when asynchronous.
        log.info("checkpoint save %d paused training %.2f s: state dict %.2f s, %s", self._saves,
                 time.perf_counter() - t0, t1 - t0, phases)

    def prepare_saves(self, scratch: Path) -> None:
        """Rehearse the first asynchronous save's copy to host memory, in the background (D30).

        The writer's first copy creates its pinned host buffers, which grow with the state (tens of GiB
        per GPU for an 8B model); later copies find them made (D30). Once the first step has created the
        optimizer state, this plans a save of the real state dict into ``scratch`` (MCore writes only its
        small common part there, and the trainer deletes it) and hands the writer only its copy, as a
        request training does not wait for. The save plan is then cached too. (With
        nvidia-resiliency-ext, saves go through its own writer, which this does not prepare.)
        """
        if self.async_queue is None or HAVE_NVRX:
            return
        t0 = time.perf_counter()
        request = dist_checkpointing.save(
            self._sharded_state_dict(is_loading=False), str(scratch), sharded_strategy=self._save_strategy,
            validate_access_integrity=True, async_sharded_save=True, async_strategy="mcore",
            content_metadata={"distrib_optim_sharding_type": _SHARDING})
        if not isinstance(request, AsyncRequest) or request.preload_fn is None:
            return
        self._rehearsal = self.async_queue.schedule_async_request(
            writer.rehearsal(request.preload_fn, self._stage_dir, self.world.rank))
        log.info("checkpoint saves prepared in %.2f s: the writer copies the state to host memory once, "
                 "in the background", time.perf_counter() - t0)

    def finalize_saves(self, blocking: bool) -> None:
        if self.async_queue is None:
            return
        t0 = time.perf_counter()
        done = [i for i in self.async_queue.maybe_finalize_async_calls(blocking=blocking) if i != self._rehearsal]
        if done:  # an asynchronous save's second pause: its results gathered, metadata written, committed
            log.info("checkpoint save finalized: paused training %.2f s%s", time.perf_counter() - t0,
                     " (waiting for the writer)" if blocking else "")

    @torch.no_grad()  # with fp32 params the main params are the model params (leaves requiring grad)
    def load(self, directory: Path) -> None:
        self.finalize_saves(blocking=True)
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            # MCore 0.19.2 without TE/apex reads the Adam step from the inner optimizer's state while
            # building the sharded state dict, and asserts when a fresh optimizer has none. Its own
            # remedy (used for Megatron-FSDP loads): allocate the state with one zero-gradient step;
            # every value is then overwritten by the checkpoint (the round-trip check verifies it).
            if isinstance(opt, DistributedOptimizer) and len(opt.optimizer.state) == 0:
                opt._init_optimizer_states_with_dummy_values()
        sd = self._sharded_state_dict(is_loading=True)
        with _own_te_extra_state():
            loaded = dist_checkpointing.load(sd, str(directory), sharded_strategy=get_default_load_sharded_strategy(str(directory)))
            for i, m in enumerate(self.model):
                unwrap_model(m).load_state_dict(loaded["model" if len(self.model) == 1 else f"model{i}"], strict=True)
        self.optimizer.load_state_dict(loaded["optimizer"])
        self._restore_adam_steps(loaded["optimizer"])
        self.scheduler = make_scheduler(self.optimizer, self.spec)  # MCore's load adds to num_steps
        self.scheduler.load_state_dict(loaded["opt_param_scheduler"])
        self._set_rng_state(loaded["rng_state"])
        if self.graphed:
            reset_graphs()

    @torch.no_grad()
    def start_from(self, init: InitFrom, step: int) -> None:
        """A fresh stage's weights from ``init`` (warmstart.py). A distributed checkpoint of the same layer
        spec loads with dist_checkpointing (any layout; with ``init.load_optimizer`` its optimizer too);
        anything else goes through the canonical full tensors (fullstate.load_full). The optimizer's main
        params are then refreshed from the model's, and the schedule advanced to ``step``."""
        from megatron.core.dist_checkpointing.core import CheckpointingException

        loaded = None
        if init.format == "dist":
            from mcx.weights.checkpoint_files import checkpoint_dir

            try:  # a Megatron-LM save directory names its iteration
                loaded = self._load_dist_source(checkpoint_dir(Path(init.path)), init.load_optimizer)
            except (CheckpointingException, KeyError, RuntimeError) as exc:
                if init.load_optimizer:
                    raise InputError(f"init.load_optimizer: the optimizer state of {init.path} does not load into "
                                     f"this model ({type(exc).__name__}: {exc});",
                                     "set init.load_optimizer = false: the weights alone load across layer specs.") from None
                log.info("init: %s is not this layer spec's checkpoint (%s); loading its full tensors", init.path, exc)
        if loaded is None:
            from mcx.train import fullstate, warmstart

            weights = warmstart.canonical_weights(init, self.padded_vocab, self.vocab_size)
            fullstate.load_full([unwrap_model(m) for m in self.model], weights)
        self.optimizer.reload_model_params()
        if step:
            self.scheduler.step(increment=step)

    def _load_dist_source(self, directory: Path, with_optimizer: bool) -> dict[str, Any]:
        if with_optimizer:
            for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                if isinstance(opt, DistributedOptimizer) and len(opt.optimizer.state) == 0:
                    opt._init_optimizer_states_with_dummy_values()  # as in load()
            sd = {k: v for k, v in self._sharded_state_dict(is_loading=True).items()
                  if k not in ("opt_param_scheduler", "rng_state")}  # the child's own schedule and RNG
        else:
            sd = self._model_sharded_state_dict()[0]
        with _own_te_extra_state():
            loaded = dist_checkpointing.load(sd, str(directory),
                                             sharded_strategy=get_default_load_sharded_strategy(str(directory)))
            for i, m in enumerate(self.model):
                unwrap_model(m).load_state_dict(loaded["model" if len(self.model) == 1 else f"model{i}"], strict=True)
        if with_optimizer:
            self.optimizer.load_state_dict(loaded["optimizer"])
            self._restore_adam_steps(loaded["optimizer"])
        return loaded

    def _restore_adam_steps(self, loaded_optimizer: Any) -> None:
        """Give every parameter its own Adam step count, equal to the checkpoint's.

        MCore 0.19.2 with torch's Adam (no TE/apex), ``dp_reshardable`` format: the per-parameter
        ``step`` is a LocalNonpersistentObject in the parameter state, so loading copies the *fresh*
        optimizer's step back over the checkpoint's, and DistributedOptimizer.load_state_dict makes
        all parameters share one step tensor (torch's foreach Adam then adds 1 per parameter per
        step). The checkpoint's step is in the param groups; the smoke stage's round-trip and
        resume checks fail without this.
        """
        opts = list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))
        parts = [loaded_optimizer] if len(opts) == 1 else [loaded_optimizer[i] for i in range(len(opts))]
        for opt, part in zip(opts, parts):
            if not isinstance(opt, DistributedOptimizer) or not isinstance(part, dict) or "optimizer" not in part:
                continue
            steps = {g["step"] for g in part["optimizer"].get("param_groups", []) if g.get("step") is not None}
            if len(steps) != 1:
                continue
            step = float(steps.pop())
            for state in opt.optimizer.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = torch.full_like(state["step"], step)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's model shards and optimizer state (main params, moments, steps, lrs)."""
        self._sync_params()
        out: dict[str, torch.Tensor] = {}
        for i, m in enumerate(self.model):
            for k, v in unwrap_model(m).state_dict().items():
                if isinstance(v, torch.Tensor) and not k.endswith("_extra_state"):
                    out[f"model{i}/{k}"] = v.detach()
        for ci, opt in enumerate(getattr(self.optimizer, "chained_optimizers", [self.optimizer])):
            inner = opt.optimizer
            if inner is None:
                continue
            for gi, group in enumerate(inner.param_groups):
                out[f"opt{ci}/group{gi}/lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
                out[f"opt{ci}/group{gi}/weight_decay"] = torch.tensor(float(group["weight_decay"]), dtype=torch.float64)
                for pi, p in enumerate(group["params"]):
                    out[f"opt{ci}/group{gi}/param{pi}/main"] = p.detach()
                    for key, value in inner.state.get(p, {}).items():
                        if isinstance(value, torch.Tensor):
                            out[f"opt{ci}/group{gi}/param{pi}/{key}"] = value.detach()
        out["scheduler/num_steps"] = torch.tensor(self.scheduler.num_steps)
        return out

    def peak_memory_bytes(self) -> int:
        return int(torch.cuda.max_memory_allocated())

    def close(self) -> None:
        self.finalize_saves(blocking=True)
        if self.async_queue is not None:
            self.async_queue.close()  # stops the persistent writer process
        for m in self.model:
            if self._pre_hook_enabled:
                m.disable_forward_pre_hook(param_sync=False)
        if self.graphed:
            reset_graphs()
        self.model, self.optimizer = [], None
        torch.cuda.empty_cache()
