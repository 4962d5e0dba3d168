"""Submit a stage with sbatch, follow the job, gather its result.

The job is followed with ``scontrol show job -o``: it needs no accounting daemon (sacct does),
it asks the controller about one job (``squeue --json`` of Slurm 22.05 ignores ``--jobs`` and
dumps every job), and its ``KEY=VALUE`` form has been the same across Slurm releases while the
JSON schemas changed with each. A finished job stays visible for the cluster's MinJobAge
(300 s by default); after that the outcome comes from ``result.json`` alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from attrs import evolve, frozen

from mcx.errors import EnvironmentProblem, InputError
from mcx.contract.result import clear_result, read_result
from mcx.launch.base import LaunchOutcome, Placement, State, resume_note, worker_said
from mcx.launch.local import WORKER_MODULE
from mcx.launch.sbatch import LOG_PATTERN, SCRIPT_NAME, render_sbatch
from mcx.spec.schema import LaunchSpec

# Slurm job states (squeue(1) "JOB STATE CODES") -> launch states. Held and requeued jobs are
# pending: they run again once released or eligible.
SLURM_STATES: Mapping[str, State] = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "SPECIAL_EXIT": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "RESIZING": "running",
    "UPDATE_DB": "running",
    "COMPLETED": "finished",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "PREEMPTED": "preempted",
}

# Consecutive failed queries (controller unreachable) that wait() rides out before it gives up.
MAX_QUERY_ERRORS = 30

# Why sbatch refuses a job (Slurm's own messages, slurm_errno.c) and what decides it; "{hw}" are the
# keys that set the job's size, "{time}" the key that sets its time limit.
REFUSALS: tuple[tuple[str, str], ...] = (
    ("Invalid generic resource", "the cluster cannot place it: no node of the partition has GPUs that "
     "Slurm schedules (GRES 'gpu'); compare {hw} with `sinfo -o '%P %D %G'`"),
    ("Requested node configuration is not available", "the cluster cannot place it: no set of nodes "
     "of the partition has that many nodes, GPUs or CPUs; compare {hw} with `sinfo -o '%P %D %c %G'`"),
    ("Node count specification invalid", "the cluster cannot place it: the partition has fewer nodes; "
     "compare {hw} with `sinfo -o '%P %D'`"),
    ("More processors requested than permitted", "the cluster cannot place it: more CPUs than its "
     "nodes (or limits) allow; compare {hw} with `sinfo -o '%P %D %c'`"),
    ("Invalid partition name", "launch.slurm.partition names no partition of this cluster; `sinfo -s` lists them"),
    ("Invalid account", "launch.slurm.account is not an account of yours on that partition; "
     "`sacctmgr show assoc user=$USER` lists them"),
    ("Invalid qos", "launch.slurm.qos is not a QOS you may use; `sacctmgr show assoc user=$USER` lists them"),
    ("time limit is invalid", "{time} exceeds the partition's limit (`sinfo -o '%P %l'`)"),
    ("Invalid --time", "{time} is not a time Slurm reads"),
    ("Invalid feature", "launch.slurm.constraint names a feature no node has (`sinfo -o '%P %f'`)"),
    # Pending reasons of a job Slurm accepted but will never start as the cluster is configured
    # (sbatch takes such a job when EnforcePartLimits=NO, Slurm's default, and keeps it pending).
    ("reason PartitionConfig", "the cluster cannot place it: the partition has fewer nodes, or nodes with "
     "fewer CPUs or GPUs, than it asks for; compare {hw} with `sinfo -o '%P %D %c %G'`"),
    ("reason BadConstraints", "no node satisfies its constraints (launch.slurm.constraint, extra_sbatch); "
     "`sinfo -o '%P %f %G'` lists what the nodes have"),
)
# The pending reasons above: the job is cancelled and the stage refused instead of waiting forever.
NEVER_STARTS = frozenset({"PartitionConfig", "BadConstraints"})


def time_key(stage_dir: Path) -> str:
    """The spec key that sets a stage's time limit (mcx names stage directories after their stage)."""
    return "smoke.time_limit (unset: the plan's estimate)" if stage_dir.name == "smoke" else "launch.slurm.time"


