"""mcx.train.prefetch: the next step's micro-batches read on a thread while a step trains (issue 41).

The training loop's own tests (tests/test_train.py: resumed runs bitwise equal to uninterrupted ones, batch
hashes, reproductions) run through it; these pin what the loop relies on: the order, no read past the last
step, the read ahead of the step that takes it, and an error raised at the step that needed the batches."""

from __future__ import annotations

import threading
import time

import pytest

from mcx.errors import DataError
from mcx.train.prefetch import StepPrefetch


class Reader:
    """A stand-in for the loop's `take` over a real iterator: counts its calls and the threads they ran on."""

    def __init__(self, fail_at: int | None = None, hold: threading.Event | None = None) -> None:
        self.it = iter(range(100))
        self.calls, self.threads = 0, set()
        self.fail_at, self.hold = fail_at, hold

    def __call__(self) -> list:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.hold is not None and self.calls > 1:
            self.hold.wait(10)
        if self.calls == self.fail_at:
            raise DataError("the training data ran out; the dataset is smaller than the stage needs.", "use more data")
        return [next(self.it)]


def wait_for(cond, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_steps_come_in_order_and_nothing_is_read_past_the_last():
    reader = Reader()
    with StepPrefetch(reader, 3) as ahead:
        got = [ahead.next() for _ in range(3)]
        assert got == [[0], [1], [2]]
        with pytest.raises(RuntimeError, match="already taken"):
            ahead.next()
    assert reader.calls == 3
    assert reader.threads and threading.current_thread().name not in reader.threads


def test_the_next_step_is_read_while_this_one_trains():
    reader = Reader()
    with StepPrefetch(reader, 5) as ahead:
        assert ahead.next() == [0]
        # No call to next(): the second step's read has started (and finished) on its own.
        assert wait_for(lambda: reader.calls == 2)
        time.sleep(0.05)
        assert reader.calls == 2  # one step ahead, no further
        assert ahead.next() == [1]


def test_an_error_is_raised_at_the_step_that_needed_the_batches():
    reader = Reader(fail_at=2)
    with StepPrefetch(reader, 4) as ahead:
        assert ahead.next() == [0]  # step 1 trains although step 2's read has already failed
        assert wait_for(lambda: reader.calls == 2)
        with pytest.raises(DataError, match="training data ran out"):
            ahead.next()


def test_closing_with_a_read_in_progress_waits_for_it_and_drops_it():
    hold = threading.Event()
    reader = Reader(hold=hold)
    ahead = StepPrefetch(reader, 5)
    assert ahead.next() == [0]
    assert wait_for(lambda: reader.calls == 2)  # the second read is blocked inside take
    threading.Timer(0.2, hold.set).start()
    ahead.close()
    assert reader.calls == 2  # the read finished, nothing more was started


def test_no_steps_reads_nothing():
    reader = Reader()
    with StepPrefetch(reader, 0) as ahead:
        with pytest.raises(RuntimeError):
            ahead.next()
    assert reader.calls == 0
