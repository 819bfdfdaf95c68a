#!/usr/bin/env bash
# A real Slurm on localhost for tests/slurm: its own munged, slurmctld and slurmd, its own
# SLURM_CONF, state directory and free ports; never /etc/slurm, never the host's munge socket.
#   tests/slurm/cluster.sh up DIR     start everything under DIR (emptied first); writes DIR/env.sh
#                                     (source it: SLURM_CONF and the MPI variables the jobs need)
#   tests/slurm/cluster.sh down DIR   cancel every job, stop slurmd, slurmctld and munged by their
#                                     pid files, and check that none of them is left
# One node named localhost advertises MT_SLURM_CPUS CPUs (default 32) on the real cores
# (SlurmdParameters=config_overrides), so `sbatch --ntasks=32` runs on a 2-core machine.
# Needs root (the daemons run as root). Tested by tests/slurm/slurm.bats.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "cluster.sh: $*" >&2; exit 1; }

# Two TCP ports nothing listens on now (the kernel picks them).
free_ports() {
  python3 -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))'
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: polls every 0.1 s
  local limit="$1" what="$2"; shift 2
  local tries=$((limit * 10))
  while ! "$@" >/dev/null 2>&1; do
    tries=$((tries - 1))
    [[ $tries -gt 0 ]] || die "$what did not happen within $limit s"
    sleep 0.1
  done
}

render_conf() {
  local state="$1" ctld_port="$2" slurmd_port="$3"
  sed -e "s|@STATE@|$state|g" -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$slurmd_port|g" \
    -e "s|@CPUS@|${MT_SLURM_CPUS:-32}|g" -e "s|@MEM@|${MT_SLURM_MEM_MB:-16000}|g" \
    -e "s|@MUNGE_SOCKET@|$state/munge/munge.socket|g" "$here/slurm.conf.in" >"$state/slurm.conf"
}

start_munge() {
  local munge_dir="$1/munge"
  install -d -m 0700 "$munge_dir"
  dd if=/dev/urandom of="$munge_dir/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$munge_dir/munge.key"
  munged --force --socket="$munge_dir/munge.socket" --key-file="$munge_dir/munge.key" \
    --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" \
    --seed-file="$munge_dir/munged.seed"
  wait_for 10 "munged answering" bash -c "munge -n -S '$munge_dir/munge.socket' | unmunge -S '$munge_dir/munge.socket'"
}

up() {
  local state="$1"
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd and slurmctld run as root here)"
  command -v slurmctld >/dev/null || die "slurmctld is not installed (./setup.sh installs it)"
  [[ ! -e "$state/slurmctld.pid" ]] || down "$state"
  rm -rf "$state"
  mkdir -p "$state"/{ctld,d/localhost,tmp/localhost}
  state="$(cd "$state" && pwd)"
  start_munge "$state"
  local ports
  read -r -a ports <<<"$(free_ports)"
  render_conf "$state" "${ports[0]}" "${ports[1]}"
  export SLURM_CONF="$state/slurm.conf"
  slurmctld
  slurmd -N localhost
  wait_for 20 "node localhost idle" bash -c '[[ "$(sinfo -h -n localhost -o %t)" == idle ]]'
  cat >"$state/env.sh" <<ENV
export SLURM_CONF="$state/slurm.conf"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
ENV
  echo "cluster.sh: up in $state (slurmctld port ${ports[0]}, slurmd port ${ports[1]})" >&2
}

pid_of() { [[ -s "$1" ]] && cat "$1"; }

stop_pid_file() {  # stop_pid_file FILE: TERM the daemon it names, wait up to 15 s, then KILL
  local pid
  pid="$(pid_of "$1")" || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid"
  local tries=150
  while kill -0 "$pid" 2>/dev/null && [[ $tries -gt 0 ]]; do sleep 0.1; tries=$((tries - 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "cluster.sh: $1's process $pid ignored TERM: killed" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

down() {
  local state="$1"
  [[ -d "$state" ]] || return 0
  state="$(cd "$state" && pwd)"
  export SLURM_CONF="$state/slurm.conf"
  if [[ -f "$SLURM_CONF" ]] && scontrol ping >/dev/null 2>&1; then
    scancel --full --user=root 2>/dev/null || true
    local tries=200
    while [[ -n "$(squeue -h -t RUNNING,COMPLETING,PENDING,CONFIGURING,SUSPENDED,REQUEUED -o %i 2>/dev/null)" && $tries -gt 0 ]]; do
      sleep 0.1; tries=$((tries - 1))
    done
  fi
  # slurmd first, so no slurmstepd is left without its daemon; slurmscriptd ends with slurmctld.
  local pid_file
  for pid_file in "$state"/slurmd-*.pid; do stop_pid_file "$pid_file"; done
  stop_pid_file "$state/slurmctld.pid"
  stop_pid_file "$state/munge/munged.pid"
  leftovers "$state"
}

# Every daemon (munged, slurmctld and its slurmscriptd, slurmd, slurmstepd) of this cluster: its
# command line names the state directory or its SLURM_CONF is the cluster's.
leftovers() {
  local state="$1" pid found=0
  for pid in $(pgrep -x '(munged|slurmctld|slurmd|slurmstepd)' 2>/dev/null || true); do
    if { tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$state"; } 2>/dev/null ||
      { tr '\0' '\n' <"/proc/$pid/environ" | grep -q "^SLURM_CONF=$state/"; } 2>/dev/null; then
      echo "cluster.sh: left behind: $pid $(tr '\0' ' ' <"/proc/$pid/cmdline")" >&2
      found=1
    fi
  done
  return $found
}

case "${1:-}" in
  up) [[ $# -eq 2 ]] || die "usage: cluster.sh up DIR"; up "$2" ;;
  down) [[ $# -eq 2 ]] || die "usage: cluster.sh down DIR"; down "$2" ;;
  *) die "usage: cluster.sh up|down DIR" ;;
esac
