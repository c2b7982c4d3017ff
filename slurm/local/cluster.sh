#!/usr/bin/env bash
# A real Slurm cluster on one machine: one slurmctld, N emulated nodes (one slurmd each, in its
# own UTS namespace so `hostname` inside a job prints the node name), a private munged, and two
# partitions over the same nodes: `low` (default, preemptible with requeue) and `high`.
#
#   cluster.sh up | down | status | conf | check | node-up NODE
#
# The state (config, the controller's state, logs, pid files) lives in $HPC_TRAIN_CLUSTER_DIR
# (default: <repo>/.local/cluster), in any folder root can write, however deep, a home of mode 0700
# included. What must not depend on that folder lives in a short place of this cluster's own,
# /run/hpc-train/<first 16 hex of the sha256 of the cluster dir's real path> (one per cluster dir,
# so clusters side by side never share one; `down` removes it):
# - spool/<node>: each slurmd's spool, where slurmstepd makes a Unix socket per job step
#   (<spool>/<node>_<job>.<step>). A socket's path holds at most 107 bytes (sun_path is 108 with
#   its NUL); under a deep checkout every step failed to launch and every job sat held.
# - munge/: munged's key, socket, pid and log. munged runs as the munge user, which cannot cross a
#   0700 folder; $HPC_TRAIN_CLUSTER_DIR/munge links to it.
# `up` refuses (exit 2) a configuration whose longest socket path would not fit, ports past 65535
# or already listened on, or more nodes than the machine's memory holds (`check`). `up` and `down`
# are idempotent; `down` stops only the daemons whose pid files `up` wrote, and removes from
# /etc/hosts only the line `up` added.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${HPC_TRAIN_CLUSTER_DIR:-$repo/.local/cluster}
nodes=${HPC_TRAIN_CLUSTER_NODES:-4}
prefix=${HPC_TRAIN_CLUSTER_NODE_PREFIX:-n}
ctld_port=${HPC_TRAIN_CLUSTER_PORT:-16817}
# The first job id this cluster hands out. Two clusters on one machine (the test suite's workers,
# one cluster each) must not both have a job 41: chaos finds a job's processes by SLURM_JOB_ID.
first_job_id=${HPC_TRAIN_CLUSTER_FIRST_JOB_ID:-1}
# Job ids run from it up to max_job_id (Slurm's default MaxJobId, written into slurm.conf), then
# wrap: the largest a step socket's name can carry.
max_job_id=67043328
if ! [[ "$first_job_id" =~ ^[1-9][0-9]{0,7}$ ]] || ((first_job_id >= max_job_id)); then
  echo "HPC_TRAIN_CLUSTER_FIRST_JOB_ID: not a job id below $max_job_id: $first_job_id" >&2
  exit 2
