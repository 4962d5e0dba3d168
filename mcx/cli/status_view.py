"""Plain text for `mcx run --detach`, `mcx status` and `mcx cancel`: whole lines, one fact each, so that
`mcx status | grep RUNNING` and a person at a terminal read the same thing."""

from __future__ import annotations

from collections.abc import Sequence

from mcx.ops.cancel import Cancelled
from mcx.ops.detach import Detached
from mcx.ops.status import RunNow, StageNow
from mcx.report.fmt import duration


def _job(kind: str | None, job_id: str | None) -> str:
    if kind is None:
        return "not started"
    return f"Slurm job {job_id}" if kind == "slurm" else f"{kind} pid {job_id}"


def detached_text(d: Detached) -> str:
    jobs = "; ".join(f"{j.stage} stage: {_job(j.kind, j.job_id)}" for j in d.jobs)
    return (f"run {d.run_id} submitted ({jobs})\n"
            f"supervisor: pid {d.supervisor_pid}, its output in {d.log}\n"
            f"follow it: mcx status {d.run_id} | mcx logs {d.run_id} -f | mcx cancel {d.run_id}\n")


def stage_line(s: StageNow) -> str:
    parts = [f"  {s.stage:<5}", _job(s.kind, s.job_id)]
    if s.kind is not None:
        parts.append(s.queue + (f" ({s.reason})" if s.reason else ""))
    if s.status:
        parts.append(s.status)
    if s.step is not None:
        parts.append(f"step {s.step}" + (f"/{s.train_iters}" if s.train_iters else ""))
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4f}")
    if s.tokens_per_s is not None:
        parts.append(f"{s.tokens_per_s:,.0f} tokens/s")
    if s.eta_s is not None:
        parts.append(f"ETA {duration(s.eta_s)}")
    if s.slowest_rank:
        parts.append(f"slowest rank {s.slowest_rank.rank} ({s.slowest_rank.ratio - 1:.0%} slower)")
    if s.last_checkpoint:
        parts.append(f"checkpoint {s.last_checkpoint}")
    return "  ".join(parts)


def status_text(runs: Sequence[RunNow], *, one: bool) -> str:
    if not runs:
        return "no run of this project is running or queued (`mcx ls` lists every run)\n"
    out = []
    for r in runs:
        who = (f"supervisor pid {r.supervisor['pid']} on {r.supervisor['host']}" if r.supervisor
               else "no supervisor" + ("; `mcx run` of its spec picks it up" if r.state == "stalled" else ""))
        out.append(f"run {r.run_id}  {r.name or ''}  {r.state}  ({who})")
        out.extend(stage_line(s) for s in r.stages)
        if not one:
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def cancelled_text(c: Cancelled) -> str:
    stopped = "; ".join(f"{j['stage']} stage: {_job(j['kind'], j['job_id'])}" for j in c.stopped) or "no job"
    kept = f"last checkpoint {c.last_checkpoint}" if c.last_checkpoint else "no checkpoint saved yet"
    after = ("`mcx run` of its spec resumes it" if c.settled
             else "its supervisor has not recorded the end yet (`mcx status` shows it)")
    return f"run {c.run_id} cancelled ({stopped}): {c.state}, {kept}; {after}\n"
