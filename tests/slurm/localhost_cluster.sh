# shellcheck shell=bash
# A throw-away one-node Slurm cluster on this machine, for tests: sourced, not run.
#   slurm_cluster_start DIR   writes DIR/slurm.conf, starts munged, slurmctld and slurmd (all
#                             private to DIR: own munge key and socket, free ports), exports
#                             SLURM_CONF and waits until the node is idle. Returns 1 on failure.
#   slurm_cluster_stop        stops what slurm_cluster_start started (safe to call twice).
#   slurm_cluster_logs        prints the daemons' logs.
#   slurm_check_begin NAME    the start of a check script that submits to such a cluster: exits 77
#                             (skipped) unless root with Slurm and munge installed; clears the
#                             environment of any surrounding job; makes $tmp (/tmp/NAME.XXXXXX),
#                             removed at exit with the cluster stopped and a running sbatch
#                             ($sbatch_pid) killed; defines fail MESSAGE (prints the job logs
#                             in $tmp/submit/logs and the daemons', exits 1).
# Runs in containers without systemd or cgroups: daemons run in the foreground (-D/-F) as
# background jobs of this shell, with process tracking by /proc walking and no task plugin.

_slurm_pids=()

_slurm_free_ports() {  # prints N distinct TCP ports that are free right now
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

slurm_cluster_start() {
  local dir=$1 node_line cpus mem ctld_port slurmd_port
  SLURM_CLUSTER_DIR=$dir
  mkdir -p "$dir"/{state,spool,log,munge}
  # The node's real shape, so that slurmd does not drain itself for a CPU/memory mismatch.
  node_line=$(slurmd -C | head -n1) || { echo "slurmd -C failed" >&2; return 1; }
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
  read -r ctld_port slurmd_port < <(_slurm_free_ports 2)

  # munge: a fresh key and a private socket, so that a system munged (if any) is neither needed
  # nor disturbed. --force: munged otherwise refuses to start when a folder above its socket is
  # not searchable by every user, as mktemp -d folders are (0700).
  chmod 711 "$dir/munge"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  munged -F --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed" \
    --log-file=/dev/null >>"$dir/log/munged.out" 2>&1 &
  _slurm_pids+=($!)

  cat >"$dir/slurm.conf" <<CONF
ClusterName=gpipecheck
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
# No *LogFile: the daemons run with -D and log to stderr, which goes to log/*.out.
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
# No systemd/cgroups in a container: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=check Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf

  local i
  for i in $(seq 50); do [ -S "$dir/munge/socket" ] && break; sleep 0.1; done
  [ -S "$dir/munge/socket" ] || { echo "munged did not start" >&2; return 1; }
  slurmctld -D -i >>"$dir/log/slurmctld.out" 2>&1 &
  _slurm_pids+=($!)
  slurmd -D -N localhost >>"$dir/log/slurmd.out" 2>&1 &
  _slurm_pids+=($!)

  local state=""
  for i in $(seq 60); do
    state=$(sinfo -h -n localhost -o %t 2>/dev/null) || true
    [ "$state" = idle ] && return 0
    sleep 1
  done
  echo "the node did not become idle within 60 s (sinfo state: '${state:-none}')" >&2
  return 1
}

slurm_cluster_stop() {
  local pid i
  # Jobs first: slurmstepd and the tasks outlive a stopped slurmd by design.
  local jobs=()
  [ ${#_slurm_pids[@]} -gt 0 ] && mapfile -t jobs < <(squeue -h -o %i 2>/dev/null)
  if [ ${#jobs[@]} -gt 0 ]; then
    scancel --full "${jobs[@]}" 2>/dev/null
    for i in $(seq 30); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
  # Newest first: slurmd, then slurmctld, then munged, which both of them need until the end.
  for ((i = ${#_slurm_pids[@]} - 1; i >= 0; i--)); do
    pid=${_slurm_pids[i]}
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  _slurm_pids=()
}

slurm_cluster_logs() {
  local f
  for f in "$SLURM_CLUSTER_DIR"/log/*; do
    [ -s "$f" ] || continue
    echo "----- $f (last 40 lines)"; tail -n 40 "$f"
  done
}

slurm_check_begin() {
  local b
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: the daemons run as SlurmUser=root; run as root"; exit 77; }
  for b in munged slurmctld slurmd sbatch srun sinfo scontrol squeue scancel python3; do
    command -v "$b" >/dev/null || { echo "SKIP: $b is not installed (OURGPIPE_WITH_SLURM=1 scripts/install-deps.sh)"; exit 77; }
  done
  slurmd -C >/dev/null 2>&1 || { echo "SKIP: slurmd -C cannot read this machine's CPUs and memory"; exit 77; }

  # Run as if outside any job: a surrounding allocation (CI on a Slurm cluster) or a torchrun-style
  # environment would otherwise make a one-process reference run join someone else's job.
  local inherited
  mapfile -t inherited < <(compgen -e | grep -E '^(SLURM_|SRUN_|SBATCH_|ORION_GPUD)')
  unset "${inherited[@]}" RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OURGPIPE_ROOT

  tmp=$(mktemp -d "/tmp/$1.XXXXXX")
  chmod 711 "$tmp"  # munged wants its socket reachable by every user
  sbatch_pid=""
  trap '[ -z "$sbatch_pid" ] || kill "$sbatch_pid" 2>/dev/null; slurm_cluster_stop; rm -rf "$tmp"' EXIT
  trap 'exit 1' INT TERM HUP  # so that the EXIT trap stops the daemons when ctest times out
}

fail() {
  local f
  echo "FAIL: $*"
  for f in "$tmp"/submit/logs/*; do
    echo "----- job log $f"
    cat "$f"
  done
  slurm_cluster_logs
  exit 1
}
