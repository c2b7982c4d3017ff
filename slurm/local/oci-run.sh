#!/usr/bin/env bash
# The local cluster's RunTimeRun (oci.conf, written by cluster.sh): runc run, with the task's own
# identity put back into the container's environment first.
#
#   oci-run.sh BUNDLE NODE TASK ID RUNC RUNC_ROOT      (oci.conf: %b %n %t %n.%u.%j.%s.%t ...)
#
# Why: Slurm 22.05 writes the step's environment into the bundle it generates for each node
# (process.env of BUNDLE/config.json) without the per-task variables: inside the container
# SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID and SLURMD_NODENAME are unset (measured here with
# `srun -N2 --container=...`; outside they are set), so every task believes it is task 0. This
# adds them, derived as slurmstepd derives them: the node's index in SLURM_STEP_NODELIST (expanded
# by `scontrol show hostnames`), the tasks on the nodes before it (SLURM_STEP_TASKS_PER_NODE),
# and the node-local task id TASK. The task gets its own copy of the spec (tasks of one node share
# BUNDLE), whose rootfs path Slurm has already made absolute. Logs go to the step's stderr.
set -euo pipefail

log() { printf '[%s] oci-run: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }

[ $# -eq 6 ] || { log "usage: oci-run.sh BUNDLE NODE TASK ID RUNC RUNC_ROOT (got $#)"; exit 2; }
bundle=$1 node=$2 task=$3 id=$4 runc=$5 runc_root=$6
own=$bundle/task-$task
mkdir -p "$own"

/usr/bin/python3 - "$bundle/config.json" "$own/config.json" "$node" "$task" <<'EOF'
import json
import os
import re
import subprocess
import sys

source, target, node, task = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = json.load(open(source))
env = dict(item.split("=", 1) for item in spec["process"]["env"] if "=" in item)
nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
scontrol_env = {**os.environ, **({"SLURM_CONF": env["SLURM_CONF"]} if "SLURM_CONF" in env else {})}
hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], env=scontrol_env,
                       check=True, capture_output=True, text=True).stdout.split()
per_node = []
for part in (env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")).split(","):
    count, times = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part).groups()
    per_node += [int(count)] * int(times or 1)
index = hosts.index(node)
env.update(SLURMD_NODENAME=node, SLURM_NODEID=str(index), SLURM_LOCALID=str(task),
           SLURM_PROCID=str(sum(per_node[:index]) + task))
spec["process"]["env"] = [f"{k}={v}" for k, v in env.items()]
tmp = target + ".tmp"
with open(tmp, "w") as fh:
    json.dump(spec, fh)
os.replace(tmp, target)
EOF

exec "$runc" --root="$runc_root" run "$id" -b "$own"
