"""Tokenizing record shards in worker processes: one partial dataset a shard, a record of the finished ones, the merge.

Each shard becomes its own Megatron-Core indexed dataset (``<work>/<name>.bin/.idx``, written by Megatron's
``IndexedDatasetBuilder``) in a work directory beside the output, and ``done.json`` there records it once it is
whole. The final dataset is those partials concatenated in input order by the same builder's ``add_index``,
so its bytes do not depend on how many workers ran or in which order they finished. An interrupted prepare
keeps the finished shards; the next one with the same tokenizer and text key reuses every shard whose file
still has the size and mtime it had (a partial being written is named ``*.partial.*`` and thrown away).

Workers are forked from a process that has already imported the builder (Megatron-Core imports torch: seconds
a process) and ignore Ctrl-C (the parent stops them). The CPUs are shared out: each of N workers batch-encodes
with its equal share of the tokenizers library's threads, as one worker (this process) uses all of them, so more
workers never tokenize with fewer cores than one did (D61).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import asdict, frozen

from mcx.data.shards import Shard, shard_documents
from mcx.data.tokenizer import Tokenizer
from mcx.hashing import digest
from mcx.jsonfile import read_json, write_json_atomic

DONE = "done.json"
_ENCODE_BATCH = 256  # documents per tokenizer call
_TICK_S = 0.2  # at most this often a progress event


@frozen(kw_only=True)
class ShardDone:
    """A shard tokenized into its partial dataset; what resuming and the manifest need of it."""

    path: str  # as found (for messages)
    name: str  # the partial's file name stem in the work directory
    size: int
    mtime_ns: int
    documents: int
    tokens: int
    text_bytes: int  # UTF-8 bytes of its documents
    sha256: str  # of its documents as tokenized (mcx.data.corpus.documents_sha256's form)


@frozen(kw_only=True)
class PrepareProgress:
    """Where a prepare is: the event its caller's ``progress`` hears, a few times a second."""

    shards: int
    shards_done: int
    shards_resumed: int  # of shards_done, found finished by an earlier, interrupted prepare
    documents: int  # this prepare's, resumed shards included
    tokens: int
    tokens_now: int  # tokenized by this process's workers (the rate's numerator)
    bytes_done: int  # input file bytes read, resumed shards included
    bytes_total: int
    bytes_resumed: int
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens_now / self.elapsed_s if self.elapsed_s > 0 and self.tokens_now else None

    @property
    def eta_s(self) -> float | None:
        read_now = self.bytes_done - self.bytes_resumed
        if read_now <= 0 or self.elapsed_s <= 0:
            return None
        return (self.bytes_total - self.bytes_done) * self.elapsed_s / read_now


Progress = Callable[[PrepareProgress], None]


def partial_name(shard: Shard) -> str:
    return "shard-" + hashlib.sha256(str(shard.path.resolve()).encode("utf-8")).hexdigest()[:16]


def work_key(tokenizer: Tokenizer, text_key: str, versions: dict[str, str]) -> str:
    """What every partial in a work directory was made with; another key means none of them is reused."""
    return digest({"tokenizer": tokenizer.identity(), "text_key": text_key, "versions": versions})


def finished(work: Path, key: str, shards: Sequence[Shard]) -> dict[str, ShardDone]:
    """The shards an earlier prepare finished that are still valid: same key, same file, partial present."""
    state = read_json(work / DONE, {})
    if not isinstance(state, dict) or state.get("key") != key:
        return {}
    done: dict[str, ShardDone] = {}
    for shard in shards:
        entry = (state.get("shards") or {}).get(partial_name(shard))
        if not isinstance(entry, dict):
            continue
        try:
            record = ShardDone(**entry)
            st = shard.path.stat()
        except (TypeError, OSError):
            continue
        if (st.st_size, st.st_mtime_ns) == (record.size, record.mtime_ns) and all(
                (work / f"{record.name}.{ext}").is_file() for ext in ("bin", "idx")):
            done[record.name] = record
    return done


