#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for mcx's launcher tests and CI.
#
#   .ci/slurm.sh [start]   install (once) slurm-wlm + munge, write the config, start munged,
#                          slurmctld and slurmd, wait until the node is idle
#   .ci/slurm.sh stop      stop the daemons this script started (by their pid files)
#   .ci/slurm.sh status    print sinfo / scontrol ping
#
# Runs as root without systemd (CI containers): the daemons are started directly and
# daemonise themselves. No accounting daemon (slurmdbd): followers use squeue and
# `scontrol show job` (finished jobs stay visible for MinJobAge seconds).
# Idempotent: a second `start` with everything up only checks the node.
set -euo pipefail

MARKER="# written by mcx .ci/slurm.sh"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
NODE="$(hostname -s)"

say() { printf 'slurm.sh: %s\n' "$*"; }
die() { printf 'slurm.sh: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts daemons)"

alive() {  # alive PIDFILE: the process named in PIDFILE runs
  [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

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
  runuser -u munge -- munged --pid-file="$MUNGE_PID"
  for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
  say "started munged (pid $(cat "$MUNGE_PID"))"
}

write_config() {
  if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to replace a real cluster's config"
  fi
  # The node line as slurmd itself detects this machine (CPUs, sockets, cores, RealMemory).
  local node_line
  node_line="$(slurmd -C | head -n1)"
  [[ $node_line == "NodeName=$NODE "* ]] || die "unexpected 'slurmd -C' output: $node_line"
  install -d -m 0755 "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS"
  local tmp
  tmp="$(mktemp "$CONF_DIR/.slurm.conf.XXXXXX")"
  cat >"$tmp" <<EOF
$MARKER
# One node, no accounting daemon, no cgroups (containers rarely allow them).
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
SlurmdPidFile=$SLURMD_PID
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 0644 "$tmp"
  if [[ -e $CONF ]] && cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
    say "$CONF unchanged"
  else
    mv -f "$tmp" "$CONF"
    say "wrote $CONF: $node_line"
    CONFIG_CHANGED=1
  fi
}

start_daemons() {
  if [[ ${CONFIG_CHANGED:-0} == 1 ]] && { alive "$CTLD_PID" || alive "$SLURMD_PID"; }; then
    say "configuration changed: restarting the Slurm daemons"
    stop_daemon slurmd "$SLURMD_PID"
    stop_daemon slurmctld "$CTLD_PID"
  fi
  if alive "$CTLD_PID"; then
    say "slurmctld already running (pid $(cat "$CTLD_PID"))"
  else
    # -c: start with no jobs; a test cluster must not replay jobs left by an earlier session.
    slurmctld -c
    say "started slurmctld (empty queue)"
  fi
  if alive "$SLURMD_PID"; then
    say "slurmd already running (pid $(cat "$SLURMD_PID"))"
  else
    slurmd
    say "started slurmd"
  fi
}

wait_idle() {
  local state=""
  for _ in $(seq 120); do
    state="$(sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n1 || true)"
    case $state in
      idle|mixed|allocated) break ;;
      down*|drain*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  case $state in
    idle|mixed|allocated) ;;
    *) tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
       die "node $NODE is '${state:-unknown}' after 60 s" ;;
  esac
  say "cluster up: node $NODE is $state"
  sinfo
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
  stop_daemon slurmd "$SLURMD_PID"
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
