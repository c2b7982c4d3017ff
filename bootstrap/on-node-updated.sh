#!/usr/bin/env bash
# hpc-train OnNodeUpdated action: ParallelCluster runs it as root on the head node at every
# `pcluster update-cluster` (its update policy is SUPPORTED, unlike OnNodeConfigured's Args, which
# are fixed at creation). This is how new code reaches a running cluster.
#
#   on-node-updated.sh --node-type HeadNode --source URL --sha256 HEX
#
#   --node-type      HeadNode | ComputeFleet | LoginNode (the cluster config says which)
#   --source         the new project tarball (s3://..., https://... or a local path)
#   --sha256         its sha256; the tarball is refused if it does not match
#   --instance-type  optional, as for on-node-configured.sh
#
# The same arguments as on-node-configured.sh, and the same layout: the tarball is unpacked into
# $BOOTSTRAP_PREFIX/releases/<sha16> (refused, leaving nothing, on a checksum mismatch), its
# Python environment built (python-env.sh), then the `current` link swapped to it atomically (a
# new link renamed over the old: `venv` -> current/venv follows). Compute nodes follow `current`
# (the prefix is shared): each compute node's timer runs this script as
#
#   on-node-updated.sh --node-type ComputeFleet
#
# which copies the new `current` to the node's own disk ($BOOTSTRAP_LOCAL_PREFIX, checked against
# the head node's manifest) and swaps the node's `current` link; jobs started from then on run the
# new code; the node keeps its newest BOOTSTRAP_KEEP_ENVS copies. On the head node, from the new
# release:
#
#   nccl-profile.sh        the EFA/NCCL profile (skipped without --instance-type)
#   head-node-services.sh  the metrics service and the doctor's timer, updated where they differ;
#                          the metrics service restarts when `current` moved (head node only)
#
# and old releases are pruned: the newest BOOTSTRAP_KEEP_ENVS (default 2) are kept, and always the
# one `current` points to. Safe to run again: the second run says "already done" and changes
# nothing. Bad arguments: one line, exit 2.
#
# Settings (environment): BOOTSTRAP_PREFIX [/shared/hpc-train], BOOTSTRAP_LOG_DIR
# [/var/log/hpc-train], BOOTSTRAP_KEEP_ENVS [2]; more per step: see bootstrap/README.md
set -euo pipefail
umask 022
ACTION=on-node-updated

# >>> shared: on-node-configured.sh and on-node-updated.sh hold the same copy of this block
# (ParallelCluster downloads only the one script, so what runs before the tarball is unpacked
# cannot come from lib.sh; tests/bootstrap checks that the two copies are identical).
bad() {
    printf '%s.sh: %s (usage: --node-type HeadNode|ComputeFleet|LoginNode [--source URL --sha256 HEX] [--instance-type TYPE])\n' \
        "$ACTION" "$*" >&2
    exit 2
}

# parse_args ARGS...: sets node_type, source_url, source_sha, instance_type; bad input exits 2.
parse_args() {
    node_type="" source_url="" source_sha="" instance_type=""
    while (($#)); do
        case "$1" in
            --node-type | --source | --sha256 | --instance-type)
                [[ $# -ge 2 && -n "$2" ]] || bad "$1 needs a value"
                case "$1" in
                    --node-type) node_type="$2" ;;
                    --source) source_url="$2" ;;
                    --sha256) source_sha="$2" ;;
                    --instance-type) instance_type="$2" ;;
                esac
                shift 2
                ;;
            -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
            *) bad "unknown argument '$1'" ;;
        esac
    done
    case "$node_type" in
        HeadNode | ComputeFleet | LoginNode) ;;
        "") bad "--node-type is missing" ;;
        *) bad "--node-type '$node_type' is not HeadNode, ComputeFleet or LoginNode" ;;
    esac
    [[ -z "$source_url" && -z "$source_sha" ]] || [[ -n "$source_url" && -n "$source_sha" ]] ||
        bad "--source and --sha256 go together"
    [[ -z "$source_sha" || "$source_sha" =~ ^[0-9a-f]{64}$ ]] ||
        bad "--sha256 '$source_sha' is not a sha256 (64 lower-case hex digits)"
    case "$source_url" in
        http://* | ftp://*) bad "--source $source_url: refusing an unencrypted download" ;;
    esac
    [[ -z "$instance_type" || "$instance_type" =~ ^[a-z0-9-]+\.[a-z0-9-]+$ ]] ||
        bad "--instance-type '$instance_type' is not an instance type like p3dn.24xlarge"
}

# start_log: the settings every step reads, and the log file.
start_log() {
    export BOOTSTRAP_PREFIX="${BOOTSTRAP_PREFIX:-/shared/hpc-train}"
    local log_dir="${BOOTSTRAP_LOG_DIR:-/var/log/hpc-train}"
    mkdir -p "$log_dir" "$BOOTSTRAP_PREFIX/releases"
    export BOOTSTRAP_LOG_FILE="$log_dir/bootstrap.log"
    export BOOTSTRAP_NODE_TYPE="$node_type" BOOTSTRAP_INSTANCE_TYPE="$instance_type"
}