def _save(work: Path, key: str, done: dict[str, ShardDone]) -> None:
    write_json_atomic(work / DONE, {"key": key, "shards": {name: asdict(d) for name, d in sorted(done.items())}})


# --- the worker side --------------------------------------------------------------------------------

_worker: dict[str, Any] = {}  # set in each worker process (or this one, with one worker) before its first shard


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _init_worker(tokenizer: Tokenizer, text_key: str, work: str, dtype: Any, events: Any, threads: int | None) -> None:
    """``threads``: this forked worker's share of the CPUs (None: this process, every CPU, as the library sets)."""
    if threads is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
        # Read when the library's thread pool starts, which the parent never started: it tokenizes nothing.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    _worker.update(tokenizer=tokenizer, text_key=text_key, work=Path(work), dtype=dtype, events=events)


def _tokenize_shard(shard: Shard) -> ShardDone:
    with warnings.catch_warnings():  # Megatron-Core's builder warns that it cannot tell its rank (there is none)
        warnings.simplefilter("ignore", UserWarning)
        return _tokenize(shard)


def _tokenize(shard: Shard) -> ShardDone:
    import numpy as np

    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tokenizer: Tokenizer = _worker["tokenizer"]
    dtype, events, work = _worker["dtype"], _worker["events"], _worker["work"]
    st = shard.path.stat()
    name = partial_name(shard)
    tmp = work / f"{name}.partial"
    builder = IndexedDatasetBuilder(f"{tmp}.bin", dtype=dtype)
    h = hashlib.sha256()
    documents = tokens = text_bytes = 0
    last = time.monotonic()

    def flush(batch: list[str]) -> None:
        nonlocal documents, tokens
        for ids in tokenizer.encode_batch(batch):
            ids.append(tokenizer.eod)
            builder.add_document(np.asarray(ids, dtype=dtype), [len(ids)])
            tokens += len(ids)
        documents += len(batch)

    batch: list[str] = []
    for text, position in shard_documents(shard, _worker["text_key"]):
        data = text.encode("utf-8")
        h.update(data)
        h.update(b"\0")
        text_bytes += len(data)
        batch.append(text)
        if len(batch) == _ENCODE_BATCH:
            flush(batch)
            batch = []
            if events is not None and time.monotonic() - last > _TICK_S:
                events.put((name, documents, tokens, position))
                last = time.monotonic()
    flush(batch)
    builder.finalize(f"{tmp}.idx")
    os.replace(f"{tmp}.bin", work / f"{name}.bin")  # the .idx last: a pair is whole once both are named
    os.replace(f"{tmp}.idx", work / f"{name}.idx")
    return ShardDone(path=str(shard.path), name=name, size=st.st_size, mtime_ns=st.st_mtime_ns, documents=documents,
                     tokens=tokens, text_bytes=text_bytes, sha256=h.hexdigest())


# --- the parent side --------------------------------------------------------------------------------

