"""A launch that is a child process of the control plane (the local and torchrun launchers).

The child runs in its own session, so a Ctrl-C in the terminal reaches only the control plane,
which forwards it once, as SIGTERM, to the worker processes: the worker saves a checkpoint and
exits, exactly as on a Slurm preemption. A second Ctrl-C kills the workers. The outcome names the
signal (``interrupted_by``): the user's stop, which `mcx run` ends "interrupted" with exit 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from attrs import evolve

from mcx.contract.result import clear_result, read_result
from mcx.errors import EnvironmentProblem
from mcx.launch.base import LaunchOutcome, State, resume_note, worker_said

# How long cancel() lets the workers checkpoint before it kills them.
CANCEL_GRACE_S = 120.0


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux /proc), in pid order."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry.name))
    return sorted(children)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def on_stop_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """While inside, ``handler`` gets SIGINT and SIGTERM, then the handlers before come back. Only the main
    thread can own signal handlers; elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ProcessHandle:
    """A running child process: the worker itself (local) or the torchrun agent (torchrun).

    ``workers`` names the processes that get the graceful SIGTERM: the child itself, or the
    agent's children (torchrun ignores SIGTERM so that it cannot cut the workers' checkpoint
    short; it exits when they do).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        stage_dir: Path,
        env: Mapping[str, str],
        log: Path | None,
        workers: Callable[[int], list[int]],
        what: str,
    ) -> None:
        self._stage_dir = stage_dir
        self._log = log
        self._workers = workers
        self._what = what
        self._interrupted = False
        self._signalled: str | None = None  # the first signal to the control plane that forward() passed on
        self._lock = threading.Lock()
        clear_result(stage_dir)
        out: IO[bytes] | None = None
        if log is not None:
            out = open(log, "ab")  # noqa: SIM115 - closed in _reap
        try:
            self._proc = subprocess.Popen(
                list(argv),
                cwd=stage_dir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
            )
        except OSError as e:
            raise EnvironmentProblem(f"cannot start {argv[0]}: {e}") from e
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        self.argv = tuple(argv)
        self._group_reaped = False

    @property
    def job_id(self) -> str:
        return str(self._proc.pid)

    @property
    def stage_dir(self) -> Path:
        return self._stage_dir

    @property
    def pid(self) -> int:
        return self._proc.pid

    def poll(self) -> State:
        if self._proc.poll() is None:
            return "running"
        self._reap_group()
        return self._outcome().state

    def wait(self, timeout: float | None = None) -> LaunchOutcome:
        with self.forwarding_signals():
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return LaunchOutcome(state="running", job_id=self.job_id, log=self._log, detail=f"{self._what} running")
        self._reap_group()
        return self._outcome()

    def _reap_group(self) -> None:
        """Once the child has exited, nothing of this launch outlives it. A worker that crashed or
        was killed leaves its own helpers behind (Megatron-Core's persistent checkpoint writer,
        data-loader workers), each holding memory and a CUDA context; they are in the launch's
        process group, which this empties, once (the group's id could belong to another later)."""
        if self._group_reaped:
            return
        self._group_reaped = True
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def interrupt(self) -> None:
        """Ask the workers to save a checkpoint and stop (SIGTERM); the launch ends 'cancelled'."""
        with self._lock:
            self._interrupted = True
            if self._proc.poll() is not None:
                return
            targets = self._workers(self._proc.pid)
            if targets:
                for pid in targets:
                    _signal(pid, signal.SIGTERM)
            else:  # the agent has not started its workers yet: it stops cleanly on SIGINT
                _signal(self._proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """Stop at once (SIGKILL): no checkpoint."""
        with self._lock:
            self._interrupted = True
            if self._proc.poll() is not None:
                return
            for pid in self._workers(self._proc.pid):
                _signal(pid, signal.SIGKILL)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cancel(self, grace: float = CANCEL_GRACE_S) -> None:
        """Interrupt now; kill after ``grace`` seconds if the workers are still running."""
        self.interrupt()
        timer = threading.Timer(grace, self.kill)
        timer.daemon = True
        timer.start()

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """While inside: SIGINT/SIGTERM to this process interrupt the workers; a second one kills
        them. Only the main thread can own signal handlers; elsewhere this does nothing."""

        def forward(signum: int, frame: object) -> None:
            self._signalled = self._signalled or signal.Signals(signum).name
            if self._interrupted:
                self.kill()
            else:
                self.interrupt()

        with on_stop_signals(forward):
            yield

    def _outcome(self) -> LaunchOutcome:
        code = self._proc.returncode
        result = read_result(self._stage_dir)
        status = (result or {}).get("status")
        said = worker_said(result)
        where = f" Its output is in {self._log}." if self._log else ""
        # The fields every outcome of this launch shares; each branch below says only its state and detail.
        ended = LaunchOutcome(state="failed", exit_code=code, job_id=self.job_id, result=result, log=self._log,
                              interrupted_by=self._signalled)
        if self._interrupted:
            saved = "The worker saved a checkpoint and stopped. " if status == "preempted" else ""
            return evolve(ended, state="cancelled", detail=f"Interrupted. {saved}{resume_note(self._stage_dir)}")
        if status == "preempted":
            return evolve(
                ended,
                state="preempted",
                detail=f"The worker was stopped by a signal from outside mcx and saved a checkpoint. "
                f"{resume_note(self._stage_dir)}",
            )
        if code == 0 and result is not None:
            return evolve(ended, state="finished", detail=said)
        if code == 0:
            return evolve(
                ended, detail=f"{self._what} exited 0 but wrote no {self._stage_dir / 'result.json'}.{where}"
            )
        if code < 0:
            name = signal.Signals(-code).name
            hint = (
                " SIGKILL from outside mcx is most often the kernel's out-of-memory killer "
                "(see `dmesg`): lower train.micro_batch_size or the model size."
                if -code == signal.SIGKILL
                else ""
            )
            return evolve(ended, detail=f"{self._what} was killed by {name}.{hint} {said}{where}".strip())
        detail = f"{self._what} exited with code {code}. {said} See {self._stage_dir / 'worker.log'}.{where}"
        return evolve(ended, detail=" ".join(detail.split()))
