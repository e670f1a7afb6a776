# A private Slurm for the tests of tests/slurm (sourced, not run): munged,
# slurmctld and slurmd of this machine's Debian packages, with their own
# ports, key, sockets and state under one temporary directory, stopped by
# their recorded pids when the script exits (also on failure). Needs root:
# slurmd starts job steps as the submitting user and munged as user munge.
# Without root (and without passwordless sudo to get it) the tests FAIL,
# loudly: they are part of the suite, not optional.
#
# Provides: slurm_up (starts everything, waits for the node to be idle),
# the client commands with SLURM_CONF set, job_state JOB, wait_state JOB
# STATE... , wait_done JOB..., and the e2e helpers (pass, fail, same, ...)
# of tests/e2e/lib.bash.
source "$PD_SRC/tests/e2e/lib.bash"

if [ "$(id -u)" -ne 0 ]; then
  if sudo -n true 2>/dev/null; then
    exec sudo -n --preserve-env=PD_BUILD,PD_SRC,PATH bash "$0" "$@"
  fi
  echo "FAIL - tests/slurm needs root (or passwordless sudo) to run munged, slurmctld and slurmd" >&2
  exit 1
fi
"$PD_SRC/scripts/setup.sh"

SL="$E2E_TMP/slurm"       # every file of the private cluster
mkdir -p "$SL"/{munge,state,spool/localhost,log,work}
chmod 755 "$E2E_TMP" "$SL" "$SL/work"
SLURM_PIDS=()

slurm_down() {
  local p
  # reverse start order; each daemon was started by this script and recorded
  for ((i = ${#SLURM_PIDS[@]} - 1; i >= 0; i--)); do
    p="${SLURM_PIDS[$i]}"
    kill "$p" 2>/dev/null || true
  done
  for p in "${SLURM_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  # munged forks into the background: its pid file names it
  if [ -s "$SL/munge/munged.pid" ]; then kill "$(cat "$SL/munge/munged.pid")" 2>/dev/null || true; fi
}
# PD_SLURM_KEEP=1 keeps the directory (logs of the daemons and jobs) for a look afterwards
trap 'slurm_down; [ "${PD_SLURM_KEEP:-0}" = 1 ] && echo "# kept $E2E_TMP" || rm -rf "$E2E_TMP"' EXIT

# ports a private to this run (two test runs on one machine do not meet)
SLURM_PORT_BASE=$(( 20000 + ($$ % 2000) * 4 ))

slurm_up() {
  # munge: a private key and socket, the daemon as user munge
  mungekey --create --keyfile="$SL/munge/munge.key" --force >/dev/null 2>&1 \
    || dd if=/dev/urandom of="$SL/munge/munge.key" bs=128 count=1 2>/dev/null
  chown -R munge:munge "$SL/munge"
  chmod 755 "$SL/munge"
  chmod 400 "$SL/munge/munge.key"
  runuser -u munge -- /usr/sbin/munged --socket="$SL/munge/munge.socket.2" --key-file="$SL/munge/munge.key" \
    --pid-file="$SL/munge/munged.pid" --log-file="$SL/munge/munged.log" --seed-file="$SL/munge/munged.seed" \
    || { echo "FAIL - munged did not start:"; cat "$SL/munge/munged.log" 2>/dev/null; exit 1; }

  cat > "$SL/slurm.conf" <<EOF
ClusterName=pdtest
SlurmctldHost=localhost
SlurmctldPort=$SLURM_PORT_BASE
SlurmdPort=$((SLURM_PORT_BASE + 1))
SrunPortRange=$((SLURM_PORT_BASE + 100))-$((SLURM_PORT_BASE + 199))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SL/munge/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool/%n
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/log/slurmctld.log
SlurmdLogFile=$SL/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=${PD_SLURM_KILLWAIT:-2}
InactiveLimit=0
MinJobAge=600
# job ids of this cluster only (pmix keeps per-step files under /tmp named by job id)
FirstJobId=$((1000 + ($$ % 100000) * 100))
NodeName=localhost CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF="$SL/slurm.conf"
  slurmctld -D -c -i -f "$SLURM_CONF" >"$SL/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -N localhost -f "$SLURM_CONF" >"$SL/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  local st=""
  for _ in $(seq 1 200); do
    st=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    [ "$st" = idle ] && break
    sleep 0.1
  done
  if [ "$st" != idle ]; then
    echo "FAIL - the private Slurm did not come up (node state '$st'):"
    tail -5 "$SL/log/slurmctld.log" "$SL/log/slurmd.log" "$SL/log/"*.out 2>/dev/null
    exit 1
  fi
  echo "# private Slurm up: slurmctld port $SLURM_PORT_BASE, state in $SL"
}

# job_state JOB: its state (PENDING, RUNNING, COMPLETED, FAILED, ...)
job_state() {
  scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1
}

# job_field JOB FIELD: one field of scontrol show job (e.g. ExitCode, Restarts)
job_field() {
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# wait_state JOB SECONDS STATE...: waits until JOB is in one of STATEs
wait_state() {
  local j="$1" t="$2"; shift 2
  local s
  for _ in $(seq 1 $((t * 10))); do
    s=$(job_state "$j")
    for want in "$@"; do [ "$s" = "$want" ] && return 0; done
    sleep 0.1
  done
  echo "# job $j: state '$s' after $t s, wanted $*"
  return 1
}

# wait_done SECONDS JOB...: waits until no JOB (array ids included) is pending or running
wait_done() {
  local t="$1"; shift
  for _ in $(seq 1 $((t * 10))); do
    if [ -z "$(squeue -h -j "$(IFS=,; echo "$*")" -o %i 2>/dev/null)" ]; then return 0; fi
    sleep 0.1
  done
  echo "# jobs $* still queued after $t s:"; squeue -j "$(IFS=,; echo "$*")" 2>&1 | head
  return 1
}
