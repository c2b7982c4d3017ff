#!/usr/bin/env bash
# hpc-train OnNodeConfigured action: ParallelCluster runs it as root on every node once the node
# is configured (head node at cluster creation, compute nodes at each launch).
#
#   on-node-configured.sh --node-type HeadNode --source URL --sha256 HEX
#   on-node-configured.sh --node-type ComputeFleet --instance-type TYPE
#
#   --node-type      HeadNode | ComputeFleet | LoginNode (the cluster config says which)
#   --source         the project tarball (s3://..., https://... or a local path): `git archive`
#   --sha256         its sha256; the tarball is refused if it does not match
#   --instance-type  the compute resource's instance type (the EFA/NCCL profile and checks)
#
# With --source (the head node): the tarball is unpacked into $BOOTSTRAP_PREFIX/releases/<sha16>,
# its Python environment built (python-env.sh) and the release made `current`, but only while
# there is no current release yet: these Args are fixed at creation, later code arrives through
# on-node-updated.sh and must not be moved back. Without --source (compute and login nodes): the
# node waits for the head node's `current` and uses it. A compute node then copies the current
# release's Python environment to its own disk ($BOOTSTRAP_LOCAL_PREFIX/venv, checked against the
# head node's manifest: jobs import from there, not over NFS) and installs a timer that runs
# on-node-updated.sh to follow later releases; the head and login nodes link that path to the
# shared environment. Then the steps of the current release:
#
#   node-checks.sh         GPUs (nvidia-smi), EFA (fi_info -p efa), aws-ofi-nccl plugin; skipped if absent
#   nccl-profile.sh        the EFA/NCCL versions on the node, and the variables for them from
#                          `python -m hpc_train.environment` into a profile file
#   nccl-tests.sh          nccl-tests from a pinned, checksum-verified tarball, built once
#   head-node-services.sh  the metrics service and the doctor's timer (head node only)
#
# and, with --source, old releases are pruned (lib.sh prune_releases). Safe to run again:
# finished work is found and logged as "already done". Bad arguments: one line, exit 2.
#
# Settings (environment; defaults are for a real cluster, tests point them at a temp dir):
#   BOOTSTRAP_PREFIX        shared software prefix                      [/shared/hpc-train]
#   BOOTSTRAP_LOG_DIR       log directory (local to the node)           [/var/log/hpc-train]
#   BOOTSTRAP_WAIT_CURRENT  seconds a node without --source waits for `current` [1800]
#   BOOTSTRAP_LOCAL_PREFIX  node-local prefix (compute nodes' copy)     [/opt/hpc-train]
#   more per step: see bootstrap/README.md
set -euo pipefail
umask 022
ACTION=on-node-configured

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
[[ "$node_type" != HeadNode || -n "$source_url" ]] ||
    bad "the head node needs --source and --sha256 (it installs the first release)"
start_log
started=$SECONDS
say "start: node type $node_type, instance type ${instance_type:-none}, prefix $BOOTSTRAP_PREFIX"

current="$BOOTSTRAP_PREFIX/current"
if [[ -n "$source_url" && ! -L "$current" ]]; then
    unpack_release
    # shellcheck disable=SC2034 # lib.sh names its log lines by STEP
    STEP="$ACTION"
    # shellcheck source-path=SCRIPTDIR source=lib.sh
    source "$release/src/bootstrap/lib.sh"
    export BOOTSTRAP_SOURCE_DIR="$release/src"
    run_step "$release/src/bootstrap" python-env
    make_current "$release" --first
else
    [[ -z "$source_url" ]] ||
        say "source: $current -> $(readlink "$current") already; --source installs only the first release (later ones: on-node-updated.sh)"
    waited=0
    until [[ -f "$current/src/bootstrap/lib.sh" && -f "$current/venv/.complete" ]]; do
        ((waited < ${BOOTSTRAP_WAIT_CURRENT:-1800})) ||
            fail "no release in $current after $waited s: the head node installs it (see its bootstrap.log)"
        ((waited % 60)) || say "waiting for the head node to install a release ($current)"
        sleep 2
        waited=$((waited + 2))
    done
    # shellcheck disable=SC2034 # lib.sh names its log lines by STEP
    STEP="$ACTION"
    # shellcheck source-path=SCRIPTDIR source=lib.sh
    source "$current/src/bootstrap/lib.sh"
    log "using $current -> $(readlink "$current")"
fi

# Where jobs import from (lib.sh, LOCAL_PREFIX [/opt/hpc-train]): on a compute node a verified
# copy of the current release on its own disk, kept up to date by a timer (on-node-updated.sh);
# on the head and login nodes the shared environment, under the same path.
if ! declare -F install_local_release >/dev/null; then
    log "the current release's lib.sh predates node-local environments: jobs import from $BOOTSTRAP_PREFIX/venv"
elif [[ "$node_type" == ComputeFleet ]]; then
    install_local_release
    install_follow_timer
else
    link_shared_env
fi

# The steps of the current release, run through the `current` link (so a path a step records,
# e.g. the docs the services name, stays valid when an update prunes this release).
export BOOTSTRAP_SOURCE_DIR="$current/src"
for step in node-checks nccl-profile nccl-tests; do
    run_step "$current/src/bootstrap" "$step"
done
[[ "$node_type" != HeadNode ]] || run_step "$current/src/bootstrap" head-node-services
[[ -z "$source_url" ]] || prune_releases
log "done in $((SECONDS - started)) s"