fi
# How long a requeued job is held (Reason=BeginTime) before it may start again: Slurm 22.05 holds
# it for AuthInfo's cred_expire. 10 s here, the hold of the shipped clusters (requeue_delay=10 on
# Slurm 25.11); Slurm's default is 120 s and ParallelCluster's slurm.conf sets 70 s. Set while the
# cluster runs with another hold, `up` refuses; unset, `up` keeps the running cluster's.
cred_expire=${HPC_TRAIN_CLUSTER_CRED_EXPIRE:-10}
[[ "$cred_expire" =~ ^[0-9]+$ ]] || { echo "HPC_TRAIN_CLUSTER_CRED_EXPIRE: not a number of seconds: $cred_expire" >&2; exit 2; }
# How often Slurm looks for a job to start: every 2 s here, so that the tests' jobs start at
# once. Empty: Slurm's defaults (the main scheduler every 60 s, backfill every 30 s), which
# ParallelCluster keeps; a requeued job whose hold has passed waits for the next pass.
# Set while the cluster runs with others, `up` refuses, as for the hold.
sched_params=${HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS-bf_interval=2,sched_interval=2}
[[ "$sched_params" =~ ^[a-z_=0-9,]*$ ]] || { echo "HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS: not a Slurm option list: $sched_params" >&2; exit 2; }
# A file of slurm.conf lines of the caller's own, `Include`d last, as ParallelCluster includes a
# cluster's CustomSlurmSettings after its own lines (Slurm keeps the last value of a keyword).
include=${HPC_TRAIN_CLUSTER_INCLUDE:-}
[ -z "$include" ] || [[ "$include" = /* && -f "$include" ]] || { echo "HPC_TRAIN_CLUSTER_INCLUDE: not an absolute path to a file: $include" >&2; exit 2; }
# What one node's job needs in memory (MB of unique memory, PSS): the launcher, the torchrun agent
# and one CPU rank of the tiny preset, measured on this machine 528 MB (28 + 166 + 333; a hollow
# node, submit --hollow, 364: 28 + 166 + 169; docs/benchmarks.md, bench-scale), with a margin.
# `up` refuses a size the machine cannot hold.
node_mb=${HPC_TRAIN_CLUSTER_NODE_MB:-600}
[[ "$node_mb" =~ ^[1-9][0-9]*$ ]] || { echo "HPC_TRAIN_CLUSTER_NODE_MB: not a number of MB: $node_mb" >&2; exit 2; }
[[ "$nodes" =~ ^[1-9][0-9]{0,3}$ ]] || { echo "HPC_TRAIN_CLUSTER_NODES: not a node count: $nodes" >&2; exit 2; }
conf=$dir/etc/slurm.conf
hosts_tag="# hpc-train local cluster $dir"
short_root=/run/hpc-train
# A step id with the most digits: the extern step (0xfffffffc; the batch step, 0xfffffffb, has as
# many); a job's own steps count up from 0.
longest_step=4294967292
sun_path_max=107 # bytes of a Unix socket's path (sockaddr_un.sun_path: 108 with the final NUL)

log() { printf '[%s] cluster: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
refuse() { log "error: $*"; exit 2; } # a configuration that cannot work: nothing was started

node_names() { local i; for ((i = 1; i <= nodes; i++)); do printf '%s%d\n' "$prefix" "$i"; done; }

# alive, and not a zombie (a killed daemon whose parent does not reap it still answers kill -0)
pid_alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"
}
pid_of() { if [ -s "$1" ]; then cat "$1"; fi; }

# short_place: this cluster's short place under /run (see the header), named from the cluster
# dir's real path.
short_place() {
  echo "$short_root/$(realpath -m "$dir" | sha256sum | cut -c1-16)"
}

# munge_dir: where this cluster's munged keeps its key, socket, pid and log. A clone made before
# the /run place (a real $dir/munge) keeps it while its munged runs, until `down`.
munge_dir() {
  if [ -d "$dir/munge" ] && [ ! -L "$dir/munge" ] && pid_alive "$(pid_of "$dir/munge/munged.pid")"; then
    echo "$dir/munge"
  else
    echo "$(short_place)/munge"
  fi
}

# The longest Unix socket path this configuration makes: a step socket of the longest node name
# for the largest job id and the longest step id, and munged's socket.
longest_socket() {
  local name longest="" sock munge_sock
  while read -r name; do [ "${#name}" -le "${#longest}" ] || longest=$name; done < <(node_names)
  sock="$(short_place)/spool/$longest/${longest}_$max_job_id.$longest_step"
  munge_sock="$(munge_dir)/munge.socket"
  if [ "${#munge_sock}" -gt "${#sock}" ]; then echo "$munge_sock"; else echo "$sock"; fi
}

# node_port: the port of node number $1's slurmd (the controller's, then 3 more, then one a node)
node_port() { echo $((ctld_port + 3 + $1)); }

# ports_in_use: which of this cluster's ports (the controller's to the last node's) something
# listens on already (another cluster whose range overlaps, any other daemon)
ports_in_use() {
  local last
  last=$(node_port "$nodes")
  ss -Hltn 2>/dev/null | awk -v lo="$ctld_port" -v hi="$last" \
    '{ n = split($4, a, ":"); p = a[n] + 0; if (p >= lo && p <= hi) print p }' | sort -nu | paste -sd' '
}

# any_daemon_alive: this cluster's slurmctld or any of its slurmds runs (slurmctld stopped alone
# by a test leaves the slurmds on their ports)
any_daemon_alive() {
  local name
  pid_alive "$(pid_of "$dir/run/slurmctld.pid")" && return 0
  while read -r name; do
    pid_alive "$(pid_of "$dir/run/slurmd-$name.pid")" && return 0
  done < <(node_names)
  return 1
}

# available_mb: memory the kernel can give without swapping (MemAvailable)
available_mb() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }

# check: refuse a configuration that cannot work (one line, exit 2) before anything starts: a
# socket path over 107 bytes; ports past 65535 or already taken; more nodes than the memory holds
# (HPC_TRAIN_CLUSTER_NODE_MB each). Prints the longest socket path, the ports and the memory.
# A cluster with any daemon up is not checked again for ports and memory (they are its own).
cmd_check() {
  local sock last taken need avail
  sock=$(longest_socket)
  [ "${#sock}" -le "$sun_path_max" ] || refuse "a Unix socket path of this cluster would be ${#sock} bytes, over the $sun_path_max a socket holds: $sock (shorten HPC_TRAIN_CLUSTER_NODE_PREFIX '$prefix')"
  echo "longest socket path: ${#sock} of $sun_path_max bytes: $sock"
  if any_daemon_alive; then return 0; fi
  last=$(node_port "$nodes")
  ((last <= 65535)) || refuse "$nodes nodes from port $ctld_port need ports up to $last, past 65535: lower HPC_TRAIN_CLUSTER_PORT"
  taken=$(ports_in_use)
  [ -z "$taken" ] || refuse "ports $ctld_port-$last (slurmctld, then one a node) are taken already: $taken: another cluster? choose another HPC_TRAIN_CLUSTER_PORT"
  echo "ports: $ctld_port-$last"
  need=$((nodes * node_mb))
  avail=$(available_mb)
  ((need <= avail)) || refuse "$nodes nodes need $nodes x $node_mb MB = $need MB (HPC_TRAIN_CLUSTER_NODE_MB: one node's launcher, torchrun agent and rank), over the $avail MB this machine has available: ask fewer nodes"
  echo "memory: $nodes nodes x $node_mb MB = $need MB of $avail MB available"
}

# daemons_mb: the unique memory (PSS, MB) of the running slurmds, summed
daemons_mb() {
  local name pid kb=0 one
  while read -r name; do
    pid=$(pid_of "$dir/run/slurmd-$name.pid")
    pid_alive "$pid" || continue
    one=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
    kb=$((kb + ${one:-0}))
  done < <(node_names)
  echo $((kb / 1024))
}

write_config() {
  local cpus host
  cpus=$(nproc)
  host=$(hostname -s)
  mkdir -p "$dir"/{etc,log,run,spool/ctld}
  {
    echo "# Generated by slurm/local/cluster.sh — local emulated cluster, do not edit."
    echo "ClusterName=hpctrain"
    echo "FirstJobId=$first_job_id"
    echo "MaxJobId=$max_job_id"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ctld_port"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # Private munged socket; cred_expire: see above (a requeued job's hold).
    echo "AuthInfo=socket=$(munge_dir)/munge.socket,cred_expire=$cred_expire"
    echo "StateSaveLocation=$dir/spool/ctld"
    # Short whatever the checkout path: slurmstepd makes each step's socket here (see the header).
    echo "SlurmdSpoolDir=$(short_place)/spool/%n"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "JobCompType=jobcomp/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core_Memory"
    echo "DefMemPerCPU=500"
    [ -z "$sched_params" ] || echo "SchedulerParameters=$sched_params"
    echo "ReturnToService=2"
    echo "KillWait=10"
    # A node whose slurmd stops answering is DOWN after 20 s and its --requeue jobs are requeued.
    echo "SlurmdTimeout=20"
    echo "InactiveLimit=0"
    echo "MinJobAge=600"
    # Preemption between partitions: the high partition requeues jobs of the low one. On Slurm
    # 22.05 the user signal at preemption is this SlurmctldParameters switch (newer Slurm moved it
    # to PreemptParameters=send_user_signal).
    echo "PreemptType=preempt/partition_prio"
    echo "PreemptMode=REQUEUE"
    echo "SlurmctldParameters=preempt_send_user_signal"
    local i=0 name
    while read -r name; do
      i=$((i + 1))
      echo "NodeName=$name NodeAddr=127.0.0.1 Port=$(node_port "$i") CPUs=$cpus RealMemory=2000 State=UNKNOWN"
    done < <(node_names)
    echo "PartitionName=low Nodes=${prefix}[1-$nodes] Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=30 MaxTime=INFINITE State=UP"
    echo "PartitionName=high Nodes=${prefix}[1-$nodes] PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP"
    [ -z "$include" ] || echo "Include $include"
  } >"$conf.tmp"
  mv "$conf.tmp" "$conf"
}

# Slurm's own OCI support (srun --container=BUNDLE; Slurm's containers guide, oci.conf(5)):
# slurmstepd runs the step through runc with the "run" operation the guide suggests (no polling),
# by way of oci-run.sh, which gives each task back its identity (Slurm 22.05 leaves SLURM_PROCID
# and the like out of the container's environment; see there). Jobs run as root here, so runc runs
# rootful, its state under the cluster's own directory; a container id is unique per node, step
# and task. Rewritten at every `up` (slurmstepd reads it for each step).
write_oci_conf() {
  local runc id state=$dir/run/runc
  runc=$(command -v runc) || die "runc is not installed: run 'make install-system'"
  id='%n.%u.%j.%s.%t'
  mkdir -p "$state"
  {
    echo "# Generated by slurm/local/cluster.sh — Slurm's OCI container support, do not edit."
    echo "RunTimeQuery=\"$runc --root=$state state $id\""
    echo "RunTimeKill=\"$runc --root=$state kill -a $id\""
    echo "RunTimeDelete=\"$runc --root=$state delete --force $id\""
    # exec: slurmstepd runs the pattern with /bin/sh -c, and dash stays as the task's process
    # without it; a signal to the step (the notice's USR2) then killed that shell (default action)
    # and ended the step while the container ran on, orphaned. With exec the task is runc, which
    # passes each signal to the container's first process, the launcher, as a task gets it outside.
    echo "RunTimeRun=\"exec $here/oci-run.sh %b %n %t $id $runc $state\""
  } >"$dir/etc/oci.conf.tmp"
  mv "$dir/etc/oci.conf.tmp" "$dir/etc/oci.conf"
}

# /etc/hosts may be a bind mount (containers): rewrite it in place, never rename over it. Two
# clusters side by side (the test workers', a test's own) edit it under one lock, so that neither
# loses the other's line; a name that resolves only through another cluster's line gets a line of
# this cluster's too (that cluster's `down` takes its own line away with it). A cluster's line is
# the one its tag ends (the tag of .local/cluster is a prefix of .local/cluster-gw1's).
hosts_add() {
  local missing=0 name lent
  [ -z "$(hosts_lines own)" ] || return 0
  lent=$(sed -n '/# hpc-train local cluster /s/#.*//p' /etc/hosts)
  while read -r name; do
    getent hosts "$name" >/dev/null && ! grep -qw -- "$name" <<<"$lent" || missing=1
  done < <(node_names)
  [ "$missing" -eq 1 ] || return 0
  [ -w /etc/hosts ] || die "node names ${prefix}1..${prefix}$nodes do not resolve and /etc/hosts is not writable; add: 127.0.0.1 $(node_names | tr '\n' ' ')"
  hosts_locked hosts_append
  touch "$dir/run/hosts-added"
  log "added node names to /etc/hosts"
}

hosts_remove() {
  [ -e "$dir/run/hosts-added" ] || return 0
  hosts_locked hosts_drop
  rm -f "$dir/run/hosts-added"
  log "removed node names from /etc/hosts"
}

# hosts_lines own|others: the lines of /etc/hosts that this cluster's tag ends, or every other one
hosts_lines() {
  TAG=$hosts_tag WANT=$1 awk '{
    t = ENVIRON["TAG"]; n = length(t)
    own = length($0) >= n && substr($0, length($0) - n + 1) == t
    if (own == (ENVIRON["WANT"] == "own")) print
  }' /etc/hosts
}