def tokenize_shards(shards: Sequence[Shard], tokenizer: Tokenizer, *, text_key: str, work: Path, key: str, dtype: Any,
                    workers: int, progress: Progress | None = None) -> list[ShardDone]:
    """Every shard's partial dataset in ``work``, made now or found from an earlier run; in input order."""
    with warnings.catch_warnings():  # megatron.core warns at import about optional CUDA packages
        warnings.simplefilter("ignore")
        import megatron.core.datasets.indexed_dataset  # noqa: F401  # before forking: workers inherit it

    work.mkdir(parents=True, exist_ok=True)
    for stale in work.glob("*.partial.*"):  # a shard an interrupted prepare was writing
        stale.unlink()
    done = finished(work, key, shards)
    _save(work, key, done)
    todo = [s for s in shards if partial_name(s) not in done]
    resumed = dict(done)
    by_name = {partial_name(s): s for s in shards}
    start = time.monotonic()
    live: dict[str, tuple[int, int, int]] = {}  # shard being tokenized -> documents, tokens, bytes so far
    last_tick = 0.0

    def tick(force: bool = False) -> None:
        nonlocal last_tick
        if progress is None or (not force and time.monotonic() - last_tick < _TICK_S):
            return
        last_tick = time.monotonic()
        fin = list(done.values())
        progress(PrepareProgress(
            shards=len(shards), shards_done=len(fin), shards_resumed=len(resumed),
            documents=sum(d.documents for d in fin) + sum(v[0] for v in live.values()),
            tokens=sum(d.tokens for d in fin) + sum(v[1] for v in live.values()),
            tokens_now=sum(d.tokens for n, d in done.items() if n not in resumed) + sum(v[1] for v in live.values()),
            bytes_done=sum(by_name[n].size for n in done) + sum(v[2] for v in live.values()),
            bytes_total=sum(s.size for s in shards), bytes_resumed=sum(by_name[n].size for n in resumed),
            elapsed_s=last_tick - start))

    def finish(record: ShardDone) -> None:
        done[record.name] = record
        live.pop(record.name, None)
        _save(work, key, done)
        tick(force=True)

    tick(force=True)
    try:
        _run(todo, tokenizer, text_key, work, dtype, workers, done, live, finish, tick)
    except BaseException:  # Ctrl-C or a bad shard: the shards being written are dropped, the finished ones stay
        for partial in work.glob("*.partial.*"):
            partial.unlink(missing_ok=True)
        raise
    tick(force=True)
    return [done[partial_name(s)] for s in shards]


def _run(todo: list[Shard], tokenizer: Tokenizer, text_key: str, work: Path, dtype: Any, workers: int,
         done: dict[str, ShardDone], live: dict[str, tuple[int, int, int]], finish: Callable[[ShardDone], None],
         tick: Callable[[], None]) -> None:
    if workers <= 1 or len(todo) <= 1:
        _init_worker(tokenizer, text_key, str(work), dtype, _Relay(live, tick), threads=None)
        for shard in todo:
            finish(_tokenize_shard(shard))
    else:
        ctx = multiprocessing.get_context("fork")
        mp_events = ctx.SimpleQueue()
        processes = min(workers, len(todo))
        pool = ctx.Pool(processes, initializer=_init_worker,
                        initargs=(tokenizer, text_key, str(work), dtype, mp_events, max(1, _cpus() // processes)))
        try:
            results = pool.imap_unordered(_tokenize_shard, todo, chunksize=1)
            remaining = len(todo)
            while remaining:
                try:
                    record = results.next(timeout=_TICK_S)
                except multiprocessing.TimeoutError:
                    record = None
                while not mp_events.empty():
                    name, docs, toks, pos = mp_events.get()
                    if name not in done:
                        live[name] = (docs, toks, pos)
                if record is not None:
                    finish(record)
                    remaining -= 1
                tick()
            pool.close()
        except BaseException:
            pool.terminate()  # Ctrl-C or a bad shard: the other workers stop; the finished shards stay recorded
            raise
        finally:
            pool.join()


class _Relay:
    """With one worker (this process): a shard's progress goes straight into ``live`` and the next tick."""

    def __init__(self, live: dict[str, tuple[int, int, int]], tick: Callable[[], None]) -> None:
        self._live, self._tick = live, tick

    def put(self, item: tuple[str, int, int, int]) -> None:
        self._live[item[0]] = item[1:]
        self._tick()


def merge(done: Sequence[ShardDone], work: Path, out_prefix: Path, dtype: Any) -> None:
    """The partials concatenated in order into ``<out_prefix>.bin/.idx`` by Megatron-Core's builder."""
    with warnings.catch_warnings():  # at import about optional CUDA packages; then about its rank
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        builder = IndexedDatasetBuilder(f"{out_prefix}.bin", dtype=dtype)
        for record in done:
            builder.add_index(str(work / record.name))
        builder.finalize(f"{out_prefix}.idx")
