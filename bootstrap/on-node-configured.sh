#!/usr/bin/env bash
# hpc-train OnNodeConfigured action: ParallelCluster runs it as root on every node once the node
# is configured (head node at cluster creation, compute nodes at each launch).
#
#   on-node-configured.sh --source URL --sha256 HEX [--instance-type TYPE]
#
#   --source         the project tarball (s3://..., or a local path): `git archive` of this repo
#   --sha256         its sha256; the tarball is refused if it does not match
#   --instance-type  the compute resource's instance type (compute queues pass it; the head node
#                    gets no EFA/NCCL profile)
#
# ParallelCluster downloads only this file, so it fetches the tarball, unpacks it once into the
# shared prefix and runs the steps found there (bootstrap/*.sh, all sharing bootstrap/lib.sh):
#
#   python-env.sh     Python environment on the shared prefix, once (flock against racing nodes)
#   node-checks.sh    GPUs (nvidia-smi), EFA (fi_info -p efa), aws-ofi-nccl plugin; skipped if absent
#   nccl-profile.sh   EFA/NCCL variables from `python -m hpc_train.environment` into a profile file
#   nccl-tests.sh     nccl-tests from a pinned, checksum-verified tarball, built once
#
# Safe to run again: finished work is found and logged as "already done".
#
# Settings (environment; defaults are for a real cluster, tests point them at a temp dir):
#   BOOTSTRAP_PREFIX       shared software prefix             [/shared/hpc-train]
#   BOOTSTRAP_LOG_DIR      log directory (local to the node)  [/var/log/hpc-train]
#   BOOTSTRAP_NODE_TYPE    HeadNode | ComputeFleet | LoginNode [read from BOOTSTRAP_CFNCONFIG]
#   BOOTSTRAP_CFNCONFIG    ParallelCluster's node facts      [/etc/parallelcluster/cfnconfig]
#   more per step: see bootstrap/README.md
set -euo pipefail
umask 022

usage() { sed -n '5,13s/^# \{0,1\}//p' "$0" >&2; exit 2; }

source_url="" source_sha="" instance_type="${BOOTSTRAP_INSTANCE_TYPE:-}"
while (($#)); do
    case "$1" in
        --source) source_url="${2:?--source needs a value}"; shift 2 ;;
        --sha256) source_sha="${2:?--sha256 needs a value}"; shift 2 ;;
        --instance-type) instance_type="${2:?--instance-type needs a value}"; shift 2 ;;
        -h | --help) usage ;;
        *) echo "on-node-configured.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
[[ -n "$source_url" && -n "$source_sha" ]] || usage

export BOOTSTRAP_PREFIX="${BOOTSTRAP_PREFIX:-/shared/hpc-train}"
log_dir="${BOOTSTRAP_LOG_DIR:-/var/log/hpc-train}"
mkdir -p "$log_dir" "$BOOTSTRAP_PREFIX/src"
export BOOTSTRAP_LOG_FILE="$log_dir/bootstrap.log"
export BOOTSTRAP_INSTANCE_TYPE="$instance_type"

say() {
    local line
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) [$(hostname -s)] on-node-configured: $*"
    printf '%s\n' "$line" >>"$BOOTSTRAP_LOG_FILE"
    printf '%s\n' "$line" >&2
}
fail() { say "FAILED: $*"; exit 1; }

node_type="${BOOTSTRAP_NODE_TYPE:-}"
if [[ -z "$node_type" ]]; then
    cfnconfig="${BOOTSTRAP_CFNCONFIG:-/etc/parallelcluster/cfnconfig}"
    [[ -r "$cfnconfig" ]] || fail "cannot tell the node type: no $cfnconfig (set BOOTSTRAP_NODE_TYPE)"
    node_type="$(sed -n 's/^cfn_node_type=//p' "$cfnconfig" | tr -d '"'"'"' ')"
fi
case "$node_type" in
    HeadNode | ComputeFleet | LoginNode) export BOOTSTRAP_NODE_TYPE="$node_type" ;;
    *) fail "unknown node type '$node_type' (expected HeadNode, ComputeFleet or LoginNode)" ;;
esac
started=$SECONDS
say "start: node type $node_type, instance type ${instance_type:-none}, prefix $BOOTSTRAP_PREFIX"

# The project tree, unpacked once per tarball checksum; nodes booting together queue on the lock.
src="$BOOTSTRAP_PREFIX/src/${source_sha:0:16}"
exec 9>>"$BOOTSTRAP_PREFIX/.bootstrap.lock"
flock -w "${BOOTSTRAP_LOCK_TIMEOUT:-3600}" 9 || fail "no lock on $BOOTSTRAP_PREFIX/.bootstrap.lock"
if [[ -f "$src/.complete" ]]; then
    say "source: already done ($src)"
else
    [[ "$source_sha" =~ ^[0-9a-f]{64}$ ]] || fail "--sha256 is not a sha256: '$source_sha'"
    rm -rf "$src"
    work="$(mktemp -d "$BOOTSTRAP_PREFIX/src/.unpack.XXXXXX")"
    case "$source_url" in
        s3://*) aws s3 cp --only-show-errors "$source_url" "$work/src.tar.gz" || fail "cannot fetch $source_url" ;;
        *) cp -- "${source_url#file://}" "$work/src.tar.gz" || fail "cannot read $source_url" ;;
    esac
    printf '%s  %s\n' "$source_sha" "$work/src.tar.gz" | sha256sum --check --status ||
        { rm -rf "$work"; fail "sha256 mismatch for $source_url (expected $source_sha)"; }
    mkdir "$work/tree"
    tar -xzf "$work/src.tar.gz" -C "$work/tree" --no-same-owner || fail "cannot unpack $source_url"
    [[ -f "$work/tree/bootstrap/lib.sh" ]] || fail "$source_url has no bootstrap/lib.sh: not an hpc-train tarball"
    touch "$work/tree/.complete"
    mv -T "$work/tree" "$src"
    rm -rf "$work"
    say "source: unpacked $source_url into $src (sha256 ok)"
fi
flock -u 9
exec 9>&-
export BOOTSTRAP_SOURCE_DIR="$src"

for step in python-env node-checks nccl-profile nccl-tests; do
    bash "$src/bootstrap/$step.sh" || fail "step $step (log: $BOOTSTRAP_LOG_FILE)"
done
say "done in $((SECONDS - started)) s"