hosts_append() { printf '127.0.0.1 %s %s\n' "$(node_names | paste -sd' ')" "$hosts_tag" >>/etc/hosts; }

hosts_drop() {
  local kept
  kept=$(hosts_lines others)
  printf '%s\n' "$kept" >/etc/hosts
}

# hosts_locked CMD...: CMD with an exclusive lock on /etc/hosts held
hosts_locked() {
  local fd
  exec {fd}</etc/hosts
  flock -w 30 "$fd" || die "/etc/hosts: locked by another process for 30 s"
  "$@"
  exec {fd}<&-
}

start_munge() {
  local mdir
  mdir=$(munge_dir)
  if pid_alive "$(pid_of "$mdir/munged.pid")"; then return 0; fi
  id munge >/dev/null 2>&1 || die "no 'munge' user: install the munge package (make install-system)"
  # /run/hpc-train and this cluster's place in it (root, 0755), munge's folder there (munge, 0711:
  # any local user, and a container's root without CAP_DAC_OVERRIDE, reaches the socket, as
  # /var/run/munge (0755) on ParallelCluster; the key stays 0400 munge). Reached by munge whatever
  # the checkout's mode.
  [ -L "$dir/munge" ] || rm -rf "$dir/munge" # the layout before: munge's files in the checkout
  install -d -m 0755 -o root -g root "$short_root" "$(short_place)"
  install -d -m 0711 -o munge -g munge "$mdir"
  ln -sfn "$mdir" "$dir/munge"
  printf '%s\n' "$dir" >"$mdir/cluster-dir.tmp" && mv "$mdir/cluster-dir.tmp" "$mdir/cluster-dir"
  if [ ! -s "$mdir/munge.key" ]; then
    # A key for this cluster alone, readable only by munge.
    dd if=/dev/urandom of="$mdir/munge.key" bs=1024 count=1 status=none
  fi
  chown munge:munge "$mdir/munge.key"
  chmod 0400 "$mdir/munge.key"
  # munged refuses to run as root.
  runuser -u munge -- munged --force \
    --key-file="$mdir/munge.key" --socket="$mdir/munge.socket" \
    --pid-file="$mdir/munged.pid" --log-file="$mdir/munged.log" \
    --seed-file="$mdir/munged.seed"
  log "munged started (its files in $mdir)"
}

