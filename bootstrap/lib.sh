# shellcheck shell=bash
# Helpers shared by the bootstrap steps and the two entry scripts (on-node-configured.sh,
# on-node-updated.sh, which source it from the unpacked tarball): sourced, never run. The entry
# script exports the settings below before it runs a step.
#
#   BOOTSTRAP_PREFIX    shared software prefix (the releases, nccl-tests, downloads)
#   BOOTSTRAP_LOG_FILE  log file every step appends to, one timestamped line per event
#
# The layout on the prefix, one release per source tarball:
#
#   releases/<sha16>/src/     the unpacked tarball (.complete once whole)
#   releases/<sha16>/venv     -> venv-<key>/, its Python environment (python-env.sh)
#   current                   -> releases/<sha16>: the release every node uses (make_current)
#   venv                      -> current/venv: the one path users, services and jobs name
#
# Conventions: `log` for events, `run` for commands (their output goes to the log file only),
# `die` to stop with a message, `skip` when something is absent on this node, `already_done`
# when a step finds its work complete.

: "${BOOTSTRAP_PREFIX:?BOOTSTRAP_PREFIX must be set}"
: "${BOOTSTRAP_LOG_FILE:?BOOTSTRAP_LOG_FILE must be set}"
STEP="${STEP:-$(basename "${BASH_SOURCE[1]:-bootstrap}" .sh)}"
LOCK_FILE="$BOOTSTRAP_PREFIX/.bootstrap.lock"

log() {
    local line
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) [$(hostname -s)] $STEP: $*"
    printf '%s\n' "$line" >>"$BOOTSTRAP_LOG_FILE"
    printf '%s\n' "$line" >&2
}

die() {
    log "FAILED: $*"
    printf 'last lines of %s:\n' "$BOOTSTRAP_LOG_FILE" >&2
    tail -n 20 "$BOOTSTRAP_LOG_FILE" >&2 || true
    exit 1
}

skip() { log "skipped: $*"; }
already_done() { log "already done: $*"; }

# run CMD...: log it, send its output to the log file, stop the bootstrap if it fails.
run() {
    log "+ $*"
    "$@" >>"$BOOTSTRAP_LOG_FILE" 2>&1 || die "command failed (exit $?): $*"
}

# take_shared_lock: serialise work on the shared prefix across nodes booting together.
# Held until the step exits (fd 8). flock works across nodes on NFS (/shared) and on Lustre
# mounted with -o flock (ParallelCluster's default for FSx).
take_shared_lock() {
    mkdir -p "$BOOTSTRAP_PREFIX"
    exec 8>>"$LOCK_FILE"
    log "waiting for the shared lock $LOCK_FILE"
    flock -w "${BOOTSTRAP_LOCK_TIMEOUT:-3600}" 8 || die "no lock on $LOCK_FILE after ${BOOTSTRAP_LOCK_TIMEOUT:-3600} s"
    log "holding the shared lock"
}

release_shared_lock() {
    flock -u 8
    exec 8>&-
}

# fetch_verified URL SHA256 DEST: download (s3://, https:// or a local path) and check the
# sha256 before DEST appears; a mismatch leaves nothing behind. Already there and valid: no-op.
fetch_verified() {
    local url="$1" sha="$2" dest="$3" part actual
    if [[ -f "$dest" ]] && sha256_matches "$sha" "$dest"; then
        already_done "$dest (sha256 ok)"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    part="$(mktemp "$dest.part.XXXXXX")"
    case "$url" in
        s3://*) run aws s3 cp --only-show-errors "$url" "$part" ;;
        https://*) run curl --fail --silent --show-error --location --proto '=https' \
            --retry 5 --retry-delay 5 --output "$part" "$url" ;;
        http://* | ftp://*) rm -f "$part"; die "refusing an unencrypted download: $url" ;;
        *) run cp -- "${url#file://}" "$part" ;;
    esac
    if ! sha256_matches "$sha" "$part"; then
        actual="$(sha256sum "$part" | cut -c1-64)"
        rm -f "$part"
        die "sha256 mismatch for $url: expected $sha, got $actual"
    fi
    mv -f "$part" "$dest"
    log "downloaded $url (sha256 ok)"
}

sha256_matches() {
    local sha="$1" file="$2"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "not a sha256: '$sha'"
    printf '%s  %s\n' "$sha" "$file" | sha256sum --check --status 2>/dev/null
}

# write_if_changed DEST: stdin becomes DEST (temp file + rename) unless DEST already holds it;
# then nothing is touched, not even DEST's directory.
write_if_changed() {
    local dest="$1" content tmp
    content="$(cat; printf x)"
    if [[ -f "$dest" && "$(cat "$dest"; printf x)" == "$content" ]]; then
        already_done "$dest unchanged"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    tmp="$(mktemp "$dest.XXXXXX")"
    printf '%s' "${content%x}" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dest"
    log "wrote $dest"
}

# venv_dir: the Python environment the steps use (python-env.sh makes it; `current`'s).
venv_dir() { printf '%s\n' "$BOOTSTRAP_PREFIX/venv"; }