say() {
    local line
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) [$(hostname -s)] $ACTION: $*"
    printf '%s\n' "$line" >>"$BOOTSTRAP_LOG_FILE"
    printf '%s\n' "$line" >&2
}
fail() { say "FAILED: $*"; exit 1; }

# unpack_release: the tarball's tree in $BOOTSTRAP_PREFIX/releases/<sha16>/src (sets release),
# once, under the shared lock. It is fetched and checked in a temporary directory and moved into
# place whole: a wrong checksum or a failed download leaves nothing behind.
unpack_release() {
    release="$BOOTSTRAP_PREFIX/releases/${source_sha:0:16}"
    exec 9>>"$BOOTSTRAP_PREFIX/.bootstrap.lock"
    flock -w "${BOOTSTRAP_LOCK_TIMEOUT:-3600}" 9 || fail "no lock on $BOOTSTRAP_PREFIX/.bootstrap.lock"
    if [[ -f "$release/src/.complete" ]]; then
        say "source: already done ($release/src)"
    else
        work="$(mktemp -d "$BOOTSTRAP_PREFIX/releases/.unpack.XXXXXX")"
        trap 'rm -rf "$work"' EXIT
        case "$source_url" in
            s3://*) aws s3 cp --only-show-errors "$source_url" "$work/src.tar.gz" 2>>"$BOOTSTRAP_LOG_FILE" ||
                fail "cannot fetch $source_url" ;;
            https://*) curl --fail --silent --show-error --location --proto '=https' --retry 5 \
                --output "$work/src.tar.gz" "$source_url" 2>>"$BOOTSTRAP_LOG_FILE" || fail "cannot fetch $source_url" ;;
            *) cp -- "${source_url#file://}" "$work/src.tar.gz" 2>>"$BOOTSTRAP_LOG_FILE" ||
                fail "cannot read $source_url" ;;
        esac
        printf '%s  %s\n' "$source_sha" "$work/src.tar.gz" | sha256sum --check --status ||
            fail "sha256 mismatch for $source_url: expected $source_sha, got $(sha256sum "$work/src.tar.gz" | cut -c1-64)"
        mkdir "$work/src"
        tar -xzf "$work/src.tar.gz" -C "$work/src" --no-same-owner 2>>"$BOOTSTRAP_LOG_FILE" ||
            fail "cannot unpack $source_url"
        [[ -f "$work/src/bootstrap/lib.sh" ]] || fail "$source_url has no bootstrap/lib.sh: not an hpc-train tarball"
        touch "$work/src/.complete"
        mkdir -p "$release"
        touch "$release/.stamp" # the newest release, for prune_releases
        rm -rf "$release/src"
        mv -T "$work/src" "$release/src"
        rm -rf "$work"
        trap - EXIT
        say "source: unpacked $source_url into $release/src (sha256 ok)"
    fi
    flock -u 9
    exec 9>&-
}
# <<< shared

parse_args "$@"
if [[ "$node_type" == ComputeFleet ]]; then
    [[ -z "$source_url" ]] || bad "a compute node installs no release: it copies the head node's current"
else
    [[ -n "$source_url" ]] || bad "--source and --sha256 are required (the release to install)"
fi
start_log
started=$SECONDS

if [[ "$node_type" == ComputeFleet ]]; then # the follow timer (install_follow_timer in lib.sh)
    current="$BOOTSTRAP_PREFIX/current"
    [[ -f "$current/src/bootstrap/lib.sh" ]] || fail "no release in $current: the head node installs it"
    # shellcheck disable=SC2034 # lib.sh names its log lines by STEP
    STEP="$ACTION"
    # shellcheck source-path=SCRIPTDIR source=lib.sh
    source "$current/src/bootstrap/lib.sh"
    declare -F install_local_release >/dev/null ||
        fail "$current -> $(readlink "$current") predates node-local environments"
    if local_release_is_current; then exit 0; fi # nothing new (most runs): nothing to log
    say "start: node type $node_type, prefix $BOOTSTRAP_PREFIX, node-local $LOCAL_PREFIX"
    install_local_release
    log "done in $((SECONDS - started)) s: $LOCAL_PREFIX/current -> $(readlink "$LOCAL_PREFIX/current")"
    exit 0
fi
say "start: node type $node_type, instance type ${instance_type:-none}, prefix $BOOTSTRAP_PREFIX"

unpack_release
# shellcheck disable=SC2034 # lib.sh names its log lines by STEP
STEP="$ACTION"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$release/src/bootstrap/lib.sh"
export BOOTSTRAP_SOURCE_DIR="$release/src"
run_step "$release/src/bootstrap" python-env
make_current "$release"

current="$BOOTSTRAP_PREFIX/current"
run_step "$current/src/bootstrap" nccl-profile
if [[ "$node_type" == HeadNode ]]; then
    run_step "$current/src/bootstrap" head-node-services
    # the service runs `venv`'s hpc-train: a process started before the swap runs the old code
    ((CURRENT_CHANGED == 0)) || run "${HPC_TRAIN_SYSTEMCTL:-systemctl}" try-restart hpc-train-metrics.service
fi
prune_releases
link_shared_env # the head (login) node's $LOCAL_PREFIX/venv names the shared environment
log "done in $((SECONDS - started)) s: current -> $(readlink "$current")"