# stop_munge: munged stopped, and the link to its /run folder removed (not a clone's own
# $dir/munge); the folder goes with the short place (remove_short_place).
stop_munge() {
  local mdir
  mdir=$(readlink "$dir/munge" || true)
  stop_pid "$dir/munge/munged.pid" munged
  case "$mdir" in
    # /run/hpc-train-munge/*: where a cluster brought up before the short place kept munge's files
    "$short_root"/* | /run/hpc-train-munge/*) rm -rf "$mdir" && rm -f "$dir/munge" ;;
  esac
}

# remove_short_place: once every daemon has stopped, the spools and munge's files go with it.
remove_short_place() {
  local place
  place=$(short_place)
  [ -d "$place" ] || return 0
  rm -rf "$place"
  log "removed $place"
}

start_ctld() {
  pid_alive "$(pid_of "$dir/run/slurmctld.pid")" && return 0
  slurmctld -f "$conf"
  log "slurmctld started on port $ctld_port"
}

start_node() { # name: its slurmd, unless running
  local name=$1
  pid_alive "$(pid_of "$dir/run/slurmd-$name.pid")" && return 0
  mkdir -p "$(short_place)/spool/$name"
  # Own UTS namespace: the node's processes see `hostname` = node name.
  # shellcheck disable=SC2016  # $1/$2 expand in the inner shell
  unshare --uts bash -c 'hostname "$1" && exec slurmd -N "$1" -f "$2"' _ "$name" "$conf"
}

start_nodes() {
  local name
  while read -r name; do start_node "$name"; done < <(node_names)
}

# One node's slurmd started again (one killed to emulate a lost node), the other nodes and
# their states untouched: unlike `up`, it resumes nothing.
cmd_node_up() {
  local name=${1:-}
  node_names | grep -qx -- "$name" || die "node-up: no node '$name' here ($(node_names | paste -sd ' '))"
  pid_alive "$(pid_of "$dir/run/slurmctld.pid")" || die "node-up: the cluster is down: run '$0 up'"
  close_inherited_fds
  export SLURM_CONF=$conf
  start_node "$name"
  local deadline=$((SECONDS + 15))
  until pid_alive "$(pid_of "$dir/run/slurmd-$name.pid")"; do # slurmd writes it once detached
    ((SECONDS < deadline)) || die "node-up: $name's slurmd did not start; see $dir/log/slurmd-$name.log"
    sleep 0.2
  done
  log "node-up: $name's slurmd running"
}

wait_ready() {
  local deadline=$((SECONDS + 60 + nodes)) idle
  until scontrol ping >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "slurmctld did not answer in 60 s; see $dir/log/slurmctld.log"
    sleep 0.5
  done
  # Nodes left DOWN/DRAIN by an earlier run (e.g. a node-failure test) come back here.
  scontrol update nodename="${prefix}[1-$nodes]" state=resume >/dev/null 2>&1 || true
  while :; do
    idle=$(sinfo -h -p low -N -o '%N %t' | awk '$2 ~ /^(idle|mix|alloc)$/' | wc -l)
    [ "$idle" -ge "$nodes" ] && break
    ((SECONDS < deadline)) || die "only $idle of $nodes nodes came up; see $dir/log/"
    sleep 0.5
  done
}

close_inherited_fds() {
  # The daemons must not inherit our caller's descriptors: `flock LOCK make cluster-up` would
  # otherwise leave the lock held by munged for as long as the cluster runs. 255: bash's own.
  local fd
  for fd in "/proc/$$/fd/"*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] && [ "$fd" -ne 255 ]; then eval "exec $fd>&-"; fi
  done
}

running_sched_params() { sed -n 's/^SchedulerParameters=//p' "$conf"; }

cmd_up() {
  cmd_check >/dev/null
  command -v slurmctld >/dev/null || die "Slurm is not installed: run 'make install-system'"
  close_inherited_fds
  mkdir -p "$dir/run"
  export SLURM_CONF=$conf
  if ! pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; then
    write_config
  elif [ -n "${HPC_TRAIN_CLUSTER_CRED_EXPIRE:-}" ] && ! grep -q "cred_expire=$cred_expire\$" "$conf"; then
    die "the cluster is up with another requeue hold than cred_expire=$cred_expire ($(grep -o 'cred_expire=[0-9]*' "$conf")): run '$0 down' first"
  elif [ -n "${HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS+set}" ] && [ "$(running_sched_params)" != "$sched_params" ]; then
    die "the cluster is up with SchedulerParameters '$(running_sched_params)', not '$sched_params': run '$0 down' first"
  fi
  write_oci_conf
  hosts_add
  start_munge
  start_ctld
  start_nodes
  wait_ready
  local slurmds
  slurmds=$(daemons_mb)
  log "up: $nodes nodes, partitions low (preemptible) and high; slurmds $slurmds MB in all (PSS, $((slurmds / nodes)) MB a node), a node's job about $node_mb MB more (HPC_TRAIN_CLUSTER_NODE_MB); $(available_mb) MB available now"
  echo "export SLURM_CONF=$conf"
}

stop_pid() { # pidfile name
  local pid
  pid=$(pid_of "$1")
  pid_alive "$pid" || return 0
  kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while pid_alive "$pid"; do
    if ((SECONDS >= deadline)); then kill -9 "$pid" 2>/dev/null || true; fi
    sleep 0.2
  done
  log "stopped $2 (pid $pid)"
}

cmd_down() {
  export SLURM_CONF=$conf
  local name pidfiles=()
  # Read pid files first: the daemons delete them when they exit.
  for name in $(node_names); do pidfiles+=("$dir/run/slurmd-$name.pid:slurmd $name:$(pid_of "$dir/run/slurmd-$name.pid")"); done
  if pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; then
    scancel --full --quiet --user="$(id -un)" >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 40))
    while [ -n "$(squeue -h -t R,CG,CF -o %i 2>/dev/null)" ] && ((SECONDS < deadline)); do sleep 0.5; done
  fi
  local entry pid label
  for entry in "${pidfiles[@]}"; do
    pid=${entry##*:}
    if pid_alive "$pid"; then kill "$pid" 2>/dev/null || true; fi
  done
  for entry in "${pidfiles[@]}"; do
    label=${entry#*:}; pid=${label##*:}; label=${label%:*}
    [ -n "$pid" ] || continue
    while pid_alive "$pid"; do sleep 0.2; done
    log "stopped $label (pid $pid)"
  done
  stop_pid "$dir/run/slurmctld.pid" slurmctld
  stop_munge
  remove_short_place
  hosts_remove
  log "down"
}

cmd_status() {
  export SLURM_CONF=$conf
  if ! pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; then
    echo "local cluster: down (state in $dir)"
    return 3
  fi
  echo "local cluster: up (export SLURM_CONF=$conf)"
  sinfo
  squeue
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  node-up) cmd_node_up "${2:-}" ;;
  conf) echo "$conf" ;;
  check) cmd_check ;;
  *) echo "usage: $0 up|down|status|conf|check|node-up NODE" >&2; exit 2 ;;
esac
