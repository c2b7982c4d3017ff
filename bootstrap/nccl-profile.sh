#!/usr/bin/env bash
# Step: the EFA/NCCL environment for this node's instance type and the software it has, as a
# profile file that login shells (and `srun --export=ALL` jobs started from them) pick up.
#
# First the versions actually installed are recorded, one `name=version` line each, to
# BOOTSTRAP_VERSIONS_FILE (a name missing: not found on this node):
#
#   libfabric      `fi_info --version` (the EFA installer's /opt/amazon/efa/bin/fi_info, else PATH)
#   aws-ofi-nccl   the version string in the plugin library ("aws-ofi-nccl 1.13.2-aws")
#   nccl           the nvidia-nccl-cu* wheel in the Python environment (the NCCL torch loads)
#
# Then the variables and the reason for each come from `python -m hpc_train.environment
# --instance-type T --versions FILE`, the one table the launcher and the nccl checks use too
# (aws-ofi-nccl's doc/efa-env-var.md: which variables which versions need); nothing is listed
# here. Both files are rewritten only when their content changes.
#
#   BOOTSTRAP_PROFILE_DIR    [/etc/profile.d]; the file is hpc-train-nccl.sh
#   BOOTSTRAP_VERSIONS_FILE  [/etc/hpc-train/efa-versions]
#   BOOTSTRAP_FI_INFO, BOOTSTRAP_OFI_NCCL_DIRS   where the EFA software is (see node-checks.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

instance_type="${BOOTSTRAP_INSTANCE_TYPE:-}"
profile="${BOOTSTRAP_PROFILE_DIR:-/etc/profile.d}/hpc-train-nccl.sh"
versions="${BOOTSTRAP_VERSIONS_FILE:-/etc/hpc-train/efa-versions}"

# record NAME VERSION: one line, if VERSION looks like one (else the name stays missing).
record() {
    if [[ "$2" =~ ^[0-9]+\.[0-9]+ ]]; then
        printf '%s=%s\n' "$1" "$2"
        log "found $1 $2"
    elif [[ -n "$2" ]]; then
        log "$1: unrecognised version \"$2\", not recorded"
    else
        log "$1: not found on this node"
    fi
}

found_versions() {
    local fi_info plugin version
    printf '# EFA/NCCL software on this node, found by bootstrap/nccl-profile.sh (a name missing: not found)\n'
    version=""
    if fi_info="$(find_fi_info)"; then
        version="$("$fi_info" --version 2>>"$BOOTSTRAP_LOG_FILE" | sed -n 's/^libfabric: *//p' | head -n 1)" || version=""
    fi
    record libfabric "$version"
    version=""
    if plugin="$(find_ofi_nccl_plugin)"; then
        version="$({ grep -aoE 'aws-ofi-nccl [0-9]+\.[0-9]+\.[0-9]+(-[A-Za-z0-9]+)?' "$plugin" || true; } | head -n 1)"
        version="${version#aws-ofi-nccl }"
    fi
    record aws-ofi-nccl "$version"
    version="$(PYTHONDONTWRITEBYTECODE=1 "$(venv_dir)/bin/python" -c '
import importlib.metadata as md
for d in md.distributions():
    if (d.metadata["Name"] or "").lower().replace("_", "-").startswith("nvidia-nccl-cu"):
        print(d.version)
        break' 2>>"$BOOTSTRAP_LOG_FILE")" || version=""
    record nccl "$version"
}

found_versions | write_if_changed "$versions"

if [[ -z "$instance_type" ]]; then
    skip "EFA/NCCL profile: no --instance-type (${BOOTSTRAP_NODE_TYPE:-?} node)"
    exit 0
fi

status=0
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
exports="$(PYTHONDONTWRITEBYTECODE=1 "$(venv_dir)/bin/python" -m hpc_train.environment \
    --instance-type "$instance_type" --versions "$versions" 2>"$errors")" || status=$?
cat "$errors" >>"$BOOTSTRAP_LOG_FILE"
if ((status == 2)) && grep -q "unknown instance type" "$errors"; then
    skip "EFA/NCCL profile: hpc_train.environment has no settings for $instance_type"
    exit 0
fi
((status == 0)) || die "python -m hpc_train.environment failed (exit $status): $(head -n 1 "$errors")"

{
    printf '# EFA/NCCL settings for %s, written by hpc-train bootstrap/nccl-profile.sh\n' "$instance_type"
    printf '# from: python -m hpc_train.environment --instance-type %s --versions %s\n' "$instance_type" "$versions"
    printf '# versions: %s\n' "$(grep -v '^#' "$versions" | paste -sd ' ' - || true)"
    printf '%s\n' "$exports"
} | write_if_changed "$profile"
