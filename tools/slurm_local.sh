#!/usr/bin/env bash
# A real, single-node SLURM on this machine, to run and test the study through Snakemake's SLURM
# executor plugin (docs/slurm.md):
#
#   tools/slurm_local.sh start [--gpus N]   # munge, MariaDB, slurmdbd, slurmctld, slurmd; N GPUs (default 2)
#   tools/slurm_local.sh status             # what runs, the node, the queue; exit 0 only when up
#   tools/slurm_local.sh env                # `export SLURM_CONF=...` for this shell: eval "$(tools/slurm_local.sh env)"
#   tools/slurm_local.sh stop               # cancel every job, stop every daemon; nothing is left running
#
# One node (this host, its real CPUs and memory) in one partition `gpu`, with N GPUs declared as a
# generic resource whose device files are stand-ins (links to /dev/null), so `--gpus=1` jobs are
# scheduled on a host without GPUs: SLURM allocates, binds (CUDA_VISIBLE_DEVICES) and accounts
# them, but no device exists. Accounting is
# slurmdbd on a private MariaDB, because the executor plugin asks `sacct` for job states by
# default (the `squeue` alternative forgets a job MinJobAge after it ends; see docs/slurm.md),
# and validates accounts with `sacctmgr`; the account `ctax` is created for the caller.
#
# Everything lives under $CTAX_SLURM_DIR (default /tmp/connector-tax-<uid>/slurm, 0700): configs,
# munge key and socket, database, state, spool and logs; ports are $CTAX_SLURM_PORT (default
# 16817) to +3 on 127.0.0.1. SLURM's clients find this cluster through SLURM_CONF, and job steps
# (which lose SLURM_CONF) through the link /run/slurm/conf, made while it runs; /etc/slurm is
# never touched (a host with its own /etc/slurm/slurm.conf is refused). Needs root: slurmd runs
# every job as its submitter.
#
# `start` is idempotent (a running daemon is kept; a changed --gpus restarts slurmctld and
# slurmd); `stop` cancels every job, waits for their processes to end and stops every daemon.
# Missing packages: installed with apt-get when root, else one line naming them (exit 1).
# Bad arguments: one line on stderr, exit 2.
set -euo pipefail

prog="slurm_local.sh"
die() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }

packages=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
user="$(id -un)"
state="${CTAX_SLURM_DIR:-/tmp/connector-tax-$(id -u)/slurm}"
port="${CTAX_SLURM_PORT:-16817}"
cluster="ctax-local"
account="ctax"
node="$(hostname -s)"

