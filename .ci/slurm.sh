#!/usr/bin/env bash
# A real Slurm cluster of two nodes on this machine, for mcx's launcher tests and CI.
#
#   .ci/slurm.sh [start]   install (once) slurm-wlm + munge, write the config, start munged,
#                          slurmctld and one slurmd per node, wait until every node is idle
#   .ci/slurm.sh stop      stop the daemons this script started (by their pid files)
#   .ci/slurm.sh status    print sinfo / scontrol ping
#
# Runs as root without systemd (CI containers): the daemons are started directly and
# daemonise themselves. No accounting daemon (slurmdbd): followers use squeue and
# `scontrol show job` (finished jobs stay visible for MinJobAge seconds).
# Idempotent: a second `start` with everything up only checks the nodes.
#
# Nodes: the first is this machine's short hostname (jobs of one node land there as before), the
# others <hostname>-2, ... (MCX_SLURM_NODES, default 2). Each has its own slurmd (`slurmd -N NAME`,
# Slurm's multiple-slurmd mode, which Debian's build has), its own port, spool, pid and log file,
# and all of this machine's CPUs: a job of two nodes gets one srun task on each, as on a real
# cluster, through the same slurmctld, munge credentials and slurmstepd (docs/decisions.md D65).
set -euo pipefail

MARKER="# written by mcx .ci/slurm.sh"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
# %n: the node's name (one slurmd per node).
SLURMD_PID_PATTERN=/run/slurmd-%n.pid
OLD_SLURMD_PID=/run/slurmd.pid  # the one slurmd of the single-node cluster this script wrote before
MUNGE_PID=/run/munge/munged.pid
NODE="$(hostname -s)"
NODE_COUNT="${MCX_SLURM_NODES:-2}"
[[ $NODE_COUNT =~ ^[1-9][0-9]?$ ]] || { echo "slurm.sh: error: MCX_SLURM_NODES=$NODE_COUNT is not 1-99" >&2; exit 1; }
NODES=("$NODE")
for ((i = 2; i <= NODE_COUNT; i++)); do NODES+=("$NODE-$i"); done
FIRST_PORT=6818  # slurmd's default port, for the first node; the next ones count up from it

