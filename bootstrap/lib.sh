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
#   venv                      -> current/venv: the path services on the head node name
#
# and on each node's own disk (LOCAL_PREFIX, BOOTSTRAP_LOCAL_PREFIX [/opt/hpc-train]; this file
# owns that path), what jobs import from, so that 512 ranks starting together never import
# torch and fairseq over the head node's NFS (benchmarks/import_files.py measures why):
#
#   releases/<sha16>/venv-<key>/   compute nodes: a verified copy of the shared release's
#                                  environment, its scripts repointed (install_local_release)
#   releases/<sha16>/venv          -> venv-<key>
#   current                        -> releases/<sha16>
#   venv                           -> current/venv on compute nodes; on the head and login nodes
#                                  -> $BOOTSTRAP_PREFIX/venv (link_shared_env): the one path users
#                                  activate, so the interpreter a job names is local where it runs
#
# Conventions: `log` for events, `run` for commands (their output goes to the log file only),
# `die` to stop with a message, `skip` when something is absent on this node, `already_done`
# when a step finds its work complete.

: "${BOOTSTRAP_PREFIX:?BOOTSTRAP_PREFIX must be set}"
: "${BOOTSTRAP_LOG_FILE:?BOOTSTRAP_LOG_FILE must be set}"
STEP="${STEP:-$(basename "${BASH_SOURCE[1]:-bootstrap}" .sh)}"
LOCK_FILE="$BOOTSTRAP_PREFIX/.bootstrap.lock"
LOCAL_PREFIX="${BOOTSTRAP_LOCAL_PREFIX:-/opt/hpc-train}"

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

