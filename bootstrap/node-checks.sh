#!/usr/bin/env bash
# Step: does this node have what the instance type promises? Checks only, changes nothing.
#
#   GPUs    nvidia-smi lists as many GPUs as hpc_core.instances expects for the instance type
#   EFA     `fi_info -p efa` finds an EFA device (libfabric's efa provider)
#   plugin  the aws-ofi-nccl plugin that lets NCCL use EFA (else NCCL falls back to TCP sockets)
#
# Absent tools (no driver, no EFA software: the head node, a laptop, CI) are skipped with a log
# line; present but failing on a node whose instance type has GPUs/EFA stops the bootstrap.
#
#   BOOTSTRAP_FI_INFO          fi_info binary [/opt/amazon/efa/bin/fi_info, else PATH]
#   BOOTSTRAP_OFI_NCCL_DIRS    where to look for the plugin
#                              [/opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

instance_type="${BOOTSTRAP_INSTANCE_TYPE:-}"
if [[ "${BOOTSTRAP_NODE_TYPE:-}" != ComputeFleet || -z "$instance_type" ]]; then
    skip "GPU/EFA checks: not a compute node with an --instance-type (${BOOTSTRAP_NODE_TYPE:-?})"
    exit 0
fi

# What the instance type promises, from the one table in hpc_core.instances.
read -r gpus efa < <(PYTHONDONTWRITEBYTECODE=1 "$(venv_dir)/bin/python" -c '
import sys
from hpc_core.instances import INSTANCE_TYPES
t = INSTANCE_TYPES.get(sys.argv[1])
print(t.gpus if t else 0, int(t.efa) if t else 0)' "$instance_type") ||
    die "cannot read the instance table from $(venv_dir)"
log "$instance_type: expecting $gpus GPUs, EFA $([[ $efa == 1 ]] && echo yes || echo no)"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    skip "GPU check: no NVIDIA driver on this node (nvidia-smi not found)"
elif ((gpus > 0)); then
    found="$(nvidia-smi -L 2>>"$BOOTSTRAP_LOG_FILE" | grep -c '^GPU ' || true)"
    ((found == gpus)) || die "nvidia-smi lists $found GPUs, $instance_type has $gpus"
    log "GPU check: $found GPUs ok"
fi

if ! fi_info="$(find_fi_info)"; then
    skip "EFA check: no EFA software on this node (fi_info not found)"
    exit 0
fi
if ((efa == 0)); then
    skip "EFA check: $instance_type has no EFA"
    exit 0
fi
"$fi_info" -p efa >>"$BOOTSTRAP_LOG_FILE" 2>&1 ||
    die "fi_info -p efa finds no EFA device: is Efa.Enabled set for this compute resource?"
log "EFA check: fi_info -p efa lists the device"

plugin="$(find_ofi_nccl_plugin)" ||
    die "aws-ofi-nccl plugin not found in $OFI_NCCL_DIRS: NCCL would fall back to TCP sockets"
log "aws-ofi-nccl plugin: $plugin"
