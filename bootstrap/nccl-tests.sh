#!/usr/bin/env bash
# Step: NVIDIA nccl-tests (all_reduce_perf & co.), built once on the shared prefix.
#
# Source: the GitHub archive of a pinned release, checked against a pinned sha256 before it is
# unpacked. Needs nvcc (the ParallelCluster AMIs ship the CUDA toolkit in /usr/local/cuda) and
# NCCL: an explicit BOOTSTRAP_NCCL_HOME, /opt/nccl/build, the CUDA toolkit's, or else the NCCL
# that pip installed with torch in the Python environment, so the tests measure the NCCL that
# training uses. With Amazon's Open MPI (/opt/amazon/openmpi) the build is MPI-enabled
# (one rank per GPU across nodes); without it each process drives all GPUs of one node.
# Chosen by the node's GPU (nvidia-smi --query-gpu=compute_cap): CUDA 13, the image's toolkit,
# no longer compiles for compute capability below 7.5 (Volta's sm_70: the p3dn's V100), so there
# the tests are built for exactly that GPU with a CUDA 12.6 compiler of their own
# (cuda12-toolchain.sh, checksum-pinned in cuda12-sm70.lock) into nccl-tests/<version>-sm_<cc>,
# and the binary must hold sm_<cc> code (cuobjdump). Every other node (7.5 and up, or no GPU, e.g.
# the head node) builds with CUDA_HOME into nccl-tests/<version>, as before.
# all_reduce_perf links libcudart, libnccl (and libmpi) dynamically: it is linked with a RUNPATH
# naming the toolkit's, NCCL's (and MPI's) lib folders, so it starts with no LD_LIBRARY_PATH, and
# a build whose libraries the loader cannot find so is refused (one line, exit 2) and redone.
#
#   BOOTSTRAP_NCCL_TESTS_VERSION / _SHA256 / _URL   pin [2.17.6, its GitHub archive]
#   CUDA_HOME                                       [/usr/local/cuda; $PREFIX/cuda-12.6.3 below 7.5]
#   BOOTSTRAP_COMPUTE_CAP                           [nvidia-smi's answer, e.g. 7.0]
#   BOOTSTRAP_NCCL_HOME, BOOTSTRAP_MPI_HOME         [detected]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

version="${BOOTSTRAP_NCCL_TESTS_VERSION:-2.17.6}"
sha256="${BOOTSTRAP_NCCL_TESTS_SHA256:-38974e70342150ede0e3fb8fd24bfe60ccbde90fa20241716ba8bb338e6b61a0}"
url="${BOOTSTRAP_NCCL_TESTS_URL:-https://github.com/NVIDIA/nccl-tests/archive/v$version.tar.gz}"
dest="$BOOTSTRAP_PREFIX/nccl-tests/$version"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"

# compute_cap: the first GPU's compute capability ("7.0"), or nothing without a GPU.
compute_cap() {
    local cap="${BOOTSTRAP_COMPUTE_CAP:-}"
    [[ -n "$cap" ]] || cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" || true
    cap="${cap//[[:space:]]/}"
    [[ -z "$cap" || "$cap" =~ ^[0-9]+\.[0-9]$ ]] || die "nvidia-smi: unexpected compute capability '$cap'"
    printf '%s\n' "$cap"
}

