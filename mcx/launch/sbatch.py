"""The sbatch script for one stage: one torchrun agent per node, c10d rendezvous on the first node.

Signals and requeue, as rendered:

* ``--signal=B:USR1@<grace>`` (when launch.slurm.requeue and a grace are set): ``<grace>``
  seconds before the time limit Slurm sends SIGUSR1 to this script alone. The script sends
  SIGTERM to every process of the job step (``scancel --signal=TERM``); the workers save a
  checkpoint and exit; the agents ignore SIGTERM so they cannot cut that short. If the attempt
  advanced ``checkpoints/latest``, the script requeues the job (``scontrol requeue``) and the next
  attempt resumes from it. An attempt that saved nothing new is not requeued (it would loop).
  Slurm may send the warning up to 60 s early (its event resolution): keep the grace well below
  the time limit. With launch.slurm.requeue = false there is no warning: at the limit Slurm's own
  SIGTERM (below) is the only chance to checkpoint, and the job ends TIMEOUT.
* Cancel, preemption and ``scontrol requeue`` from outside: Slurm itself sends SIGTERM to every
  process of the job, then SIGKILL after the cluster's KillWait; the workers checkpoint in between,
  and a requeued job resumes. ``--requeue`` also lets Slurm requeue the job after a node failure.

With ``[launch.container]`` the srun line starts the agents in the image through pyxis
(``--container-image``, ``--container-mounts``, ``--container-workdir``, ``--container-env``;
mcx.launch.container says what is mounted and passed).

Every value that reaches the script is quoted with shlex.quote, both in ``#SBATCH`` lines (sbatch
parses those with shell quoting rules) and in the body; newlines are rejected.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from mcx.errors import InputError
from mcx.launch.base import Placement
from mcx.launch.container import pyxis_options, worker_python
from mcx.launch.env import check_env, reject_control
from mcx.launch.local import WORKER_MODULE
from mcx.launch.torchrun import torchrun_argv
from mcx.launch.watchdog import watchdog_argv
from mcx.spec.schema import LaunchSpec, SlurmSpec
from mcx.spec.slurmtime import time_limit_seconds as slurm_time_seconds

SCRIPT_NAME = "sbatch.sh"
LOG_PATTERN = "slurm-%j.out"

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# Options mcx sets itself; extra_sbatch may not override them.
_MANAGED = {
    "--job-name": None, "-J": None, "--output": None, "-o": None, "--error": None, "-e": None,
    "--open-mode": None, "--signal": "launch.slurm.signal_grace_seconds",
    "--requeue": "launch.slurm.requeue", "--no-requeue": "launch.slurm.requeue",
    "--nodes": "hardware.nodes", "-N": "hardware.nodes", "--ntasks": None, "-n": None,
    "--ntasks-per-node": None, "--cpus-per-task": None, "-c": None,
    "--gpus-per-node": "hardware.gpus_per_node", "--chdir": None, "-D": None,
    "--array": None, "-a": None, "--wrap": None,
    "--partition": "launch.slurm.partition", "-p": "launch.slurm.partition",
    "--account": "launch.slurm.account", "-A": "launch.slurm.account",
    "--time": "launch.slurm.time", "-t": "launch.slurm.time",
    "--qos": "launch.slurm.qos", "-q": "launch.slurm.qos",
    "--constraint": "launch.slurm.constraint", "-C": "launch.slurm.constraint",
}  # fmt: skip


def time_limit_seconds(value: str, key: str = "launch.slurm.time") -> int | None:
    """Seconds in a Slurm time limit (None for no limit); InputError naming ``key``."""
    return slurm_time_seconds(reject_control(value, key), key)


def _extra_line(option: str, index: int) -> str:
    where = f"launch.slurm.extra_sbatch[{index}]"
    reject_control(option, where)
    if not option.startswith("-"):
        raise InputError(f"{where} = {option!r} is not an sbatch option.", "Write it like '--mem=64G'.")
    name = option.split("=", 1)[0] if option.startswith("--") else option[:2]
    if any(ch.isspace() for ch in (name if option.startswith("--") else option)):
        raise InputError(
            f"{where} = {option!r}: one option per entry, its value after '='.",
            "Write e.g. '--mail-type=END', not '--mail-type END'.",
        )
    if name in _MANAGED:
        key = _MANAGED[name]
        raise InputError(
            f"{where} = {option!r} sets {name}, which mcx sets itself.",
            f"Use {key} instead." if key else "Remove it: the launcher depends on its own value.",
        )
    return "#SBATCH " + shlex.quote(option)


def _directives(stage_dir: Path, where: Placement, slurm: SlurmSpec, warn: bool) -> list[str]:
    q = shlex.quote
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"mcx-{stage_dir.parent.name}-{stage_dir.name}")[:120]
    # %-patterns in --output: keep any "%" of the path literal.
    output = str(stage_dir / LOG_PATTERN.replace("%j", "\0")).replace("%", "%%").replace("\0", "%j")
    lines = [
        f"--job-name={q(name)}",
        f"--nodes={where.nodes}",
        "--ntasks-per-node=1",  # one torchrun agent per node; it starts the node's workers
    ]
    if where.device == "cuda":
        lines.append(f"--gpus-per-node={where.procs_per_node}")
    else:
        lines.append(f"--cpus-per-task={where.procs_per_node}")
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(slurm, key)
        if value is not None:
            lines.append(f"--{key}={q(reject_control(value, f'launch.slurm.{key}'))}")
    lines.append(f"--time={q(slurm.time)}")
    lines.append("--requeue" if slurm.requeue else "--no-requeue")
    if warn:
        lines.append(f"--signal=B:USR1@{slurm.signal_grace_seconds}")
    lines += ["--open-mode=append", f"--output={q(output)}"]
    out = ["#SBATCH " + line for line in lines]
    out += [_extra_line(option, i) for i, option in enumerate(slurm.extra_sbatch)]
    return out


def _layout_comment(where: Placement) -> list[str]:
    """``# layout: TP 8 x PP 8 (VPP 8) x CP 2 x EP 1 x DP 1 = 128 ranks`` for a placement with a layout
    (its integer degrees only: anything else is left out, so nothing but digits reaches the line)."""
    lay = where.layout
    if lay is None or not all(type(getattr(lay, k)) is int for k in ("tp", "pp", "cp", "ep", "dp")):
        return []
    vpp = f" (VPP {lay.vpp})" if type(lay.vpp) is int and lay.vpp > 1 else ""
    sp = ", sequence parallel" if lay.sequence_parallel is True else ""
    return [f"# layout: TP {lay.tp} x PP {lay.pp}{vpp} x CP {lay.cp} x EP {lay.ep} x DP {lay.dp} "
            f"= {where.world_size} ranks{sp}"]


def _words(argv: list[str], raw: Mapping[str, str]) -> str:
    """Quote each argument, except the placeholders in ``raw``, replaced by shell expressions."""
    return " ".join(raw[a] if a in raw else shlex.quote(a) for a in argv)


def render_sbatch(
    stage_dir: Path,
    where: Placement,
    launch_spec: LaunchSpec,
    env: Mapping[str, str],
    python: str = sys.executable,
    module: str = WORKER_MODULE,
) -> str:
    """The batch script that runs ``python -m module STAGE_DIR`` on the layout's nodes."""
    slurm = launch_spec.slurm
    stage_dir = Path(reject_control(str(Path(stage_dir).resolve()), "stage directory"))
    reject_control(python, "python")
    if not _MODULE.match(module):
        raise InputError(f"module {module!r} is not a dotted Python module name")
    env = check_env(env, "env")
    limit = time_limit_seconds(slurm.time)
    grace = slurm.signal_grace_seconds
    if grace < 0:
        raise InputError(f"launch.slurm.signal_grace_seconds = {grace} must be 0 or more")
    if slurm.requeue and grace and limit is not None and grace >= limit:
        raise InputError(
            f"launch.slurm.signal_grace_seconds = {grace} is not shorter than launch.slurm.time = "
            f"{slurm.time!r}",
            "The grace is taken from the end of the time limit: make it a fraction of it.",
        )
    warn = slurm.requeue and grace > 0 and limit is not None
    q = shlex.quote
    procs = where.procs_per_node
    port = str(launch_spec.master_port) if launch_spec.master_port else "$(( 20000 + SLURM_JOB_ID % 20000 ))"
    container = launch_spec.container
    agent = torchrun_argv(
        python=worker_python(container, python),
        nnodes=where.nodes,
        nproc_per_node=procs,
        endpoint="@ENDPOINT@",
        rdzv_id="@JOB@",
        module=module,
        stage_dir="@STAGE@",
    )
    pyxis = [] if container.image is None else pyxis_options(container, stage_dir, env, [*env, "OMP_NUM_THREADS"])
    policy = launch_spec.watchdog
    if policy.enabled:  # one watchdog a node starts the node's agent; a hang requeues the job (below)
        agent = watchdog_argv(worker_python(container, python), "@STAGE@", policy, agent,
                              predicted_step_s=where.predicted_step_s, in_place=False)  # in the image too, if any
    srun = [
        "srun", "--nodes=@NODES@", "--ntasks-per-node=1", "--cpus-per-task=@CPUS@",
        "--kill-on-bad-exit=1", *pyxis, *agent,
    ]  # fmt: skip
    raw = {
        "@ENDPOINT@": '"$head:$port"',
        "@JOB@": '"$SLURM_JOB_ID"',
        "@STAGE@": '"$stage"',
        "--nodes=@NODES@": '--nodes="$SLURM_JOB_NUM_NODES"',
        "--cpus-per-task=@CPUS@": '--cpus-per-task="$SLURM_CPUS_ON_NODE"',
    }
    exports = [f"export {k}={q(v)}" for k, v in sorted(env.items())]
    if "OMP_NUM_THREADS" not in env:
        exports.append(
            f"threads=$(( ${{SLURM_CPUS_ON_NODE:-{procs}}} / {procs} )); (( threads > 0 )) || threads=1\n"
            'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"'
        )
    lines = [
        "#!/bin/bash",
        f"# mcx stage {q(str(stage_dir))}: {where.nodes} node(s) x {procs} {where.device} process(es).",
        *_layout_comment(where),
        "# Written by mcx (mcx.launch.sbatch); submit with: sbatch <this file>",
        *_directives(stage_dir, where, slurm, warn),
        "",
        "set -uo pipefail",
        f"stage={q(str(stage_dir))}",
        'cd -- "$stage" || exit 1',
        "attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        'echo "mcx: job $SLURM_JOB_ID attempt $attempt on $SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"',
        "# A result.json of an earlier attempt must not be taken for this one's.",
        "rm -f -- result.json",
        "latest_before=$(cat checkpoints/latest 2>/dev/null || true)",
        "",
        *exports,
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"port={port}",
        'echo "mcx: rendezvous at $head:$port, $SLURM_JOB_NUM_NODES node(s) x ' + str(procs) + ' process(es)"',
        "",
        "trap 'echo \"mcx: SIGTERM (cancel, preemption or requeue): the workers got it too and save a "
        "checkpoint\"' TERM",
    ]
    if warn:
        lines += [
            "warned=0",
            "on_time_limit() {",
            "  warned=1",
            f'  echo "mcx: {grace} s to the time limit: the workers save a checkpoint and stop"',
            '  scancel --signal=TERM "$SLURM_JOB_ID"',
            "}",
            "trap on_time_limit USR1",
        ]
    lines += [
        _words(srun, raw) + " &",
        "srun_pid=$!",
        "# wait returns early whenever a trapped signal arrives: wait until srun has ended.",
        'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done',
        'wait "$srun_pid"; rc=$?',
        'echo "mcx: srun exited with code $rc"',
    ]
    if warn:
        lines += [
            "if (( warned )); then",
            "  latest_after=$(cat checkpoints/latest 2>/dev/null || true)",
            '  if [[ -n $latest_after && $latest_after != "$latest_before" ]]; then',
            '    echo "mcx: saved $latest_after; requeueing job $SLURM_JOB_ID to resume from it"',
            '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
            '    echo "mcx: scontrol requeue failed; resubmit the stage to resume"',
            "  else",
            '    echo "mcx: no new checkpoint in this attempt: not requeueing (it would make no progress)"',
            "  fi",
            "fi",
        ]
    if policy.enabled and slurm.requeue:  # launch.slurm.requeue = false: a hang ends the job, its stacks kept
        most = policy.max_restarts
        lines += [
            "# A hang: the watchdog wrote the ranks' stacks there and ended the attempt; requeue to resume.",
            'hung="hangs/job$SLURM_JOB_ID-$attempt"',
            'if [[ -d $hung ]]; then',
            '  hangs=$(ls -d hangs/job"$SLURM_JOB_ID"-* | wc -l)',
            f"  if (( hangs <= {most} )); then",
            '    echo "mcx: the watchdog ended a hung attempt (stacks in $stage/$hung); requeueing job $SLURM_JOB_ID to '
            f'resume from its newest checkpoint (restart $hangs of {most})"',
            '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
            '    echo "mcx: scontrol requeue failed; resubmit the stage to resume"',
            "  else",
            '    echo "mcx: the watchdog ended a hung attempt (stacks in $stage/$hung); no restart left '
            f'(launch.watchdog.max_restarts = {most})"',
            "  fi",
            "fi",
        ]
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"
