"""One stage, end to end: job.json in, metrics.jsonl + checkpoints/ + result.json + worker.log out.

``train_stage`` is the in-process entry (the local launcher and the tests call it); ``python -m
mcx.train STAGE_DIR`` wraps it and exits with ``result["exit_code"]``. Every rank runs it; rank 0
writes metrics.jsonl and result.json, all ranks log to worker.log (ranks other than 0 at WARNING), and
each node's local rank 0 samples system metrics into system.jsonl (mcx.train.system_metrics).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import traceback
import warnings
from pathlib import Path
from typing import Any

from mcx.contract.files import CACHE_DIR, METRICS_FILE
from mcx.contract.job import Job, dataset_dir, read_job
from mcx.contract.status import Status
from mcx.errors import DataError, McxError, SpecError
from mcx.eval.steps import every_steps
from mcx.launch import preflight
from mcx.metrics.summary import summarize_file
from mcx.plan.gpus import gpu_from_name, mfu_peak_flops
from mcx.plan.memory import ALLOCATOR_ENV, ALLOCATOR_VALUE, OOM_TEXTS, allocator_items
from mcx.train.console import make_progress
from mcx.train.metrics import MetricsFile
from mcx.train.rankfiles import RankFiles
from mcx.train.result_writer import make_result, write_result
from mcx.train.worklog import start_logging, stop_logging

log = logging.getLogger("mcx.train")


def _rank() -> int:
    for name in ("RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _import_worker(device: str) -> None:
    """Import torch and Megatron-Core without their import-time chatter (warnings about optional
    packages the worker does not use: apex, absl, TE on CPU; torch's CUDA_HOME notice)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    modules = ["mcx.train.runtime", "mcx.train.loop", "mcx.train.smoke", "mcx.train.datasets",
               "mcx.train.cpu", "megatron.core.models.mimo.model.base"]  # mimo: imported by get_megatron_optimizer
    if device == "cuda":
        modules.append("mcx.train.gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in modules:
            importlib.import_module(name)


def check_node(job: Job) -> None:
    """What this node lacks for the job (Transformer Engine, the dataset, a writable checkpoint directory),
    before the slow imports: a job on a cluster fails in its first seconds, naming the key and the fix."""
    where = f"on {socket.gethostname()}"
    problems = [p for key, path, prefix in job.spec.data.datasets().values()
                for p in preflight.prepared_dataset(dataset_dir(job.spec.data, Path(job.data_dir), path), prefix,
                                                    path, key)]
    problems += preflight.writable(Path(job.checkpoint_dir), "checkpoint.dir")
    if job.device == "cuda":
        problems += preflight.transformer_engine(job.spec, cp=job.layout.cp, sequence_parallel=job.layout.sequence_parallel,
                                            where=where)
    if problems:
        raise SpecError(problems, f"the {job.stage} stage's job {where}")


def make_backend(job: Job, world, vocab_size: int, stage_dir: Path):
    if job.device == "cuda":
        from mcx.train.gpu import GpuBackend

        return GpuBackend(job, world, vocab_size, stage_dir)
    from mcx.train.cpu import CpuBackend

    return CpuBackend(job, world, vocab_size)


def _vocab_size(job: Job, tokenizer_vocab: int) -> int:
    wanted = job.spec.model.vocab_size
    if wanted is None:
        return tokenizer_vocab
    if wanted < tokenizer_vocab:
        raise DataError(f"model.vocab_size = {wanted} is smaller than the dataset tokenizer's vocabulary ({tokenizer_vocab});",
                        "remove model.vocab_size to use the tokenizer's, or raise it.")
    return wanted


def _peak_flops(job: Job) -> tuple[float | None, str | None]:
    if job.device != "cuda":
        return None, None
    import torch

    name = torch.cuda.get_device_name()
    gpu = gpu_from_name(name)
    return (mfu_peak_flops(gpu) if gpu else None), name


def _train(job: Job, world, stage_dir: Path, stop, sampler=None) -> dict[str, Any]:
    from mcx.train import smoke
    from mcx.train.batch_hash import BatchHashes
    from mcx.train.datasets import datasets_from_spec
    from mcx.train.loop import Trainer
    from mcx.train.profiler import StepProfiler
    data = datasets_from_spec(job.spec, Path(job.data_dir), stage_dir / CACHE_DIR,
                              train_samples_limit=job.train_samples_limit)
    vocab = _vocab_size(job, data.tokenizer.vocab_size)
    backend = make_backend(job, world, vocab, stage_dir)
    if world.is_main:  # what runs, for runs that end before result.json (benchmarks stop the worker)
        log.info("built: %s", json.dumps(backend.details, sort_keys=True, default=str))
    peak, gpu_name = _peak_flops(job)
    metrics = MetricsFile(stage_dir / METRICS_FILE, enabled=world.is_main)
    progress = make_progress(job.output, world.is_main)
    is_smoke = job.stage == "smoke"
    rank_files = RankFiles(stage_dir, world.rank, world.local_rank)
    profiler = StepProfiler(job.profile, stage_dir, rank=world.rank, device=job.device,
                            label=f"run {job.run_id}, {job.stage} stage")
    batch_hashes = BatchHashes(stage_dir, world.dp_rank) if world.records_batches else None
    trainer = Trainer(job, world, backend, data, stage_dir, metrics, progress,
                      padded_vocab=backend.details["padded_vocab_size"], peak_flops=peak,
                      pinned_steps={smoke.resume_check_step(job)} if is_smoke else
                      set(every_steps(job.spec.eval.every, job.spec.train.train_iters)), rank_files=rank_files,
                      profiler=profiler, batch_hashes=batch_hashes)
    if sampler is not None:
        sampler.step_of = lambda: trainer.step
    try:
        outcome = trainer.run(stop)
    finally:
        profiler.close()
        progress.close()
        metrics.close()
        rank_files.close()
        if batch_hashes is not None:
            batch_hashes.close()
    world.barrier()
    missed = profiler.missed()
    if missed and world.is_main:
        log.warning("%s", missed)
        outcome.warnings.append(missed)
    train_records = metrics.history("train")
    checks: dict[str, Any] = {}
    status, error = outcome.status, outcome.error
    if is_smoke and status == Status.FINISHED:
        def replay(fresh, directory, n):
            fresh.load(directory)
            meta = trainer.store.read_meta(directory)
            it = trainer.batches(data.train, int(meta["consumed_samples"]))
            return [fresh.train_step(trainer.take(it, trainer.num_micro, "training")).loss for _ in range(n)]

        checks = smoke.run_checks(job, world, train_records, backend,
                                  lambda: make_backend(job, world, vocab, stage_dir), trainer.store.path(outcome.step),
                                  trainer.store.path(smoke.resume_check_step(job)), replay, trainer.problems)
        failed = [f"{name}: {c['detail']}" for name, c in checks.items() if not c["passed"]]
        if failed:
            status, error = Status.FAILED, "smoke check failed: " + "; ".join(failed)
        if world.is_main:
            trainer.store.prune()
            trainer.store.settle()
        world.barrier()
    details = {**backend.details, "device": job.device, "gpu_name": gpu_name, "world_size": world.size,
               "num_microbatches": trainer.num_micro, "consumed_samples": outcome.consumed_samples,
               "stop_signal": stop.signal}
    if data.components:  # the realised mixture: what Megatron's blend drew for the samples trained on (D60)
        drawn = data.drawn(outcome.consumed_samples)
        details["mixture"] = {c.name: {"requested": c.share, "samples": drawn[c.name],
                                       "share": drawn[c.name] / max(1, outcome.consumed_samples)}
                              for c in data.components}
    backend.close()
    return make_result(status=status, passed=status == Status.FINISHED, checks=checks,
                       final=summarize_file(stage_dir / METRICS_FILE) if world.is_main else {}, error=error,
                       steps=outcome.step, layer_spec=backend.layer_spec, details=details, warnings=outcome.warnings)


def out_of_memory(exc: BaseException, device: str) -> dict[str, Any] | None:
    """For an out-of-memory crash (CUDA's, or the host allocator's), what the allocator held when it
    was raised: the failing frames still hold their tensors here. None for any other exception."""
    text = str(exc)
    if type(exc).__name__ != "OutOfMemoryError" and not any(t in text.lower() for t in OOM_TEXTS):
        return None
    facts: dict[str, Any] = {"device": device, "message": text.strip().splitlines()[0][:400] if text.strip() else ""}
    import torch

    if device == "cuda" and torch.cuda.is_initialized():
        facts.update(allocated_bytes=torch.cuda.memory_allocated(), reserved_bytes=torch.cuda.memory_reserved(),
                     peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                     capacity_bytes=torch.cuda.mem_get_info()[1],
                     expandable_segments=ALLOCATOR_VALUE in allocator_items(os.environ.get(ALLOCATOR_ENV)))
    return facts


def train_stage(stage_dir: Path | str) -> dict[str, Any]:
    """Run the stage in ``stage_dir`` in this process; returns (and, on rank 0, writes) the result."""
    stage_dir = Path(stage_dir).resolve()
    rank = _rank()
    handler = start_logging(stage_dir, rank)
    job: Job | None = None
    in_group = False  # a rank that fails before the process group forms writes its own result (below)
    try:
        job = read_job(stage_dir)
        log.info("stage %s of run %s on %s", job.stage, job.run_id, job.device)
        check_node(job)
        _import_worker(job.device)
        if job.device == "cuda":  # the checkpoint writer starts up while the rest does (D31)
            from mcx.train import writer

            writer.start(rank, persistent=job.spec.checkpoint.async_save)
        from mcx.train.loop import StopFlag
        from mcx.train.runtime import distributed
        from mcx.train.system_metrics import system_metrics

        with StopFlag() as stop, distributed(job) as world, \
                system_metrics(stage_dir, job.spec.tracking.system_metrics_interval_s, job.device) as sampler:
            in_group = True
            result = _train(job, world, stage_dir, stop, sampler)
    except McxError as exc:
        log.error("%s", exc)
        result = make_result(status=Status.FAILED, passed=False, error=str(exc), exit_code=exc.exit_code)
    except Exception as exc:  # a crash: record it, the control plane reports it (and advises on memory)
        log.error("worker crashed:\n%s", traceback.format_exc())
        result = make_result(status=Status.FAILED, passed=False, error=f"{type(exc).__name__}: {exc}", exit_code=1,
                             out_of_memory=out_of_memory(exc, job.device if job else "cpu"))
    finally:
        stop_logging(handler)
    # Rank 0 writes the result. A rank that refused its node (or crashed) before the group formed writes
    # it too: the launcher stops rank 0 as soon as that rank exits, perhaps before rank 0 could write.
    if rank == 0 or (not in_group and result["status"] == Status.FAILED):
        write_result(stage_dir, result)
    return result
