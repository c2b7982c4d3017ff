#!/usr/bin/env bash
# Import a registry image into a squashfs file on the shared file system with enroot, for
# `hpc-train submit --container /lustre/images/NAME.sqsh` (docs/containers.md).
#
#   bootstrap/container/import.sh [--dry-run] [--force] [--name NAME] docker://[USER@][REGISTRY#]IMAGE[:TAG]
#
# Runs `enroot import -o DIR/NAME.sqsh IMAGE` into a temporary name beside it, checks squashfs's
# magic, then renames it: a half-imported file never carries the final name. An existing
# DIR/NAME.sqsh is kept (exit 0) unless --force. Run it on a node that has enroot and credentials
# for the registry (~/.config/enroot/.credentials; for ECR see docs/containers.md).
#
#   IMPORT_OUTPUT_DIR   [/lustre/images]   where the .sqsh goes (shared by every node)
#   ENROOT              [enroot]           the enroot command
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

log() { printf '%s import: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
usage_error() { printf 'import.sh: %s (see --help)\n' "$*" >&2; exit 2; }

dry_run=0
force=0
name=""
image=""
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --dry-run) dry_run=1 ;;
        --force) force=1 ;;
        --name) (($# >= 2)) || usage_error "--name needs a value"; name="$2"; shift ;;
        --name=*) name="${1#--name=}" ;;
        -*) usage_error "unknown option $1" ;;
        *) [[ -z "$image" ]] || usage_error "one image only"; image="$1" ;;
    esac
    shift
done
[[ -n "$image" ]] || usage_error "which image? e.g. docker://nvcr.io#nvidia/pytorch:24.12-py3"
[[ "$image" == docker://* ]] || usage_error "$image: expected docker://[USER@][REGISTRY#]IMAGE[:TAG]"
reference="${image#docker://}"
reference="${reference#*@}"
if [[ "$reference" != *"#"* && "${reference%%/*}" != "$reference" && "${reference%%/*}" =~ [.:]|^localhost$ ]]; then
    rest="${image#docker://}"
    usage_error "$image: enroot separates the registry with '#', not '/': docker://${rest/\//#}"
fi
if [[ -z "$name" ]]; then # nvcr.io#nvidia/pytorch:24.12-py3 -> pytorch+24.12-py3
    name="${reference##*[#/]}"
    name="${name/:/+}"
fi
[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || usage_error "--name $name: letters, digits, . _ + - only"

out_dir="${IMPORT_OUTPUT_DIR:-/lustre/images}"
enroot="${ENROOT:-enroot}"
dest="$out_dir/$name.sqsh"

if [[ -e "$dest" && "$force" -eq 0 ]]; then
    log "already there: $dest (--force imports again)"
    exit 0
fi
if ((dry_run)); then
    log "dry run: would run: $enroot import -o $dest.part.<pid> $image, check it, rename it to $dest"
    exit 0
fi
command -v "$enroot" >/dev/null 2>&1 || die "$enroot not found: run this on a node with enroot (ParallelCluster >= 3.11 AMIs)"
mkdir -p "$out_dir"
part="$dest.part.$$"
trap 'rm -f "$part"' EXIT
log "importing $image -> $dest"
"$enroot" import -o "$part" "$image" || die "enroot import failed for $image"
[[ "$(head -c 4 "$part")" == "hsqs" ]] || die "$part is not a squashfs (enroot import wrote something else)"
chmod 0644 "$part"
mv -f "$part" "$dest"
trap - EXIT
log "ready: $dest ($(du -h "$dest" | cut -f1)); submit with --container $dest"
