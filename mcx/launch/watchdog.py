"""A node's hang watchdog: it starts the node's torchrun agent, and ends it when the stage makes no progress.

``python -m mcx.launch.watch_node STAGE_DIR [policy] -- AGENT ARGV`` runs beside each node's agent (the
torchrun launcher starts it in the agent's place; on Slurm, srun starts one a node). Every ``POLL_S`` it
looks at the step files of the ranks on its node (the agent's children, by their RANK: STAGE_DIR/ranks/
rank<R>.jsonl, appended by every rank at every step, mcx.train.rankfiles). No change in any of them for
longer than the bound is a hang:

* before the attempt's first step: ``startup_seconds`` (imports, model, data, the checkpoint's load);
* after: ``max(min_seconds, step_factor x reference)``, the reference being the largest of the node's ranks'
  recent step times (median of their last steps) and the plan's predicted step time (``--predicted-step-s``).

On a hang it writes every local rank's Python stacks (mcx.launch.stacks) and ``hang.node<N>.json`` into
STAGE_DIR/hangs/<job>-<attempt>/, kills the agent and its workers (SIGKILL: a hung rank handles no signal),
and then either starts the agent again in place, the workers resuming from the newest checkpoint
(``--restart-in-place``, one node: the torchrun launcher), or exits ``EXIT_HUNG`` so that the batch script
requeues the job (Slurm: every node restarts together). Either way at most ``max_restarts`` times.

SIGTERM (a cancel, preemption or the time limit: the workers got it too and save a checkpoint) stops the
watching and any restart; SIGINT is passed to the agent (it stops the workers) and does the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen

from mcx.contract.files import HANGS_DIR, RANKS_DIR, rank_steps_file
from mcx.launch.process import child_pids
from mcx.launch.stacks import dump_stacks
from mcx.metrics.ranks import rank_times
from mcx.spec.schema import WatchdogSpec

EXIT_HUNG = 75  # EX_TEMPFAIL: the stage hung and was ended; running it again resumes it
POLL_S = 2.0
MODULE = "mcx.launch.watch_node"  # its command line


@frozen
class Hang:
    """A hang as found: no progress for ``idle_s`` seconds against ``bound_s``."""

    idle_s: float
    bound_s: float
    started: bool  # a step had finished in this attempt
    last_step: int | None


def hang_bound(policy: WatchdogSpec, *, started: bool, measured_s: float | None, predicted_s: float | None) -> float:
    """Seconds without progress that make a hang (the module doc)."""
    if not started:
        return float(policy.startup_seconds)
    reference = max((s for s in (measured_s, predicted_s) if s), default=0.0)
    return max(float(policy.min_seconds), policy.step_factor * reference)


def watchdog_argv(python: str, stage_dir: Path | str, policy: WatchdogSpec, agent: Sequence[str], *,
                  predicted_step_s: float | None, in_place: bool) -> list[str]:
    """The command that runs ``agent`` under the watchdog."""
    argv = [python, "-m", MODULE, str(stage_dir), "--max-restarts", str(policy.max_restarts),
            "--step-factor", repr(float(policy.step_factor)), "--min-seconds", str(policy.min_seconds),
            "--startup-seconds", str(policy.startup_seconds)]
    if predicted_step_s:
        argv += ["--predicted-step-s", repr(float(predicted_step_s))]
    if in_place:
        argv.append("--restart-in-place")
    return [*argv, "--", *agent]


def local_ranks(agent_pid: int) -> dict[int, int]:
    """rank -> pid of the agent's workers (its children, by the RANK torchrun gave each)."""
    out = {}
    for pid in child_pids(agent_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
        if rank is not None and rank.isdigit():
            out[int(rank)] = pid
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children."""
    out, todo = [], [pid]
    while todo:
        for child in child_pids(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _say(text: str) -> None:
    print(f"mcx watchdog: {text}", file=sys.stderr, flush=True)


class Watchdog:
    def __init__(self, stage_dir: Path, policy: WatchdogSpec, agent: Sequence[str], *, predicted_step_s: float | None,
                 in_place: bool, poll_s: float = POLL_S) -> None:
        self.stage_dir, self.policy, self.agent = stage_dir, policy, list(agent)
        self.predicted_s, self.in_place, self.poll_s = predicted_step_s, in_place, poll_s
        self.stopping = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.job = os.environ.get("SLURM_JOB_ID")
        self.node = int(os.environ.get("SLURM_NODEID", "0") or 0)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_int)
        restarts = 0
        while True:
            self.proc = subprocess.Popen(self.agent)
            hang = self._watch(self.proc)
            if hang is None:
                return self.proc.returncode if self.proc.returncode >= 0 else 128 - self.proc.returncode
            attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) + restarts + 1
            self._end(self.proc, hang, attempt)
            if self.stopping:
                return EXIT_HUNG
            if not self.in_place:
                return EXIT_HUNG
            if restarts >= self.policy.max_restarts:
                _say(f"no restart left (launch.watchdog.max_restarts = {self.policy.max_restarts}): the stage fails")
                return EXIT_HUNG
            restarts += 1
            _say(f"restarting the agent ({restarts} of {self.policy.max_restarts}); the workers resume from the "
                 "newest checkpoint")

    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True  # the workers got the signal too (slurmstepd, or mcx's forward): they checkpoint

    def _on_int(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def _watch(self, proc: subprocess.Popen[bytes]) -> Hang | None:
        """None once the agent exits; the Hang when the bound passes first."""
        began = last_change = time.monotonic()
        began_ns = time.time_ns()  # a step file written since then, first seen already written, is this attempt's
        seen: dict[int, tuple[int, int]] = {}  # rank -> (size, mtime_ns) of its step file
        started = False
        while True:
            try:
                proc.wait(self.poll_s)
                return None
            except subprocess.TimeoutExpired:
                pass
            if self.stopping:
                continue
            ranks = local_ranks(proc.pid)
            now = time.monotonic()
            for rank in ranks:
                try:
                    st = (self.stage_dir / RANKS_DIR / rank_steps_file(rank)).stat()
                except OSError:
                    continue
                mark = (st.st_size, st.st_mtime_ns)
                if seen.get(rank, (0, began_ns)) != mark and st.st_size and st.st_mtime_ns >= began_ns:
                    last_change, started = now, True  # (steps a loaded node ran before its ranks were found count)
                seen[rank] = mark
            times = rank_times(self.stage_dir, set(ranks)) if started else []
            measured = max((t.median_s for t in times), default=None)
            bound = hang_bound(self.policy, started=started, measured_s=measured, predicted_s=self.predicted_s)
            idle = now - (last_change if started else began)
            if idle > bound and ranks:
                return Hang(idle_s=idle, bound_s=bound, started=started,
                            last_step=max((t.last_step for t in times), default=None))

    def _end(self, proc: subprocess.Popen[bytes], hang: Hang, attempt: int) -> None:
        """Stacks of every local rank, the record, then SIGKILL to the agent and everything below it."""
        where = self.stage_dir / HANGS_DIR / f"{'job' + self.job if self.job else 'local'}-{attempt}"
        where.mkdir(parents=True, exist_ok=True)
        ranks = local_ranks(proc.pid)
        phase = f"after step {hang.last_step}" if hang.started else "before this attempt's first step"
        _say(f"no progress for {hang.idle_s:.0f} s ({phase}; the bound is {hang.bound_s:.0f} s): writing the stacks "
             f"of ranks {', '.join(map(str, sorted(ranks)))} to {where}, then ending the attempt")
        how = {rank: dump_stacks(pid, rank, self.stage_dir, where / f"stacks.rank{rank}.txt")
               for rank, pid in sorted(ranks.items())}
        for pid in [*reversed(descendants(proc.pid)), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        record = {"time": time.time(), "node": self.node, "host": os.uname().nodename, "job": self.job,
                  "attempt": attempt, "idle_s": hang.idle_s, "bound_s": hang.bound_s, "started": hang.started,
                  "last_step": hang.last_step, "stacks": {str(r): m for r, m in how.items()},
                  "pids": {str(r): p for r, p in sorted(ranks.items())}}
        (where / f"hang.node{self.node}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
