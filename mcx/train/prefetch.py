"""The next step's micro-batches, read (and hashed) on a background thread while this step trains (issue 41,
D76, D77).

A step's micro-batches come from the datasets (index lookups, token slices, the collated tensors): on a
graphed GPU step the GPU waits through that at every step's boundary. One worker thread reads step N + 1's
while step N trains, from the same iterator in the same order, so the batches, the run and its batch hashes
are the ones a sequential read gives. It reads no further than the stage's last step; an error (the data ran
out) is raised at the step that needed the batches, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")  # what a step reads: its micro-batches (and their hashes, mcx.train.batch_hash)


class StepPrefetch(Generic[T]):
    """``take`` called once per step, one step ahead, on one thread; ``steps`` in all."""

    def __init__(self, take: Callable[[], T], steps: int) -> None:
        self._take, self._left = take, steps
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcx-prefetch")
        self._pending: Future[T] | None = None
        self._submit()

    def _submit(self) -> None:
        if self._left > 0:
            self._left -= 1
            self._pending = self._pool.submit(self._take)
        else:
            self._pending = None

    def next(self) -> T:
        """This step's micro-batches (read while the previous step trained); the next step's read starts."""
        if self._pending is None:
            raise RuntimeError("StepPrefetch: every step's micro-batches were already taken")
        batches = self._pending.result()
        self._submit()
        return batches

    def close(self) -> None:
        """Stop reading ahead: a read in progress finishes, its batches are dropped (they were never trained,
        so the consumed samples a checkpoint records do not count them)."""
        if self._pending is not None:
            self._pending.cancel()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> StepPrefetch[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
