#!/usr/bin/env bash
# cuda12-toolchain.sh DEST: NVIDIA's CUDA 12.6 compiler (nvcc, cudart, CCCL, cuobjdump) in DEST, a
# CUDA_HOME of its own, for GPUs CUDA 13 cannot compile for (Volta, sm_70: the p3dn's V100).
# The image's /usr/local/cuda is left alone. Every archive is checked against the sha256 in
# cuda12-sm70.lock before it is unpacked (fetch_verified); DEST appears whole or not at all.
# cuda12-toolchain.sh --list: the lock's components and versions, one per line, once it is checked.
#
# A lock line that does not parse, or a lock without a component of NEEDED: one line, exit 2.
#
#   BOOTSTRAP_CUDA12_REDIST_URL   where the archives are [https://developer.download.nvidia.com/compute/cuda/redist]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What nccl-tests needs of the toolkit (the one list of it), each with a file it must bring:
#   cuda_nvcc       nvcc, ptxas, cicc and the crt/ headers cuda_runtime.h includes
#   cuda_cudart     cuda_runtime.h, cuda.h, cuda_fp16.h, cuda_bf16.h, cuda_fp8.h and libcudart
#   cuda_cccl       <nv/target>: cuda_fp16.h and cuda_bf16.h include it unless NVRTC compiles them
#                   (since CUDA 12.2), and nccl.h and nccl-tests' sources include those two
#   cuda_cuobjdump  the check that the binary holds sm_<cc> code (nccl-tests.sh)
NEEDED=(cuda_nvcc:bin/nvcc cuda_cudart:include/cuda_runtime.h cuda_cccl:include/nv/target
    cuda_cuobjdump:bin/cuobjdump)

if (($# != 1)); then
    printf 'error: usage: cuda12-toolchain.sh DEST | --list\n' >&2
    exit 2
fi
lock="$(dirname "${BASH_SOURCE[0]}")/cuda12-sm70.lock"
redist="${BOOTSTRAP_CUDA12_REDIST_URL:-https://developer.download.nvidia.com/compute/cuda/redist}"

# read_lock: ENTRIES ("component version path sha256"), every line checked, every NEEDED component
# there; else one line and exit 2.
read_lock() {
    local n=0 line component version path sha256 bytes extra need
    ENTRIES=()
    while IFS= read -r line || [[ -n "$line" ]]; do
        n=$((n + 1))
        [[ -n "${line//[[:space:]]/}" && "$line" != \#* ]] || continue
        extra=""
        read -r component version path sha256 bytes extra <<<"$line"
        if [[ -n "$extra" || ! "$component" =~ ^cuda_[a-z]+$ || ! "$version" =~ ^12\.[0-9]+\.[0-9]+$ ||
            "$path" != "$component/linux-x86_64/$component-linux-x86_64-$version-archive.tar.xz" ||
            ! "$sha256" =~ ^[0-9a-f]{64}$ || ! "${bytes:-}" =~ ^[1-9][0-9]*$ ]]; then
            bad_input "$lock:$n does not parse (component version path sha256 bytes): $line"
        fi
        ENTRIES+=("$component $version $path $sha256")
    done <"$lock"
    for need in "${NEEDED[@]}"; do
        printf '%s\n' "${ENTRIES[@]}" | grep -q "^${need%%:*} " ||
            bad_input "$lock has no ${need%%:*}: nccl-tests needs ${NEEDED[*]%%:*}"
    done
}

# complete DIR: DIR is a finished toolchain holding every NEEDED component's file (one unpacked
# before a component joined NEEDED is made again).
complete() {
    local need
    [[ -f "$1/.complete" ]] || return 1
    for need in "${NEEDED[@]}"; do [[ -e "$1/${need#*:}" ]] || return 1; done
}

read_lock
if [[ "$1" == --list ]]; then
    printf '%s\n' "${ENTRIES[@]}" | cut -d' ' -f1,2
    exit 0
fi
dest="$1"
if complete "$dest"; then
    already_done "CUDA 12 toolchain in $dest"
    exit 0
fi
mkdir -p "$(dirname "$dest")"
work="$(mktemp -d "$dest.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for entry in "${ENTRIES[@]}"; do
    read -r component version path sha256 <<<"$entry"
    archive="$BOOTSTRAP_PREFIX/downloads/$(basename "$path")"
    fetch_verified "$redist/$path" "$sha256" "$archive"
    run tar -xJf "$archive" -C "$work" --strip-components=1 --no-same-owner
    printf '%s %s\n' "$component" "$version" >>"$work/.complete"
done
complete "$work" || die "CUDA 12 toolchain incomplete after unpacking $lock"
ln -s lib "$work/lib64" # nccl-tests' Makefile links from CUDA_HOME/lib64
rm -rf "$dest"
mv -T "$work" "$dest"
trap - EXIT
log "CUDA 12 toolchain in $dest: $(tr '\n' ' ' <"$dest/.complete")"