class JobRefused(InputError):
    """sbatch refused the job (or Slurm holds it with a reason in NEVER_STARTS; mcx cancels it): the
    cluster cannot place it, or a launch.slurm value is wrong there. Nothing of it ran; the rendered
    script stays in the stage directory."""


@frozen(kw_only=True)
class JobInfo:
    """What the controller says about a job."""

    job_id: str
    state: str  # Slurm's JobState, e.g. "RUNNING"
    reason: str
    exit_code: int | None  # the batch script's exit status, or -signal
    restarts: int
    nodes: str


_FIELD = re.compile(r"(?:^|\s)(JobId|JobState|Reason|ExitCode|Restarts|NodeList)=(\S*)")


def parse_job(text: str) -> JobInfo | None:
    """Parse one ``scontrol show job -o`` line (the first value of each key counts)."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(text):
        fields.setdefault(key, value)
    if "JobId" not in fields or "JobState" not in fields:
        return None
    code, _, sig = fields.get("ExitCode", "").partition(":")
    exit_code = -int(sig) if sig.isdigit() and int(sig) else (int(code) if code.isdigit() else None)
    restarts = fields.get("Restarts", "0")
    return JobInfo(
        job_id=fields["JobId"],
        # The state's leading word: "CANCELLED" of "CANCELLED+".
        state=re.sub(r"[^A-Z_].*", "", fields["JobState"], flags=re.DOTALL),
        reason=fields.get("Reason", "None"),
        exit_code=exit_code,
        restarts=int(restarts) if restarts.isdigit() else 0,
        nodes=fields.get("NodeList", ""),
    )


def _command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EnvironmentProblem(
            f"{name} not found on PATH",
            "launch.kind = 'slurm' needs the Slurm client commands (sbatch, scontrol, scancel).",
        )
    return path


def query_job(job_id: str) -> JobInfo | None:
    """The job's current record, or None once the controller no longer knows it."""
    proc = subprocess.run(
        [_command("scontrol"), "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise EnvironmentProblem(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    return parse_job(proc.stdout)


def submit(
    stage_dir: Path,
    where: Placement,
    launch_spec: LaunchSpec,
    env: Mapping[str, str],
    python: str = sys.executable,
    module: str = WORKER_MODULE,
) -> str:
    """Write STAGE_DIR/sbatch.sh and submit it; returns the job ID."""
    stage_dir = Path(stage_dir).resolve()
    script = render_sbatch(stage_dir, where, launch_spec, env, python=python, module=module)
    path = stage_dir / SCRIPT_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(script, encoding="utf-8")
    os.replace(tmp, path)
    clear_result(stage_dir)
    proc = subprocess.run(
        [_command("sbatch"), "--parsable", str(path)],
        cwd=stage_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        message = proc.stderr.strip() or proc.stdout.strip()
        if re.search(r"contact slurm controller|Connection refused|Unable to establish", message):
            raise EnvironmentProblem(f"sbatch cannot reach the Slurm controller: {message}")
        raise refused(path, message, where, launch_spec.slurm.partition)
    job_id = proc.stdout.strip().split(";", 1)[0]  # "<id>" or "<id>;<cluster>"
    if not job_id.isdigit():
        raise EnvironmentProblem(f"sbatch printed {proc.stdout.strip()!r} where a job ID was expected")
    return job_id


def refused(script: Path, message: str, where: Placement | None, partition: str | None,
            job_id: str | None = None) -> JobRefused:
    """The error for Slurm's ``message`` about ``script`` (``job_id``: the job it accepted and mcx
    cancelled): what the job asked for and, where the message is one Slurm gives for it, the key that
    decides it and how to check the cluster."""
    if where is None:  # a handle attached to a job submitted earlier
        job = "the size its #SBATCH lines ask for"
    else:
        what = "GPU(s)" if where.device == "cuda" else "CPU process(es)"
        job = f"{where.nodes} node(s) x {where.procs_per_node} {what} per node"
    # mcx names stage directories after their stage (docs/runs.md, "Run directory").
    smoke = script.parent.name == "smoke"
    hw = "smoke.nodes x smoke.gpus_per_node" if smoke else "hardware.nodes x hardware.gpus_per_node"
    said = " ".join(message.split())
    why = next((text.format(hw=hw, time=time_key(script.parent)) for fragment, text in REFUSALS
                if fragment.lower() in said.lower()), None)
    part = partition if partition is not None else "the default"
    if job_id is None:
        head = f"sbatch refused the job {script} ({job}, partition {part}): {said};"
    else:
        head = (f"Slurm accepted the job {script} ({job}, partition {part}) as job {job_id} but it can never "
                f"start there ({said}): mcx cancelled it;")
    if why is None:
        return JobRefused(head, "check launch.slurm (partition, account, qos, time, constraint, extra_sbatch) "
                          "against `sinfo` and your cluster's limits.")
    return JobRefused(head, why + ". Nothing was started; the script stays there for inspection.")


class SlurmHandle:
    """A submitted job. Also attaches to a job submitted earlier: ``SlurmHandle(job_id, stage_dir)``."""

    def __init__(
        self,
        job_id: str,
        stage_dir: Path,
        *,
        time_limit: str | None = None,
        poll_interval: float = 2.0,
        where: Placement | None = None,
        partition: str | None = None,
    ) -> None:
        self._job_id = job_id
        self._stage_dir = Path(stage_dir)
        self._time_limit = time_limit
        self.poll_interval = poll_interval
        self._where = where  # what the job asked for, for the error when it can never start
        self._partition = partition
        self._last: JobInfo | None = None

    @property
    def job_id(self) -> str:
        return self._job_id

    @property
    def stage_dir(self) -> Path:
        return self._stage_dir

    @property
    def log(self) -> Path:
        """The job's output: the batch script, srun and every rank, all attempts appended."""
        return self._stage_dir / LOG_PATTERN.replace("%j", self._job_id)

    def poll(self) -> State:
        return self._outcome(self._query()).state

    def wait(self, timeout: float | None = None) -> LaunchOutcome:
        """The outcome once the job ended (or at ``timeout``). A job Slurm holds with a reason in
        NEVER_STARTS is cancelled and JobRefused raised: waiting would never end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        errors = 0
        while True:
            try:
                outcome: LaunchOutcome | None = self._outcome(self._query())
                errors = 0
            except EnvironmentProblem:
                errors += 1
                if errors >= MAX_QUERY_ERRORS:
                    raise
                outcome = self._outcome(self._last) if self._last else None
            if outcome is not None and outcome.state == "pending" and self._last is not None \
                    and self._last.reason in NEVER_STARTS:
                self.cancel()
                raise refused(self._stage_dir / SCRIPT_NAME, f"reason {self._last.reason}", self._where,
                              self._partition, job_id=self._job_id)
            if outcome is not None and outcome.done:
                return outcome
            if deadline is not None and time.monotonic() >= deadline:
                return outcome or LaunchOutcome(state="pending", job_id=self._job_id, log=self.log)
            pause = self.poll_interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    def forwarding_signals(self) -> AbstractContextManager[None]:
        """Nothing to forward: a Ctrl-C stops following, the job runs on (``cancel`` ends it)."""
        return nullcontext()

    def cancel(self) -> None:
        """scancel: Slurm sends SIGTERM to every process (the workers checkpoint), SIGKILL after
        the cluster's KillWait."""
        proc = subprocess.run([_command("scancel"), self._job_id], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise EnvironmentProblem(f"scancel {self._job_id} failed: {proc.stderr.strip()}")

    def _query(self) -> JobInfo | None:
        info = query_job(self._job_id)
        if info is not None:
            self._last = info
        return info

    def _outcome(self, info: JobInfo | None) -> LaunchOutcome:
        if info is None:
            return self._forgotten()
        state = SLURM_STATES.get(info.state, "running")
        # What the controller says of the job; the detail (and, once it ended, the worker's result) come next.
        known = LaunchOutcome(state=state, job_id=self._job_id, exit_code=info.exit_code, log=self.log,
                              restarts=info.restarts)
        if state in ("pending", "running"):
            held = " (held: `scontrol release " + self._job_id + "` lets it run)" if "HOLD" in info.state else ""
            why = f", reason {info.reason}" if info.reason not in ("None", "") else ""
            return evolve(known, detail=f"Slurm job {self._job_id} is {info.state}{why}{held}")
        return self._final(state, info, known)

    def _final(self, state: State, info: JobInfo, known: LaunchOutcome) -> LaunchOutcome:
        result = read_result(self._stage_dir)
        status = (result or {}).get("status")
        said = worker_said(result)
        resume = resume_note(self._stage_dir)
        job = f"Slurm job {self._job_id}"
        see = f"See {self.log}."
        requeued = f" It was requeued {info.restarts} time(s)." if info.restarts else ""
        ended = evolve(known, result=result)
        if state in ("finished", "failed") and status == "preempted":
            return evolve(
                ended,
                state="preempted",
                detail=f"{job} ended after a SIGTERM that did not requeue it (the time-limit warning "
                f"with no new checkpoint, or a signal from outside); the worker saved a checkpoint. {resume}",
            )
        if state == "finished":
            if result is None:
                return evolve(
                    ended, state="failed", detail=f"{job} completed but the worker wrote no result.json. {see}"
                )
            return evolve(ended, state="finished", detail=f"{said}{requeued}".strip())
        if info.state == "OUT_OF_MEMORY":
            detail = (
                f"{job} ran out of host memory. Ask for more (launch.slurm.extra_sbatch = ['--mem=0'] "
                f"requests a whole node's) or lower train.micro_batch_size. {resume} {see}"
            )
        elif state == "failed":
            detail = f"{job} failed (exit code {info.exit_code}, reason {info.reason}). {said} {see}"
        elif state == "timeout":
            limit = f" ({self._time_limit})" if self._time_limit else ""
            detail = (
                f"{job} reached its time limit{limit}. {resume} Raise "
                f"{time_key(self._stage_dir)}, or keep launch.slurm.requeue = true with "
                f"launch.slurm.signal_grace_seconds long enough to save a checkpoint. {see}"
            )
        elif state == "cancelled":
            detail = f"{job} was cancelled. {resume}"
        elif state == "node_fail":
            detail = (
                f"A node of {job} failed ({info.state} on {info.nodes or 'its nodes'}, reason {info.reason}). "
                f"{resume} To avoid the node: launch.slurm.extra_sbatch = ['--exclude=NODE']. {see}"
            )
        else:  # preempted
            detail = (
                f"{job} was preempted and the cluster did not requeue it "
                f"(its PreemptMode is CANCEL, or launch.slurm.requeue = false). {resume}"
            )
        return evolve(ended, state=state, detail=" ".join(detail.split()))

    def _forgotten(self) -> LaunchOutcome:
        """The controller forgot the job (MinJobAge passed, or it never knew it)."""
        result = read_result(self._stage_dir)
        status = (result or {}).get("status")
        job = f"Slurm job {self._job_id}"
        # Only the stage directory speaks for it now: no exit code, no restarts.
        gone = LaunchOutcome(state="failed", job_id=self._job_id, result=result, log=self.log)
        if status == "finished":
            return evolve(gone, state="finished", detail=worker_said(result))
        if status == "preempted":
            return evolve(
                gone,
                state="preempted",
                detail=f"{job} is no longer known to Slurm; the worker had stopped on SIGTERM and saved a "
                f"checkpoint. {resume_note(self._stage_dir)}",
            )
        said = worker_said(result) or "the worker wrote no result.json."
        return evolve(gone, detail=f"{job} is no longer known to Slurm and {said} See {self.log}.")


@frozen(kw_only=True)
class SlurmLauncher:
    """Submits the stage with sbatch (one torchrun agent per node); ``python`` must exist at the
    same path on the compute nodes (a shared filesystem, as usual for Slurm clusters)."""

    python: str = sys.executable
    module: str = WORKER_MODULE
    poll_interval: float = 2.0

    def start(
        self,
        stage_dir: Path,
        where: Placement,
        launch_spec: LaunchSpec,
        env: Mapping[str, str],
    ) -> SlurmHandle:
        job_id = submit(stage_dir, where, launch_spec, env, python=self.python, module=self.module)
        return SlurmHandle(
            job_id,
            Path(stage_dir).resolve(),
            time_limit=launch_spec.slurm.time,
            poll_interval=self.poll_interval,
            where=where,
            partition=launch_spec.slurm.partition,
        )
