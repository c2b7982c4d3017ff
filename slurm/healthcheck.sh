#!/usr/bin/env bash
# GPU node health check for Slurm: use as Prolog= or HealthCheckProgram= in slurm.conf.
#
# Runs `python -m nccl_checks gpu --drain` on this node (NVML: GPU count for the instance type,
# uncorrectable ECC, retired pages / row remaps, temperature and throttling, persistence mode,
# NVLinks, XIDs in the kernel log). On failure the node is drained with the check's reason and the
# script exits 1 (as a prolog, Slurm then requeues the job). Where there is no NVIDIA driver the
# check is skipped with a message and the script exits 0. If the check itself cannot run (broken
# Python, timeout) it logs loudly and exits 0, so a bad deployment does not drain the whole fleet;
# NCCL_CHECKS_STRICT=1 makes that exit 1 instead.
#
# Environment (all optional):
#   NCCL_CHECKS_PYTHON         Python with hpc-train importable (default: <repo>/.venv/bin/python)
#   NCCL_CHECKS_INSTANCE_TYPE  expected instance type (default: p3dn.24xlarge)
#   NCCL_CHECKS_NODE           Slurm node name to drain (default: $SLURMD_NODENAME, else hostname)
#   NCCL_CHECKS_LOG            also append the log to this file
#   NCCL_CHECKS_TIMEOUT        seconds for the check (default 50; HealthCheckProgram dies at 60)
#   NCCL_CHECKS_STATE          judge a recorded state (`gpu --json` output) instead of NVML
#   NCCL_CHECKS_STRICT         1: exit 1 when the check could not run
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
python=${NCCL_CHECKS_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
itype=${NCCL_CHECKS_INSTANCE_TYPE:-p3dn.24xlarge}
node=${NCCL_CHECKS_NODE:-${SLURMD_NODENAME:-$(hostname -s)}}
timeout_s=${NCCL_CHECKS_TIMEOUT:-50}
logfile=${NCCL_CHECKS_LOG:-}

log() {
  local line
  line="[$(date -u +%FT%TZ)] healthcheck $node: $*"
  printf '%s\n' "$line" >&2
  if [ -n "$logfile" ]; then printf '%s\n' "$line" >>"$logfile"; fi
}

export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
args=(-m nccl_checks gpu --instance-type "$itype" --node "$node" --drain)
if [ -n "${NCCL_CHECKS_STATE:-}" ]; then args+=(--state "$NCCL_CHECKS_STATE"); fi

status=0
output=$(timeout "$timeout_s" "$python" "${args[@]}" 2>&1) || status=$?
while IFS= read -r line; do log "  $line"; done <<<"$output"
summary=$(printf '%s\n' "$output" | tail -n 1)
# Exit 1 is a verdict only with its UNHEALTHY line; anything else exiting 1 did not check.
outcome=$status
if [ "$status" -eq 1 ] && [[ $summary != UNHEALTHY:* ]]; then outcome=error; fi

case "$outcome" in
  0)
    log "ok: $summary"
    ;;
  1)
    if grep -q '^# drained ' <<<"$output"; then drained="node drained"; else drained="NOT drained"; fi
    log "FAILED, $drained: $summary"
    exit 1
    ;;
  3)
    log "skip: no GPU check on this node ($summary)"
    ;;
  *)
    if [ "$status" -eq 124 ]; then why="timed out after ${timeout_s}s"; else why="exit $status"; fi
    log "ERROR: the check could not run ($why): $summary"
    if [ "${NCCL_CHECKS_STRICT:-0}" = 1 ]; then exit 1; fi
    ;;
esac
exit 0
