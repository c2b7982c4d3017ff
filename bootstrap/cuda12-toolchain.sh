#!/usr/bin/env bash
# cuda12-toolchain.sh DEST: NVIDIA's CUDA 12.6 compiler (nvcc, cudart, cuobjdump) in DEST, a
# CUDA_HOME of its own, for GPUs CUDA 13 cannot compile for (Volta, sm_70: the p3dn's V100).
# The image's /usr/local/cuda is left alone. Every archive is checked against the sha256 in
# cuda12-sm70.lock before it is unpacked (fetch_verified); DEST appears whole or not at all.
#
#   BOOTSTRAP_CUDA12_REDIST_URL   where the archives are [https://developer.download.nvidia.com/compute/cuda/redist]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if (($# != 1)); then
    printf 'error: usage: cuda12-toolchain.sh DEST\n' >&2
    exit 2
fi
dest="$1"
lock="$(dirname "${BASH_SOURCE[0]}")/cuda12-sm70.lock"
redist="${BOOTSTRAP_CUDA12_REDIST_URL:-https://developer.download.nvidia.com/compute/cuda/redist}"

if [[ -f "$dest/.complete" ]]; then
    already_done "CUDA 12 toolchain in $dest"
    exit 0
fi
mkdir -p "$(dirname "$dest")"
work="$(mktemp -d "$dest.XXXXXX")"
trap 'rm -rf "$work"' EXIT
while read -r component version path sha256 _bytes; do
    [[ -n "$component" && "$component" != \#* ]] || continue
    archive="$BOOTSTRAP_PREFIX/downloads/$(basename "$path")"
    fetch_verified "$redist/$path" "$sha256" "$archive"
    run tar -xJf "$archive" -C "$work" --strip-components=1 --no-same-owner
    printf '%s %s\n' "$component" "$version" >>"$work/.complete.part"
done <"$lock"
[[ -x "$work/bin/nvcc" && -x "$work/bin/cuobjdump" && -f "$work/include/cuda_runtime.h" ]] ||
    die "CUDA 12 toolchain incomplete after unpacking $lock"
ln -s lib "$work/lib64" # nccl-tests' Makefile links from CUDA_HOME/lib64
mv "$work/.complete.part" "$work/.complete"
rm -rf "$dest"
mv -T "$work" "$dest"
trap - EXIT
log "CUDA 12 toolchain in $dest: $(tr '\n' ' ' <"$dest/.complete")"