cmd="${1:-}"
[ $# -gt 0 ] && shift
gpus=2
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) [ $# -ge 2 ] || die "--gpus needs a number"; gpus="$2"; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ "$gpus" =~ ^[0-9]+$ ]] && [ "$gpus" -le 64 ] || die "--gpus: '$gpus' is not a count from 0 to 64"
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1024 ] && [ "$port" -le 65530 ] || die "CTAX_SLURM_PORT: '$port' is not a port from 1024 to 65530"
case "$state" in /*) ;; *) die "CTAX_SLURM_DIR: '$state' is not an absolute path" ;; esac

ctld_port=$port
slurmd_port=$((port + 1))
dbd_port=$((port + 2))
db_port=$((port + 3))
conf="$state/etc/slurm.conf"
export SLURM_CONF="$conf"

# --- installation ------------------------------------------------------------------------------
missing_packages() {
  local p out=()
  for p in slurmctld slurmd sbatch slurmdbd munged mariadbd; do
    command -v "$p" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$p" >/dev/null 2>&1 || out+=("$p")
  done
  echo "${out[*]}"
}

ensure_installed() {
  export PATH="$PATH:/usr/sbin:/sbin"
  [ -z "$(missing_packages)" ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${packages[*]} (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2 \
      || fail "apt-get install ${packages[*]} failed"
    [ -z "$(missing_packages)" ] || fail "still missing after apt-get: $(missing_packages)"
    return 0
  fi
  fail "missing $(missing_packages): install ${packages[*]} (Debian/Ubuntu: sudo apt-get install ${packages[*]})"
}

# --- processes ---------------------------------------------------------------------------------
# A daemon is "ours" when its pid file names a live process whose executable is the daemon.
running() { # name, pidfile
  local pid
  [ -f "$2" ] || return 1
  pid="$(cat "$2" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$1" ]
}

pid_of() { cat "$1"; }

stop_daemon() { # name, pidfile
  local pid i
  running "$1" "$2" || { rm -f "$2"; return 0; }
  pid="$(pid_of "$2")"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ]; then
    say "$1 (pid $pid) did not stop in 10 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
  fi
  rm -f "$2"
}

wait_for() { # what, seconds, command...
  local what="$1" seconds="$2" i
  shift 2
  for i in $(seq 1 $((seconds * 5))); do
    if declare -F "$1" >/dev/null; then
      "$@" >/dev/null 2>&1 && return 0
    else
      timeout 10 "$@" >/dev/null 2>&1 && return 0
    fi
    sleep 0.2
  done
  fail "$what not ready after $seconds s (logs: $state/log)"
}

# --- configuration -----------------------------------------------------------------------------
write_configs() {
  local cpus sockets cores threads mem
  # The node as slurmd sees it (its real CPUs and memory), minus 1 GiB of memory for the daemons.
  read -r cpus sockets cores threads mem < <(slurmd -C | awk '/^NodeName/ {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    print v["CPUs"], v["SocketsPerBoard"], v["CoresPerSocket"], v["ThreadsPerCore"], v["RealMemory"] }')
  mem=$((mem > 2048 ? mem - 1024 : mem))
  local gres_decl="" gres_types=""
  if [ "$gpus" -gt 0 ]; then
    gres_decl="Gres=gpu:$gpus"
    gres_types="GresTypes=gpu"
  fi
  cat >"$conf.new" <<EOF
# Written by tools/slurm_local.sh: a single-node SLURM on $node for connector-tax's tests.
ClusterName=$cluster
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups: this sandbox has none to delegate. Processes are tracked by process group, as
# a cgroup would hold them: by parentage (proctrack/linuxproc) a job's snakemake escapes once
# the batch shell dies of scancel's SIGTERM (it is re-parented to init), and one that hangs
# on the way out (snakemake's SIGTERM handler can deadlock on its scheduler lock) then never
# gets the SIGKILL KillWait seconds later. CPUs are bound with sched_setaffinity
# (task/affinity), which needs no cgroup either.
ProctrackType=proctrack/pgid
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
$gres_types
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
# For slurmdbd this names the munge socket of the accounting connections (they ignore AuthInfo).
AccountingStoragePass=$state/munge/munge.socket
AccountingStorageTRES=gres/gpu
# sacct shows each job's --comment: the executor plugin puts the rule and wildcards there.
AccountingStoreFlags=job_comment
# A job past its time limit gets SIGTERM, then SIGKILL KillWait seconds later.
KillWait=15
OverTimeLimit=0
MinJobAge=300
InactiveLimit=0
SlurmdTimeout=60
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem $gres_decl State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  # SLURM 22.05 drops a GPU declared by Count alone ("Removing file-less GPU ... from final GRES
  # list", Flags=CountOnly too), so each GPU is a stand-in device file: a link to /dev/null that
  # nothing opens (no cgroup device constraint is configured). SLURM then allocates GPUs by index
  # and sets CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS in each job as on a real GPU node.
  rm -f "$state"/dev/gpu*
  if [ "$gpus" -gt 0 ]; then
    local i
    for i in $(seq 0 $((gpus - 1))); do
      ln -s /dev/null "$state/dev/gpu$i"
    done
    if [ "$gpus" = 1 ]; then
      echo "NodeName=$node Name=gpu File=$state/dev/gpu0" >"$state/etc/gres.conf.new"
    else
      echo "NodeName=$node Name=gpu File=$state/dev/gpu[0-$((gpus - 1))]" >"$state/etc/gres.conf.new"
    fi
  else
    : >"$state/etc/gres.conf.new"
  fi
  local changed=0
  for f in "$conf" "$state/etc/gres.conf"; do
    if ! cmp -s "$f.new" "$f"; then
      mv "$f.new" "$f"
      changed=1
    else
      rm -f "$f.new"
    fi
  done
  [ -f "$state/etc/db.pass" ] || (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$state/etc/db.pass")
  (
    umask 077
    cat >"$state/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$state/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=$user
PidFile=$state/run/slurmdbd.pid
LogFile=$state/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$(cat "$state/etc/db.pass")
StorageLoc=slurm_acct_db
EOF
  )
  echo "$changed"
}

# --- start -------------------------------------------------------------------------------------
start_munge() {
  running munged "$state/run/munged.pid" && return 0
  if [ ! -s "$state/munge/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none)
  fi
  munged --force --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" \
    --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" \
    --seed-file="$state/munge/munged.seed" 2>>"$state/log/munged.log" \
    || fail "munged did not start: $(tail -n 1 "$state/log/munged.log")"
  wait_for munged 10 munge --socket="$state/munge/munge.socket" -n
}

sql() { timeout 30 mariadb --socket="$state/db/mysqld.sock" -u root -N -B -e "$1"; }

start_db() {
  running mariadbd "$state/run/mariadbd.pid" && return 0
  if [ ! -d "$state/db/data/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$state/db/data" --user="$user" \
      --auth-root-authentication-method=socket --auth-root-socket-user="$user" --skip-test-db \
      >"$state/log/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed (log: $state/log/mariadb-install.log)"
  fi
  # Detached (setsid, no terminal), listening on 127.0.0.1 only; InnoDB settings as SLURM's docs advise.
  setsid mariadbd --no-defaults --datadir="$state/db/data" --user="$user" --socket="$state/db/mysqld.sock" \
    --bind-address=127.0.0.1 --port="$db_port" --pid-file="$state/run/mariadbd.pid" \
    --log-error="$state/log/mariadb.log" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    --skip-name-resolve </dev/null >/dev/null 2>&1 &
  wait_for MariaDB 60 sql "SELECT 1"
  sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$state/etc/db.pass")';
       ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$state/etc/db.pass")';
       GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurmdbd() {
  running slurmdbd "$state/run/slurmdbd.pid" && return 0
  slurmdbd || fail "slurmdbd did not start (log: $state/log/slurmdbd.log)"
  wait_for slurmdbd 60 sacctmgr -n list cluster
  if [ -z "$(sacctmgr -n -P list cluster "$cluster" format=cluster)" ]; then
    sacctmgr -i add cluster "$cluster" >/dev/null
  fi
}

start_slurmctld() {
  running slurmctld "$state/run/slurmctld.pid" && return 0
  slurmctld -f "$conf" || fail "slurmctld did not start (log: $state/log/slurmctld.log)"
  wait_for slurmctld 60 scontrol ping
}

start_slurmd() {
  running slurmd "$state/run/slurmd.pid" && return 0
  slurmd -f "$conf" || fail "slurmd did not start (log: $state/log/slurmd.log)"
  wait_for "node $node" 60 node_registered
}

node_up() {
  # A node drained or down from an earlier run (a registration with other settings, a killed
  # slurmd) is this private cluster's own: back into service.
  case "$(sinfo -h -n "$node" -o %T)" in
    drain* | down* | fail*) scontrol update NodeName="$node" State=RESUME ;;
  esac
  wait_for "node $node" 60 node_idle
}

node_registered() { [ -n "$(timeout 10 scontrol show node "$node" -o | grep -o 'SlurmdStartTime=[0-9T:-]*')" ]; }

node_idle() {
  local s
  s="$(timeout 10 sinfo -h -n "$node" -o %T 2>/dev/null)"
  case "$s" in idle* | mixed* | allocated*) return 0 ;; *) return 1 ;; esac
}

add_account() {
  if [ -z "$(sacctmgr -n -P list account "$account" format=account)" ]; then
    sacctmgr -i add account "$account" Cluster="$cluster" Description="connector-tax tests" Organization=ctax >/dev/null
  fi
  if [ -z "$(sacctmgr -n -P list assoc user="$user" account="$account" format=user)" ]; then
    sacctmgr -i add user "$user" Account="$account" DefaultAccount="$account" Cluster="$cluster" >/dev/null
  fi
}

# Job steps lose SLURM_CONF: the executor plugin's job step strips every SLURM_* variable before
# its `srun`. SLURM's clients then look in /etc/slurm/slurm.conf, and next in /run/slurm/conf
# (where a configless slurmd keeps its copy), so this cluster's configuration is linked there
# while it runs; a system SLURM's /etc/slurm/slurm.conf would win, so its presence is an error.
link_conf() {
  [ -e /etc/slurm/slurm.conf ] && fail "/etc/slurm/slurm.conf exists: this host has a SLURM of its own, which job steps would use instead"
  if [ -L /run/slurm/conf ] && [ "$(readlink /run/slurm/conf)" = "$state/etc" ]; then
    return 0
  fi
  [ -e /run/slurm/conf ] && fail "/run/slurm/conf exists and is not this cluster's: another SLURM runs here"
  mkdir -p /run/slurm
  ln -s "$state/etc" /run/slurm/conf
}

unlink_conf() {
  if [ -L /run/slurm/conf ] && [ "$(readlink /run/slurm/conf)" = "$state/etc" ]; then
    rm -f /run/slurm/conf
  fi
}

do_start() {
  ensure_installed
  [ "$(id -u)" = 0 ] || fail "start needs root: slurmd starts every job as its submitter, and job steps find this cluster through /run/slurm/conf"
  (umask 077 && mkdir -p "$state")
  chmod 700 "$state"
  mkdir -p "$state"/{etc,munge,run,log,ctld,spool,db,dev}
  chmod 700 "$state/munge"
  local changed
  changed="$(write_configs)"
  link_conf
  if [ "$changed" = 1 ] && { running slurmctld "$state/run/slurmctld.pid" || running slurmd "$state/run/slurmd.pid"; }; then
    say "configuration changed ($gpus GPUs): restarting slurmctld and slurmd"
    cancel_jobs
    stop_daemon slurmd "$state/run/slurmd.pid"
    stop_daemon slurmctld "$state/run/slurmctld.pid"
  fi
  start_munge
  start_db
  start_slurmdbd
  start_slurmctld
  start_slurmd
  node_up
  add_account
  say "up: node $node, $(sinfo -h -n "$node" -o '%c CPUs, %m MB, %G') in partition gpu; account $account"
  echo "export SLURM_CONF=$conf"
}

# --- stop --------------------------------------------------------------------------------------
# Cancel every job of this cluster and wait for their processes (slurmstepd and what it runs) to end.
cancel_jobs() {
  running slurmctld "$state/run/slurmctld.pid" || return 0
  local jobs i
  jobs="$(squeue -h -o %i 2>/dev/null || true)"
  [ -n "$jobs" ] || return 0
  # shellcheck disable=SC2086
  scancel $jobs 2>/dev/null || true
  for i in $(seq 1 150); do
    [ -z "$(squeue -h -o %i 2>/dev/null || true)" ] && [ -z "$(step_pids)" ] && return 0
    sleep 0.2
  done
  say "jobs still listed 30 s after scancel: $(squeue -h -o '%i %T' | tr '\n' ' ')"
}

# Processes of this cluster's job steps: slurmstepd has its job's socket open in our spool dir.
step_pids() {
  local inodes
  inodes="$(awk -v d="$state/spool/" 'index($8, d) == 1 {print $7}' /proc/net/unix 2>/dev/null | sort -u)"
  [ -n "$inodes" ] || return 0
  local fd link
  for fd in /proc/[0-9]*/fd/*; do
    link="$(readlink "$fd" 2>/dev/null)" || continue
    case "$link" in
      socket:\[*\])
        link="${link#socket:[}"
        if grep -qx "${link%]}" <<<"$inodes"; then
          fd="${fd#/proc/}"
          echo "${fd%%/*}"
        fi
        ;;
    esac
  done 2>/dev/null | sort -u
}

do_stop() {
  cancel_jobs
  local left
  left="$(step_pids)"
  if [ -n "$left" ]; then
    say "job step processes left after scancel: $left: SIGKILL"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
  fi
  stop_daemon slurmd "$state/run/slurmd.pid"
  stop_daemon slurmctld "$state/run/slurmctld.pid"
  stop_daemon slurmdbd "$state/run/slurmdbd.pid"
  stop_daemon mariadbd "$state/run/mariadbd.pid"
  stop_daemon munged "$state/run/munged.pid"
  unlink_conf
  say "stopped (state kept in $state)"
}

# --- status ------------------------------------------------------------------------------------
do_status() {
  local up=0 d f
  for d in munged mariadbd slurmdbd slurmctld slurmd; do
    f="$state/run/$d.pid"
    if running "$d" "$f"; then
      echo "$d: running (pid $(pid_of "$f"))"
    else
      echo "$d: not running"
      up=1
    fi
  done
  if [ "$up" = 0 ]; then
    echo "SLURM_CONF=$conf"
    sinfo -N -o '%N %T %c %m %G' || up=1
    squeue -o '%i %j %T %M %l %b %R' || up=1
    node_idle || up=1
  fi
  return "$up"
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  "" | -h | --help) sed -n '2,26p' "$0"; [ -n "$cmd" ] ;;
  *) die "unknown command '$cmd' (start|stop|status|env)" ;;
esac
