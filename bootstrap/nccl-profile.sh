#!/usr/bin/env bash
# Step: the EFA/NCCL environment for this node's instance type, as a profile file that login
# shells (and `srun --export=ALL` jobs started from them) pick up.
#
# The variables and the reason for each come from `python -m hpc_train.environment`, the one
# table the launcher and the nccl checks use too; nothing is listed here. The file is rewritten
# only when its content changes.
#
#   BOOTSTRAP_PROFILE_DIR   [/etc/profile.d]; the file is hpc-train-nccl.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

instance_type="${BOOTSTRAP_INSTANCE_TYPE:-}"
profile="${BOOTSTRAP_PROFILE_DIR:-/etc/profile.d}/hpc-train-nccl.sh"
if [[ -z "$instance_type" ]]; then
    skip "EFA/NCCL profile: no --instance-type (${BOOTSTRAP_NODE_TYPE:-?} node)"
    exit 0
fi

status=0
exports="$(PYTHONDONTWRITEBYTECODE=1 "$(venv_dir)/bin/python" -m hpc_train.environment \
    --instance-type "$instance_type" 2>>"$BOOTSTRAP_LOG_FILE")" || status=$?
if ((status == 2)); then
    skip "EFA/NCCL profile: hpc_train.environment has no settings for $instance_type"
    exit 0
fi
((status == 0)) || die "python -m hpc_train.environment failed (exit $status)"

{
    printf '# EFA/NCCL settings for %s, written by hpc-train bootstrap/nccl-profile.sh\n' "$instance_type"
    printf '# from: python -m hpc_train.environment --instance-type %s\n' "$instance_type"
    printf '%s\n' "$exports"
} | write_if_changed "$profile"
