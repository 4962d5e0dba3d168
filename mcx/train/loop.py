"""The training loop, the same over both backends.

Per step: take the step's micro-batches (this data-parallel rank's share of the global batch; read on a
thread while the step before trains, mcx.train.prefetch), ``backend.train_step``, one metrics line, the divergence guard, evaluation every
``train.eval_interval`` steps, a checkpoint every ``checkpoint.interval`` steps. At the end: a
final checkpoint, a validation pass (unless the last step just ran one) and the test pass.

Resuming: when ``checkpoints/latest`` exists, model, optimizer, scheduler, RNG states, step and
consumed samples are restored from it, metrics.jsonl is cut back to that step, and the data position
follows from the consumed samples, so the resumed run continues the exact timeline. Its files are
checked against their checksums first; a damaged checkpoint is named and set aside, and the newest
intact one before it is used instead (its later steps are trained again, the same timeline), with a
warning in worker.log and result.json; none intact is an input error (checkpoint.py).

Evaluation ``k`` (at step ``k * eval_interval`` < train_iters; the final one after the last step) reads validation
samples ``[(k-1) * E * G, k * E * G)`` (E = eval_iters, G = global batch), which is where
Megatron-LM's continuing validation iterator would be, but computed from the step, so it does not
depend on where a run was resumed. The test pass reads the first ``E * G`` test samples.

Preemption: SIGTERM (or SIGUSR1, Slurm's usual pre-kill signal) sets a flag; at the next step
boundary all ranks agree on it, the current state is checkpointed, and the stage ends "preempted".

Fault injection (the spec's [debug] table, docs/spec.md): ``debug.perturb_params = {step = N, amount = A}``
adds A to every floating-point model weight just before step N, so a rerun departs from its original
exactly at step N (``mcx reproduce`` must say so); ``debug.nan_params_at_step = N`` makes them NaN
there, so the divergence guard stops the stage at step N; ``debug.perturb_output`` adds an amount to one
module's output in one micro-batch of one step (mcx.train.trace.OutputFault); ``debug.swap_micro_batches_at_step
= N`` trains micro-batches 0 and 1 of step N in swapped order on every data-parallel rank (the same samples,
another order: the batch hashes must name it, D69).

Batch hashes (mcx.train.batch_hash): each step's micro-batches are hashed on the host as they are read,
on the prefetch thread while the step before trains, and written after the step beside its metrics line.

Replay (`mcx locate`, D70): a job file with ``trace`` resumes from its checkpoint, trains up to the traced
step with nothing but the metrics line a step (no evaluation, no checkpoint), traces that step
(mcx.train.trace.Tracer) and stops.
"""

from __future__ import annotations

import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcx.contract.job import Job, num_microbatches
from mcx.contract.status import Status
from mcx.contract.trace import TRACE_DIR
from mcx.errors import DataError, InputError, TrainingFailed
from mcx.plan.flops import flops_per_iteration
from mcx.train import checkpoint as ckpt
from mcx.train import warmstart
from mcx.train.backend import Backend, Batch
from mcx.train.batch_hash import BatchHashes, batch_digests
from mcx.train.console import Progress
from mcx.train.datasets import Datasets, iterate_batches
from mcx.train.guard import DivergenceGuard, advice
from mcx.train.metrics import MetricsFile
from mcx.train.prefetch import StepPrefetch
from mcx.train.profiler import StepProfiler
from mcx.train.rankfiles import RankFiles
from mcx.train.runtime import World
from mcx.train.trace import OutputFault, Tracer

log = logging.getLogger("mcx.train")

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def save_error(exc: BaseException, root: Path, tmp: Path) -> BaseException:
    """A failed checkpoint save, said plainly: a full disk is named as such, with where and the spec key.

    The partial ``.tmp`` directory is removed (``latest`` still names the previous complete checkpoint).
    """
    import errno
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    full = (getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc)
            or (free is not None and free < 64 * 2**20))
    if not full:
        return exc
    shown = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    return TrainingFailed(f"saving the checkpoint to {root} failed: No space left on device ({shown}); the previous "
                          "checkpoint is intact;", "free space there, lower checkpoint.keep, or set checkpoint.dir "
                          "to a larger disk, then run again to resume.")