# find_fi_info: libfabric's fi_info (BOOTSTRAP_FI_INFO, the EFA installer's, else PATH); 1: none.
find_fi_info() {
    local fi_info="${BOOTSTRAP_FI_INFO:-}"
    if [[ -z "$fi_info" ]]; then
        fi_info=/opt/amazon/efa/bin/fi_info
        [[ -x "$fi_info" ]] || fi_info="$(command -v fi_info || true)"
    fi
    [[ -n "$fi_info" && -x "$fi_info" ]] || return 1
    printf '%s\n' "$fi_info"
}

OFI_NCCL_DIRS="${BOOTSTRAP_OFI_NCCL_DIRS:-/opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib}"
# find_ofi_nccl_plugin: the aws-ofi-nccl library NCCL loads (BOOTSTRAP_OFI_NCCL_DIRS); 1: none.
find_ofi_nccl_plugin() {
    local dirs dir lib
    read -r -a dirs <<<"$OFI_NCCL_DIRS"
    for dir in "${dirs[@]}"; do
        for lib in libnccl-net-ofi.so libnccl-net.so; do
            if [[ -e "$dir/$lib" ]]; then
                printf '%s\n' "$dir/$lib"
                return 0
            fi
        done
    done
    return 1
}

# run_step DIR STEP: run DIR/STEP.sh; its failure stops the bootstrap.
run_step() {
    bash "$1/$2.sh" || die "step $2 (log: $BOOTSTRAP_LOG_FILE)"
}

# point_link LINK TARGET: LINK -> TARGET, atomically (a new link under a temporary name, renamed
# over the old one), so no reader ever finds LINK missing or half-made. Already so: no-op.
point_link() {
    local link="$1" target="$2" tmp
    if [[ -L "$link" && "$(readlink "$link")" == "$target" ]]; then
        already_done "$link -> $target"
        return 0
    fi
    tmp="$link.new.$BASHPID"
    rm -f "$tmp"
    ln -s "$target" "$tmp"
    mv -T "$tmp" "$link"
    log "$link -> $target"
}

# make_current RELEASE [--first]: `current` -> RELEASE (releases/<sha16>, its venv complete) and
# `venv` -> current/venv. --first (on-node-configured.sh): only while there is no current yet, so
# a node configured with the creation-time tarball never moves an update back.
CURRENT_CHANGED=0 # set to 1 by make_current when it moved `current`
make_current() {
    local release="$1" first="${2:-}" name now
    name="releases/$(basename "$release")"
    [[ -f "$release/venv/.complete" ]] || die "$release has no complete Python environment"
    take_shared_lock
    now="$(readlink "$BOOTSTRAP_PREFIX/current" || true)"
    if [[ -n "$now" && "$now" != "$name" && "$first" == --first ]]; then
        log "current stays -> $now (installed by an update); $name is not made current"
    elif [[ "$now" != "$name" ]]; then
        touch "$release/.stamp" # the newest release, for prune_releases
        point_link "$BOOTSTRAP_PREFIX/current" "$name"
        # shellcheck disable=SC2034 # read by on-node-updated.sh
        CURRENT_CHANGED=1
    else
        already_done "current -> $name"
    fi
    point_link "$BOOTSTRAP_PREFIX/venv" current/venv
    release_shared_lock
}

# prune_releases: keep the newest BOOTSTRAP_KEEP_ENVS releases (default 2; newest by .stamp:
# unpacked or made current) and always the one `current` points to; remove the others, the
# Python environments a kept release's venv link no longer names, and what interrupted runs left.
prune_releases() {
    local keep="${BOOTSTRAP_KEEP_ENVS:-2}" releases="$BOOTSTRAP_PREFIX/releases" current name
    local kept=0 stale=() env dir gone
    [[ "$keep" =~ ^[1-9][0-9]*$ ]] || die "BOOTSTRAP_KEEP_ENVS=$keep: must be a whole number >= 1"
    take_shared_lock # no release is being unpacked or built while we look
    current="$(basename "$(readlink "$BOOTSTRAP_PREFIX/current" || echo none)")"
    while read -r _ dir; do
        name="${dir##*/}"
        if [[ "$name" == "$current" ]] || ((kept < keep)); then
            kept=$((kept + 1))
            for env in "$dir"/venv-*; do
                [[ -d "$env" && "${env##*/}" != "$(readlink "$dir/venv" || true)" ]] || continue
                stale+=("$env")
            done
        else
            stale+=("$dir")
        fi
    done < <(find "$releases" -mindepth 2 -maxdepth 2 -name .stamp -printf '%T@ %h\n' | sort -rn)
    for dir in "$releases"/.unpack.* "$releases"/.prune.*; do
        [[ ! -e "$dir" ]] || stale+=("$dir")
    done
    if ((${#stale[@]} == 0)); then
        already_done "prune: nothing beyond the newest $keep releases and current"
    fi
    for dir in "${stale[@]}"; do
        gone="$dir"
        if [[ "${dir##*/}" != .* ]]; then
            # out of the way first (one rename): a half-removed release is never taken for one
            gone="$releases/.prune.${dir##*/}.$BASHPID"
            mv -T "$dir" "$gone"
        fi
        rm -rf "$gone"
        log "pruned $dir"
    done
    release_shared_lock
}