cap="$(compute_cap)"
sm=""
if [[ -n "$cap" ]] && ((${cap%.*} * 10 + ${cap#*.} < 75)); then
    sm="${cap/./}" # 7.0 -> 70
    dest="$BOOTSTRAP_PREFIX/nccl-tests/$version-sm_$sm"
    cuda_home="$BOOTSTRAP_PREFIX/cuda-12.6.3"
    log "compute capability $cap: CUDA 13 has no sm_$sm, building with CUDA 12.6 in $cuda_home"
fi

# unresolved BINARY: the shared libraries BINARY needs that the loader does not find when it starts
# without LD_LIBRARY_PATH (its RUNPATH and the system's folders alone), one name per line.
unresolved() {
    env -u LD_LIBRARY_PATH ldd "$1" 2>&1 | awk '/=> not found/ { print $1 }' || true
}

# built: nccl-tests is finished in dest and all_reduce_perf's libraries resolve there.
built() { [[ -f "$dest/.complete" && -z "$(unresolved "$dest/build/all_reduce_perf")" ]]; }

# has_nccl DIR: nccl.h and a linkable libnccl.so under DIR.
has_nccl() { [[ -f "$1/include/nccl.h" && -e "$1/lib/libnccl.so" ]]; }

find_nccl() {
    local dir pip_nccl
    for dir in "${BOOTSTRAP_NCCL_HOME:-}" /opt/nccl/build "$cuda_home" /usr; do
        if [[ -n "$dir" ]] && has_nccl "$dir"; then
            printf '%s\n' "$dir"
            return 0
        fi
    done
    # torch's NCCL wheel ships libnccl.so.2 only: give the linker a libnccl.so next to it.
    pip_nccl="$("$(venv_dir)/bin/python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)" || return 1
    [[ -f "$pip_nccl/include/nccl.h" && -e "$pip_nccl/lib/libnccl.so.2" ]] || return 1
    mkdir -p "$dest.nccl-home/lib"
    ln -sfn "$pip_nccl/include" "$dest.nccl-home/include"
    ln -sfn "$pip_nccl/lib/libnccl.so.2" "$dest.nccl-home/lib/libnccl.so"
    ln -sfn "$pip_nccl/lib/libnccl.so.2" "$dest.nccl-home/lib/libnccl.so.2"
    printf '%s\n' "$dest.nccl-home"
}

if built; then
    already_done "nccl-tests $version in $dest"
    exit 0
fi
if [[ -z "$sm" && ! -x "$cuda_home/bin/nvcc" ]]; then
    skip "nccl-tests: no CUDA toolkit on this node ($cuda_home/bin/nvcc not found)"
    exit 0
fi
take_shared_lock
if built; then
    already_done "nccl-tests $version (built by another node)"
    exit 0
fi
[[ -z "$sm" ]] || run "$(dirname "${BASH_SOURCE[0]}")/cuda12-toolchain.sh" "$cuda_home"
nccl_home="$(find_nccl)" || { skip "nccl-tests: no NCCL headers and library found"; exit 0; }
tarball="$BOOTSTRAP_PREFIX/downloads/nccl-tests-$version.tar.gz"
fetch_verified "$url" "$sha256" "$tarball"

rm -rf "$dest"
mkdir -p "$dest"
run tar -xzf "$tarball" -C "$dest" --strip-components=1 --no-same-owner
make_args=(CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home")
[[ -z "$sm" ]] || make_args+=(NVCC_GENCODE="-gencode=arch=compute_$sm,code=sm_$sm")
mpi_home="${BOOTSTRAP_MPI_HOME:-/opt/amazon/openmpi}"
if [[ -x "$mpi_home/bin/mpicc" ]]; then
    make_args+=(MPI=1 MPI_HOME="$mpi_home")
else
    log "no MPI in $mpi_home: building without MPI (one process per node, -g <gpus>)"
fi
# GNU ld writes LD_RUN_PATH into the binary's RUNPATH when the link has no -rpath of its own:
# nccl-tests' has none, and its NVLDFLAGS (set with := in common.mk) cannot be added to from here.
run_path="$cuda_home/lib64:$nccl_home/lib"
[[ ! -x "$mpi_home/bin/mpicc" ]] || run_path+=":$mpi_home/lib:$mpi_home/lib64"
run env LD_RUN_PATH="$run_path" make -C "$dest" -j "$(nproc)" "${make_args[@]}"
[[ -x "$dest/build/all_reduce_perf" ]] || die "build finished without $dest/build/all_reduce_perf"
missing="$(unresolved "$dest/build/all_reduce_perf" | paste -sd' ')"
[[ -z "$missing" ]] || bad_input "$dest/build/all_reduce_perf: $missing not found (RUNPATH $run_path, no LD_LIBRARY_PATH)"
if [[ -n "$sm" ]] && ! "$cuda_home/bin/cuobjdump" --list-elf "$dest/build/all_reduce_perf" |
    grep -q "\.sm_$sm\."; then
    die "$dest/build/all_reduce_perf holds no sm_$sm code (cuobjdump --list-elf)"
fi
printf 'nccl-tests %s\nNCCL_HOME=%s\nRUNPATH=%s\n' "$version" "$nccl_home" "$run_path" >"$dest/.complete"
log "nccl-tests $version built: $dest/build (NCCL from $nccl_home)"