class StopFlag:
    """Records preemption signals; installed only from the main thread (signal module rule)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in PREEMPT_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class Outcome:
    status: Status  # FINISHED | PREEMPTED | DIVERGED
    step: int
    consumed_samples: int
    error: str | None = None
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)
    measured: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the stage must report though it went on


class Trainer:
    def __init__(self, job: Job, world: World, backend: Backend, data: Datasets, stage_dir: Path,
                 metrics: MetricsFile, progress: Progress, *, padded_vocab: int, peak_flops: float | None,
                 pinned_steps: AbstractSet[int] = frozenset(), rank_files: RankFiles | None = None,
                 profiler: StepProfiler | None = None, batch_hashes: BatchHashes | None = None) -> None:
        self.job, self.world, self.backend, self.data = job, world, backend, data
        self.spec = job.spec
        self.metrics, self.progress = metrics, progress
        self.rank_files = rank_files  # this rank's step times (every rank's own file)
        self.profiler = profiler  # `mcx run --profile`: the steps it names run under torch.profiler
        self.batch_hashes = batch_hashes  # its data-parallel rank's batch hashes (one writing rank of each)
        self.store = ckpt.CheckpointStore(Path(job.checkpoint_dir), job.spec.checkpoint.keep)
        self.pinned = set(pinned_steps)
        self.num_micro = num_microbatches(job)
        t = self.spec.train
        self.flops = flops_per_iteration(self.spec.model, padded_vocab=padded_vocab,
                                         global_batch_size=t.global_batch_size, seq_length=self.spec.model.seq_length)
        self.peak_flops = peak_flops
        self.saved_step: int | None = None
        self.saves_prepared = False  # the backend readied its checkpoint writer (prepare_saves)
        self.step: int | None = None  # the last step finished (the system-metrics sampler reads it, no lock)
        self.warnings: list[str] = []
        wanted = job.spec.debug.perturb_output  # hooks only where a fault or a trace asks (none otherwise)
        self.fault = OutputFault(wanted, backend.model, world, self.num_micro, t.train_iters) if wanted else None
        self.tracer = Tracer(job.trace, backend.model, backend.optimizer, world, stage_dir / TRACE_DIR) \
            if job.trace else None

    # -- data ---------------------------------------------------------------------------------------

    def batches(self, dataset, consumed: int) -> Iterator[Batch]:
        return iterate_batches(dataset, consumed, self.spec.train.micro_batch_size, self.world.dp_rank, self.job.layout.dp)

    def take(self, it: Iterator[Batch], n: int, what: str) -> list[Batch]:
        out = []
        for _ in range(n):
            try:
                out.append(next(it))
            except StopIteration:
                raise DataError(f"the {what} data ran out; the dataset is smaller than the stage needs.",
                                "use a larger dataset, or fewer train.train_iters / train.eval_iters.") from None
        return out

    # -- checkpoints --------------------------------------------------------------------------------

    def meta(self, step: int, consumed: int) -> dict[str, Any]:
        lay = self.job.layout
        return {"step": step, "consumed_samples": consumed, "run_id": self.job.run_id, "stage": self.job.stage,
                "backend": self.backend.device, "layer_spec": self.backend.layer_spec,
                "layout": {"tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp,
                           "world_size": lay.world_size}}

    def _begin(self, step: int) -> Path:
        """The staging directory of a save at ``step``, created by rank 0; every rank returns."""
        tmp = self.store.begin(step) if self.world.is_main else self.store.path(step).with_name(ckpt.iter_name(step) + ".tmp")
        self.world.barrier()
        return tmp

    def prepare_saves(self) -> None:
        """Once, after the first step of a stage that saves, unless that step saved: the backend readies
        its checkpoint writer off the training path (D30), planning in a scratch staging directory."""
        self.saves_prepared = True
        scratch = self._begin(0)
        try:
            self.backend.prepare_saves(scratch)
        finally:
            self.world.barrier()
            if self.world.is_main:
                shutil.rmtree(scratch, ignore_errors=True)

    def save(self, step: int, consumed: int) -> None:
        if self.saved_step == step:
            return
        self.saved_step = step
        self.saves_prepared = True  # a real save readies the writer as well
        tmp = self._begin(step)
        meta = self.meta(step, consumed)

        def on_done() -> None:
            if self.world.is_main:
                final = self.store.commit(tmp, meta, self.pinned)
                log.info("checkpoint %s committed", final.name)

        try:
            self.backend.save(tmp, on_done)
        except (OSError, RuntimeError) as exc:
            raise save_error(exc, self.store.root, tmp) from exc

    def problems(self, path: Path) -> list[str] | None:
        """Every rank's checks of a checkpoint's files, each rank reading its share (checkpoint.check):
        the problems found, or None for a checkpoint without checksums (format 1). Collective."""
        t0 = time.perf_counter()
        found = self.world.gather_object(self.store.check(path, self.world.rank, self.world.size))
        if any(f is None for f in found):
            return None
        out = list(dict.fromkeys(p for f in found for p in f))
        log.info("checkpoint %s checked against its checksums in %.2f s: %s", path.name, time.perf_counter() - t0,
                 "; ".join(out) or "intact")
        return out

    def _intact(self, latest: Path) -> Path:
        """The newest checkpoint, from ``latest`` back, whose files match their checksums; the damaged
        ones before it are set aside and ``latest`` names it. None intact: InputError, nothing moved."""
        damaged: dict[Path, list[str]] = {}
        for path in self.store.candidates(latest):
            found = self.problems(path)
            if found is None:
                self._warn(f"checkpoint {path.name} has no checksums (written before mcx recorded them, D36): "
                           "loaded without checking its files")
                break
            if not found:
                break
            damaged[path] = found
        else:
            raise self.store.no_intact(damaged)
        if damaged and self.world.is_main:  # set aside first, then re-point: a stop between is recovered (store.latest)
            step = int(self.store.read_meta(path)["step"])
            for bad, found in damaged.items():
                again = f"Resuming from {path.name}, the newest intact checkpoint: the steps after {step} are trained again"
                if not bad.exists():  # `latest` named a directory that is gone (D47): nothing to set aside
                    aside = sorted(bad.parent.glob(bad.name + ckpt.DAMAGED + "*"))
                    gone = f"set aside as {aside[-1].name} by an earlier resume" if aside else "missing"
                    self._warn(f"checkpoint {bad.name}, which `latest` named, is {gone}. {again}")
                    continue
                kept = self.store.set_aside(bad)
                self._warn(f"checkpoint {bad.name} is damaged ({', '.join(found)}); kept as {kept.name}. {again}")
            self.store.point(path.name)
        self.world.barrier()
        return path

    def _warn(self, message: str) -> None:
        """Said once (rank 0), in worker.log and in result.json's ``warnings``."""
        if self.world.is_main:
            log.warning("%s", message)
            self.warnings.append(message)

    def resume(self) -> tuple[int, int]:
        """(step, consumed samples) of the newest intact checkpoint, restored into the backend; (0, 0) if none."""
        if self.world.is_main:
            self.store.clean_partial()
        self.world.barrier()
        latest = self.store.latest()
        if latest is None:
            self.metrics.truncate_after(0, final=False)
            if self.rank_files is not None:
                self.rank_files.truncate_after(0)
            if self.batch_hashes is not None:
                self.batch_hashes.truncate_after(0)
            self.step = 0
            if self.job.init is None:
                return 0, 0
            step, consumed = warmstart.source_position(self.job.init)  # (0, 0) unless init.reset_step = false
            self.backend.start_from(self.job.init, step)
            self.step = step
            log.info("started from %s (%s), at step %d", self.job.init.path, self.job.init.format, step)
            return step, consumed
        latest = self._intact(latest)
        meta = self.store.read_meta(latest)
        want = self.meta(meta["step"], meta["consumed_samples"])
        for key in ("backend", "layout"):
            if meta.get(key) != want[key]:
                raise InputError(f"{latest} was written with {key} {meta.get(key)}, this stage runs {want[key]};",
                                 f"resume with the same layout; to train this stage from its first step instead, move "
                                 f"its checkpoints aside (`mv {self.store.root} {self.store.root}.old`).")
        self.backend.load(latest)
        step, consumed = int(meta["step"]), int(meta["consumed_samples"])
        self.saved_step = self.step = step
        # Evaluations at the last step run after its checkpoint: a resume there runs them again.
        self.metrics.truncate_after(step, final=step >= self.spec.train.train_iters)
        if self.rank_files is not None:
            self.rank_files.truncate_after(step)
        if self.batch_hashes is not None:
            self.batch_hashes.truncate_after(step)
        if self.world.is_main:
            self.store.discard_after(step)
        log.info("resumed from %s (step %d, %d samples consumed)", latest.name, step, consumed)
        return step, consumed

    # -- evaluation ---------------------------------------------------------------------------------

    def evaluate(self, kind: str, step: int, index: int) -> dict[str, Any] | None:
        dataset = self.data.valid if kind == "valid" else self.data.test
        iters = self.spec.train.eval_iters
        if dataset is None or iters == 0:
            return None
        start = index * iters * self.spec.train.global_batch_size
        mbs = self.take(self.batches(dataset, start), iters * self.num_micro, kind)
        loss_sum, tokens = self.backend.evaluate(mbs)
        loss = loss_sum / max(tokens, 1)
        record = {"kind": kind, "step": step, "loss": loss, "ppl": math.exp(loss) if loss < 700 else math.inf,
               "time": time.time()}
        self.metrics.append(record)
        self.progress.record(record)
        return record

    # -- the loop -----------------------------------------------------------------------------------

    def step_record(self, step: int, out, step_time: float) -> dict[str, Any]:
        t, ws = self.spec.train, self.world.size
        tokens = t.global_batch_size * self.spec.model.seq_length
        tflops = self.flops / step_time / ws / 1e12
        record = {"kind": "train", "step": step, "loss": out.loss, "grad_norm": out.grad_norm, "lr": out.lr,
               "tokens_per_s_per_gpu": tokens / step_time / ws, "tflops_per_gpu": tflops,
               "mfu": tflops * 1e12 / self.peak_flops if self.peak_flops else None,
               "mem_peak_bytes": self.backend.peak_memory_bytes(), "step_time_s": step_time, "time": time.time()}
        if out.skipped:
            record["skipped"] = True  # fp16 loss scaling skipped the update
        if out.routing is not None:  # a mixture of experts (mcx.train.routing)
            record["moe_expert_load"] = out.routing.expert_load
            if out.routing.balance_loss is not None:
                record["moe_balance_loss"] = out.routing.balance_loss
        return record

    def run(self, stop: StopFlag) -> Outcome:
        t = self.spec.train
        step, consumed = self.resume()
        guard = DivergenceGuard(t.loss_spike_factor, t.loss_spike_window,
                                [r.get("loss") for r in self.metrics.history("train")])
        outcome = Outcome(status=Status.FINISHED, step=step, consumed_samples=consumed, warnings=self.warnings)
        self.progress.start(t.train_iters, step, f"{self.job.stage} {self.job.run_id}")
        train_it = self.batches(self.data.train, consumed)
        interval = self.spec.checkpoint.interval
        faults = self.faults()
        def read_step() -> tuple[list[Batch], list[str] | None]:
            mbs = self.take(train_it, self.num_micro, "training")
            return mbs, (batch_digests(mbs) if self.batch_hashes is not None else None)

        # The next step's micro-batches are read, and hashed, while this one trains (mcx.train.prefetch).
        with StepPrefetch(read_step, t.train_iters - step) as ahead:
            while step < t.train_iters:
                if self.world.any(stop.signal is not None):
                    return self._preempt(outcome, step, consumed)
                if step + 1 in faults:
                    self._perturb(step + 1, *faults[step + 1])
                if self.profiler is not None:
                    self.profiler.begin(step + 1)
                t0 = time.perf_counter()
                mbs, digests = ahead.next()
                if step + 1 == self.spec.debug.swap_micro_batches_at_step:
                    mbs = self._swap(step + 1, mbs)
                    digests = batch_digests(mbs) if digests is not None else None  # in the order trained
                with ExitStack() as taps:
                    if self.fault is not None:
                        taps.enter_context(self.fault.armed(step + 1))
                    if self.tracer is not None and self.job.trace and step + 1 == self.job.trace.step:
                        taps.enter_context(self.tracer.traced(step + 1, mbs))
                    out = self.backend.train_step(mbs)
                step_time = time.perf_counter() - t0
                step += 1
                consumed += t.global_batch_size
                outcome.step, outcome.consumed_samples = step, consumed
                self.step = step
                record = self.step_record(step, out, step_time)
                self.metrics.append(record)
                if self.rank_files is not None:
                    self.rank_files.step(step, step_time)
                if self.batch_hashes is not None and digests is not None:
                    self.batch_hashes.record(step, digests)
                self.progress.record(record)
                outcome.measured.append(record)
                if self.job.trace is not None:  # a replay: no guard, evaluation or checkpoint; it ends at the traced step
                    if step >= self.job.trace.step:
                        return outcome
                    continue
                reason = guard.check(step, out.loss, out.grad_norm, out.skipped)
                if reason:
                    outcome.status, outcome.error = Status.DIVERGED, f"Training diverged: {reason}. {advice(self.spec)}"
                    log.error(outcome.error)
                    self._finish_saves()
                    return outcome
                self.backend.finalize_saves(blocking=False)
                if t.eval_interval > 0 and step % t.eval_interval == 0 and step < t.train_iters:
                    outcome.evals["valid"] = self.evaluate("valid", step, step // t.eval_interval - 1) or {}
                final = step == t.train_iters and self.spec.checkpoint.final
                if (interval and step % interval == 0) or step in self.pinned or final:
                    self.save(step, consumed)
                elif not self.saves_prepared and (interval or self.pinned or self.spec.checkpoint.final):
                    self.prepare_saves()
                if self.profiler is not None:
                    self.profiler.end(step)
        if self.world.any(stop.signal is not None):
            return self._preempt(outcome, step, consumed)
        if self.spec.checkpoint.final:
            self.save(step, consumed)  # no-op when the last step saved already (e.g. resumed at the end)
        # The final validation continues after the (train_iters - 1) // eval_interval in-loop ones.
        final_index = (t.train_iters - 1) // t.eval_interval if t.eval_interval > 0 else 0
        outcome.evals["valid"] = self.evaluate("valid", step, final_index) or {}
        outcome.evals["test"] = self.evaluate("test", step, 0) or {}
        outcome.evals = {k: v for k, v in outcome.evals.items() if v}
        self._finish_saves()
        return outcome

    def _finish_saves(self) -> None:
        """Every save written and committed, and the checkpoints pruned deleted."""
        self.backend.finalize_saves(blocking=True)
        self.store.settle()

    def faults(self) -> dict[int, tuple[float, str]]:
        """The [debug] table's injections: step -> (amount added to the weights, the key that asked)."""
        debug = self.spec.debug
        out: dict[int, tuple[float, str]] = {}
        if debug.perturb_params is not None:
            out[debug.perturb_params.step] = (debug.perturb_params.amount, "debug.perturb_params")
        if debug.nan_params_at_step is not None:  # NaN wins a step both name: the weights are NaN either way
            out[debug.nan_params_at_step] = (math.nan, "debug.nan_params_at_step")
        return out

    def _perturb(self, step: int, amount: float, key: str) -> None:
        """Fault injection: change the live model weights (the optimizer state is left alone)."""
        for name, tensor in self.backend.state_tensors().items():
            if name.startswith("model") and tensor.is_floating_point():
                tensor.add_(amount)
        log.warning("%s: added %g to the model weights before step %d (fault injection)", key, amount, step)

    def _swap(self, step: int, mbs: list[Batch]) -> list[Batch]:
        """Fault injection: micro-batches 0 and 1 of ``step`` trade places (the same samples, another order)."""
        if len(mbs) < 2:
            raise InputError(f"debug.swap_micro_batches_at_step = {step}: a step here has {len(mbs)} micro-batch, "
                             "nothing to swap;", "make train.global_batch_size at least twice train.micro_batch_size "
                             "times the data-parallel size, or remove the key.")
        if self.world.is_main:
            log.warning("debug.swap_micro_batches_at_step: micro-batches 0 and 1 of step %d trained in swapped order "
                        "(fault injection)", step)
        return [mbs[1], mbs[0], *mbs[2:]]

    def _preempt(self, outcome: Outcome, step: int, consumed: int) -> Outcome:
        log.warning("preemption signal received: checkpointing step %d and stopping", step)
        if step > 0:
            self.save(step, consumed)
        self._finish_saves()
        outcome.status = Status.PREEMPTED
        return outcome
