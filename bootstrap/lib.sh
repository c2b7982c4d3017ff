# shellcheck shell=bash
# Helpers shared by the bootstrap steps: sourced, never run. The entry script
# (on-node-configured.sh) exports the settings below before it runs a step.
#
#   BOOTSTRAP_PREFIX    shared software prefix (the Python environment, nccl-tests, downloads)
#   BOOTSTRAP_LOG_FILE  log file every step appends to, one timestamped line per event
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

# venv_dir: the Python environment the steps use (python-env.sh makes it).
venv_dir() { printf '%s\n' "$BOOTSTRAP_PREFIX/venv"; }
