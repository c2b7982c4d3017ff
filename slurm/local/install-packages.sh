#!/usr/bin/env bash
# Install the Debian packages the local Slurm cluster and the lint step need, once.
# Slurm 22.05 (slurmctld, slurmd, clients), munge, shellcheck, Prometheus (server + promtool, for the
# metrics and alert-rule tests), runc (Slurm's OCI containers: submit --container on the local
# cluster), systemd (systemd-analyze verifies the head node's units:
# tests/hpc_train/runs/test_doctor_services.py); util-linux provides unshare/runuser.
set -euo pipefail

log() { printf '[%s] install-packages: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }

need=()
for cmd in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge shellcheck:shellcheck \
    promtool:prometheus runc:runc systemd-analyze:systemd; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd#*:}")
done
if [ "${#need[@]}" -eq 0 ]; then
  log "Slurm, munge, shellcheck, Prometheus, runc and systemd-analyze already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  log "missing packages: ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
  exit 1
fi
log "installing: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
log "installed: $(slurmctld -V)"