# bad_input MESSAGE: input a step cannot use (a file that does not parse, a missing piece, a binary
# whose libraries do not resolve): one line on stderr ("error: ..."), the same in the log, exit 2.
bad_input() {
    log "FAILED: $*" 2>/dev/null
    printf 'error: %s\n' "$*" >&2
    exit 2
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

# take_local_lock / release_local_lock: serialise work on LOCAL_PREFIX (the configure action and
# the follow timer) on this node (fd 7).
take_local_lock() {
    mkdir -p "$LOCAL_PREFIX/releases"
    exec 7>>"$LOCAL_PREFIX/.lock"
    flock -w "${BOOTSTRAP_LOCK_TIMEOUT:-3600}" 7 || die "no lock on $LOCAL_PREFIX/.lock"
}

release_local_lock() {
    flock -u 7
    exec 7>&-
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
    take_shared_lock # two nodes given --source at creation both get here: one hashes, once
    write_manifest "$release/$(readlink "$release/venv")"
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

# prune_releases [ROOT]: keep the newest BOOTSTRAP_KEEP_ENVS releases (default 2; newest by
# .stamp: unpacked, copied or made current) and always the one `current` points to; remove the
# others, the Python environments a kept release's venv link no longer names, and what
# interrupted runs left. ROOT: BOOTSTRAP_PREFIX (the shared lock) or LOCAL_PREFIX (the local one).
prune_releases() {
    local root="${1:-$BOOTSTRAP_PREFIX}"
    local keep="${BOOTSTRAP_KEEP_ENVS:-2}" releases="$root/releases" current name
    local kept=0 stale=() env dir gone
    [[ "$keep" =~ ^[1-9][0-9]*$ ]] || die "BOOTSTRAP_KEEP_ENVS=$keep: must be a whole number >= 1"
    if [[ "$root" == "$LOCAL_PREFIX" ]]; then
        take_local_lock # no copy is being made while we look
    else
        take_shared_lock # no release is being unpacked or built while we look
    fi
    current="$(basename "$(readlink "$root/current" || echo none)")"
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
    for dir in "$releases"/.unpack.* "$releases"/.prune.* "$releases"/.copy.*; do
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
    if [[ "$root" == "$LOCAL_PREFIX" ]]; then release_local_lock; else release_shared_lock; fi
}

# write_manifest ENV: ENV/.manifest (`sha256sum` lines for every regular file) and ENV/.links
# (every symbolic link and its target) of a complete environment, once (the caller holds the
# shared lock); a node's copy is checked against them. Hashed in parallel; sorted, so the same
# tree always gives the same files. An interrupted writer's .manifest.* folder is never read.
write_manifest() {
    local env="$1" tmp
    [[ ! -f "$env/.manifest" ]] || return 0
    log "writing the manifest of $env"
    tmp="$(mktemp -d "$env/.manifest.XXXXXX")"
    (
        cd "$env"
        find . -path './.manifest*' -prune -o -type f ! -path ./.links -print0 |
            xargs -0 -r -P "$(nproc)" -n 256 sha256sum -- | LC_ALL=C sort >"$tmp/files"
    ) || die "cannot hash $env"
    env_links "$env" >"$tmp/links" || die "cannot list the links of $env"
    chmod 0644 "$tmp/files" "$tmp/links"
    mv -f "$tmp/links" "$env/.links"
    mv -f "$tmp/files" "$env/.manifest" # last: .manifest present means both are whole
    rm -rf "$tmp"
    log "manifest: $(wc -l <"$env/.manifest") files, $(wc -l <"$env/.links") links in $env"
}

# env_links ENV: every symbolic link under ENV and its target, sorted (.manifest* left out)
env_links() {
    (cd "$1" && find . -path './.manifest*' -prune -o -type l -printf '%p -> %l\n' | LC_ALL=C sort)
}

# shared_release_env: "<sha16> venv-<key>" of the shared `current` release; 1: none complete.
shared_release_env() {
    local name env
    name="$(basename "$(readlink "$BOOTSTRAP_PREFIX/current" 2>/dev/null)")" || return 1
    env="$(readlink "$BOOTSTRAP_PREFIX/releases/$name/venv" 2>/dev/null)" || return 1
    [[ -n "$name" && -f "$BOOTSTRAP_PREFIX/releases/$name/$env/.complete" ]] || return 1
    printf '%s %s\n' "$name" "$env"
}

# local_release_is_current: this node's `current` and `venv` already name its copy of the shared
# `current` (the follow timer's check, every run: it logs nothing).
local_release_is_current() {
    local name env
    read -r name env < <(shared_release_env) || return 1
    [[ "$(readlink "$LOCAL_PREFIX/current" 2>/dev/null)" == "releases/$name" &&
        "$(readlink "$LOCAL_PREFIX/venv" 2>/dev/null)" == current/venv &&
        -f "$LOCAL_PREFIX/releases/$name/$env/.complete" ]]
}

# install_local_release (compute nodes): copy the shared `current` release's environment to
# LOCAL_PREFIX/releases/<sha16>/venv-<key>, unless already there: into a temporary directory
# (cp -a: modes and mtimes, so the .pyc files stay valid), checked against the head node's
# .manifest and .links, its scripts repointed (their shebangs and bin/activate name the shared
# path), then renamed into place whole. Then LOCAL_PREFIX/current -> releases/<sha16> and venv ->
# current/venv, swapped atomically, and old copies pruned (never current). A release without a
# manifest (made by an older lib.sh) is not copied: `venv` then names the shared one.
install_local_release() {
    local name env src dest work file content
    read -r name env < <(shared_release_env) || die "no complete release in $BOOTSTRAP_PREFIX/current"
    src="$BOOTSTRAP_PREFIX/releases/$name/$env" # the path python-env.sh built it at
    dest="$LOCAL_PREFIX/releases/$name/$env"
    take_local_lock
    if [[ -f "$dest/.complete" ]]; then
        already_done "node-local copy $dest"
    elif [[ ! -f "$src/.manifest" ]]; then
        log "$src has no manifest (made before node-local copies): jobs import from $BOOTSTRAP_PREFIX/venv"
        release_local_lock
        link_shared_env
        return 0
    else
        log "copying $src to $dest"
        work="$(mktemp -d "$LOCAL_PREFIX/releases/.copy.XXXXXX")"
        run cp -a -- "$src/." "$work/"
        (cd "$work" && sha256sum --check --quiet --strict .manifest) >>"$BOOTSTRAP_LOG_FILE" 2>&1 ||
            { rm -rf "$work"; die "the copy of $src does not match its .manifest"; }
        env_links "$work" | cmp -s - "$work/.links" || { rm -rf "$work"; die "the copy of $src does not match its .links"; }
        for file in "$work"/bin/* "$work/pyvenv.cfg"; do
            if [[ ! -f "$file" || -L "$file" ]] || ! grep -Iq . "$file" || ! grep -qF -- "$src" "$file"; then
                continue # a link, a binary, or a file without the shared path
            fi
            content="$(cat "$file"; printf x)"
            content="${content%x}"
            printf '%s' "${content//"$src"/"$dest"}" >"$file" # in place: the mode stays
        done
        mkdir -p "$(dirname "$dest")"
        touch "$(dirname "$dest")/.stamp" # the newest copy, for prune_releases
        mv -T "$work" "$dest"
        log "node-local copy ready: $dest ($(du -sh "$dest" | cut -f1), manifest ok)"
    fi
    point_link "$LOCAL_PREFIX/releases/$name/venv" "$env"
    if [[ "$(readlink "$LOCAL_PREFIX/current" || true)" != "releases/$name" ]]; then
        touch "$LOCAL_PREFIX/releases/$name/.stamp"
        point_link "$LOCAL_PREFIX/current" "releases/$name"
    fi
    point_link "$LOCAL_PREFIX/venv" current/venv
    release_local_lock
    prune_releases "$LOCAL_PREFIX"
}

# link_shared_env (head and login nodes): LOCAL_PREFIX/venv -> BOOTSTRAP_PREFIX/venv, so the
# path users activate is the same on every node and names the node-local copy on compute nodes.
link_shared_env() {
    mkdir -p "$LOCAL_PREFIX"
    point_link "$LOCAL_PREFIX/venv" "$BOOTSTRAP_PREFIX/venv"
}

# install_follow_timer (compute nodes): a systemd timer that runs the shared current release's
# on-node-updated.sh --node-type ComputeFleet every 2 min (plus up to 1 min at random, so 64 nodes
# do not copy at the same second): it copies a release the head node made current, and says
# nothing while there is none. HPC_TRAIN_SYSTEMD_DIR, HPC_TRAIN_SYSTEMCTL as head-node-services.sh.
install_follow_timer() {
    local unit_dir="${HPC_TRAIN_SYSTEMD_DIR:-/etc/systemd/system}" systemctl="${HPC_TRAIN_SYSTEMCTL:-systemctl}"
    local before after
    before="$({ cat "$unit_dir"/hpc-train-follow.* 2>/dev/null || true; } | sha256sum)"
    write_if_changed "$unit_dir/hpc-train-follow.service" <<UNIT
# written by bootstrap/lib.sh (install_follow_timer)
[Unit]
Description=hpc-train: copy a new release from $BOOTSTRAP_PREFIX to this node's disk
[Service]
Type=oneshot
Environment=BOOTSTRAP_PREFIX=$BOOTSTRAP_PREFIX BOOTSTRAP_LOCAL_PREFIX=$LOCAL_PREFIX
Environment=BOOTSTRAP_LOG_DIR=$(dirname "$BOOTSTRAP_LOG_FILE") BOOTSTRAP_KEEP_ENVS=${BOOTSTRAP_KEEP_ENVS:-2}
ExecStart=/bin/bash $BOOTSTRAP_PREFIX/current/src/bootstrap/on-node-updated.sh --node-type ComputeFleet
Nice=10
IOSchedulingClass=idle
UNIT
    write_if_changed "$unit_dir/hpc-train-follow.timer" <<UNIT
# written by bootstrap/lib.sh (install_follow_timer)
[Unit]
Description=hpc-train: follow $BOOTSTRAP_PREFIX/current on this node's disk
[Timer]
OnBootSec=2min
OnUnitActiveSec=2min
RandomizedDelaySec=60
[Install]
WantedBy=timers.target
UNIT
    after="$(cat "$unit_dir"/hpc-train-follow.* | sha256sum)"
    if [[ "$before" != "$after" ]]; then
        run "$systemctl" daemon-reload
        run "$systemctl" enable --now hpc-train-follow.timer
    fi
}