say() { printf 'slurm.sh: %s\n' "$*"; }
die() { printf 'slurm.sh: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts daemons)"

alive() {  # alive PIDFILE: the process named in PIDFILE runs
  [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

daemon() {  # daemon CMD...: run CMD (which daemonises itself) without this script's open files
  # A lock the caller holds for this script (`flock LOCK .ci/slurm.sh start`) must not pass to a daemon,
  # which would hold it for as long as it runs.
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if (( fd > 2 )); then eval "exec $fd>&-"; fi
    done
    exec "$@"
  )
}

slurmd_pid() { printf '%s' "${SLURMD_PID_PATTERN//%n/$1}"; }  # slurmd_pid NODE: its pid file

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
     && command -v sbatch >/dev/null && command -v munged >/dev/null; then
    say "slurm $(dpkg-query -W -f '${Version}' slurmctld 2>/dev/null || echo '(not from apt)') and munge already installed"
    return
  fi
  local t0=$SECONDS
  say "installing slurm-wlm and munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  # The lock timeout lets this wait for another apt run instead of failing at once.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  say "installed slurm $(dpkg-query -W -f '${Version}' slurmctld) and munge in $((SECONDS - t0)) s"
}

start_munge() {
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  install -d -o munge -g munge -m 0755 /run/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    say "created /etc/munge/munge.key"
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  if alive "$MUNGE_PID" && munge -n | unmunge >/dev/null 2>&1; then
    say "munged already running (pid $(cat "$MUNGE_PID"))"
    return
  fi
  daemon runuser -u munge -- munged --pid-file="$MUNGE_PID"
  for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
  say "started munged (pid $(cat "$MUNGE_PID"))"
}

write_config() {
  if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to replace a real cluster's config"
  fi
  # The node's hardware as slurmd itself detects this machine (CPUs, sockets, cores, RealMemory).
  local node_line hardware nodes="" i=0 name
  node_line="$(slurmd -C | head -n1)"
  [[ $node_line == "NodeName=$NODE "* ]] || die "unexpected 'slurmd -C' output: $node_line"
  hardware="${node_line#"NodeName=$NODE "}"
  # Every node lives on this machine (NodeHostname), reached on loopback at its own port.
  for name in "${NODES[@]}"; do
    nodes+="NodeName=$name NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((FIRST_PORT + i)) $hardware State=UNKNOWN"$'\n'
    i=$((i + 1))
  done
  install -d -m 0755 "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS"
  local tmp
  tmp="$(mktemp "$CONF_DIR/.slurm.conf.XXXXXX")"
  cat >"$tmp" <<EOF
$MARKER
# ${#NODES[@]} node(s) on one machine, no accounting daemon, no cgroups (containers rarely allow them).
ClusterName=mcx
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again once its old credential expired: 120 s by default, too slow
# for tests that requeue.
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
JobRequeue=1
ReturnToService=2
# Finished jobs stay visible to 'scontrol show job' for 10 minutes (no sacct without slurmdbd).
MinJobAge=600
# Seconds between SIGTERM and SIGKILL on cancel, requeue and time limit.
KillWait=30
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID_PATTERN
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
${nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 0644 "$tmp"
  if [[ -e $CONF ]] && cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
    say "$CONF unchanged"
  else
    mv -f "$tmp" "$CONF"
    say "wrote $CONF: ${NODES[*]}, each $hardware"
    CONFIG_CHANGED=1
  fi
}

slurmd_alive() {  # slurmd_alive: some slurmd this script started runs
  local name
  alive "$OLD_SLURMD_PID" && return 0
  for name in "${NODES[@]}"; do alive "$(slurmd_pid "$name")" && return 0; done
  return 1
}

stop_slurmds() {
  local name
  stop_daemon slurmd "$OLD_SLURMD_PID"
  for name in "${NODES[@]}"; do stop_daemon "slurmd $name" "$(slurmd_pid "$name")"; done
}

start_daemons() {
  local name
  if [[ ${CONFIG_CHANGED:-0} == 1 ]] && { alive "$CTLD_PID" || slurmd_alive; }; then
    say "configuration changed: restarting the Slurm daemons"
    stop_slurmds
    stop_daemon slurmctld "$CTLD_PID"
  fi
  if alive "$CTLD_PID"; then
    say "slurmctld already running (pid $(cat "$CTLD_PID"))"
  else
    # -c: start with no jobs; a test cluster must not replay jobs left by an earlier session.
    daemon slurmctld -c
    say "started slurmctld (empty queue)"
  fi
  for name in "${NODES[@]}"; do
    if alive "$(slurmd_pid "$name")"; then
      say "slurmd $name already running (pid $(cat "$(slurmd_pid "$name")"))"
    else
      install -d -m 0755 "$SPOOL/$name"
      daemon slurmd -N "$name"
      say "started slurmd $name"
    fi
  done
}

wait_idle() {  # every node idle (or busy with jobs): a node left down or drained is resumed
  local state="" name pending
  for _ in $(seq 120); do
    pending=()
    for name in "${NODES[@]}"; do
      state="$(sinfo -h -N -n "$name" -o %T 2>/dev/null | head -n1 || true)"
      case $state in
        idle|mixed|allocated) ;;
        down*|drain*) scontrol update NodeName="$name" State=RESUME 2>/dev/null || true; pending+=("$name=$state") ;;
        *) pending+=("$name=${state:-unknown}") ;;
      esac
    done
    (( ${#pending[@]} == 0 )) && break
    sleep 0.5
  done
  if (( ${#pending[@]} )); then
    tail -n 20 "$LOGS/slurmctld.log" "$LOGS"/slurmd-*.log >&2 || true
    die "not up after 60 s: ${pending[*]}"
  fi
  say "cluster up: ${#NODES[@]} node(s): ${NODES[*]}"
  sinfo -N
}

start() {
  local t0=$SECONDS
  install_packages
  start_munge
  write_config
  start_daemons
  wait_idle
  say "ready in $((SECONDS - t0)) s"
}

stop_daemon() {  # stop_daemon NAME PIDFILE: SIGTERM the pid in PIDFILE and wait for it to exit
  local pid
  alive "$2" || return 0
  pid="$(cat "$2")"
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && die "$1 (pid $pid) did not stop within 10 s"
  say "stopped $1 (pid $pid)"
}

stop() {
  stop_slurmds
  stop_daemon slurmctld "$CTLD_PID"
  stop_daemon munged "$MUNGE_PID"
}

status() {
  scontrol ping
  sinfo
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 [start|stop|status]" ;;
esac
