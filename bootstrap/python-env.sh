#!/usr/bin/env bash
# Step: the Python environment of one release on the shared prefix, built once and shared by
# every node.
#
#   releases/<sha16>/venv-<key>/   a venv; <key> hashes everything that goes into it
#   releases/<sha16>/venv          -> venv-<key> (swapped atomically)
#
# BOOTSTRAP_SOURCE_DIR is the release's src/ (the entry script unpacked it there). The entry
# script makes the release `current` once this step has finished; prune_releases (lib.sh) removes
# old releases and environments a release no longer links.
#
# Install order matters: torch first (from its own index), then cython/numpy and fairseq-fixed
# built against that torch without build isolation, then the project. Another interpreter or spec
# gives a new key, hence a new environment next to the old one.
#
# torch: the cu126 builds are the newest CUDA builds that still include V100 (sm_70) kernels, which
# p3dn.24xlarge needs; they run on A100/H100 (p4d/p5) as well.
#
#   BOOTSTRAP_PYTHON            interpreter (>= 3.11) [python3.13/3.12/3.11 on PATH, else installed
#                               from the OS packages]
#   BOOTSTRAP_TORCH_SPEC        [torch==2.13.0]; empty: skip
#   BOOTSTRAP_TORCH_INDEX_URL   [https://download.pytorch.org/whl/cu126]; empty: pip's own config
#   BOOTSTRAP_FAIRSEQ_SPEC      [fairseq-fixed==0.12.3.1]; empty: skip fairseq and its build deps
#   BOOTSTRAP_PROJECT_PIP_ARGS  extra pip arguments for the project, e.g. --no-deps [none]
#   BOOTSTRAP_PROJECT_EXTRAS    the project's extras, comma-separated [tracking: tensorboard and
#                               wandb, for submit --tensorboard and --wandb-project]; empty: none
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${BOOTSTRAP_SOURCE_DIR:?BOOTSTRAP_SOURCE_DIR must point at the unpacked project}"
torch_spec="${BOOTSTRAP_TORCH_SPEC-torch==2.13.0}"
torch_index="${BOOTSTRAP_TORCH_INDEX_URL-https://download.pytorch.org/whl/cu126}"
fairseq_spec="${BOOTSTRAP_FAIRSEQ_SPEC-fairseq-fixed==0.12.3.1}"
read -r -a project_args <<<"${BOOTSTRAP_PROJECT_PIP_ARGS:-}"
extras="${BOOTSTRAP_PROJECT_EXTRAS-tracking}"

# An interpreter >= 3.11 must exist on every node (the venv links to it), so this part is per node.
find_python() {
    local candidate
    if [[ -n "${BOOTSTRAP_PYTHON:-}" ]]; then
        printf '%s\n' "$BOOTSTRAP_PYTHON"
        return 0
    fi
    for candidate in python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

install_python() {
    if command -v apt-get >/dev/null 2>&1; then
        run apt-get update -q
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv
    elif command -v dnf >/dev/null 2>&1; then
        run dnf install -y -q python3.11
    else
        die "no Python >= 3.11 and no apt-get/dnf to install one: set BOOTSTRAP_PYTHON"
    fi
}

python="$(find_python)" || { install_python; python="$(find_python)" || die "python3.11 still missing"; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$python is older than 3.11 (hpc-train needs >= 3.11)"
python_id="$("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
log "interpreter: $python_id"

release="$(dirname "$BOOTSTRAP_SOURCE_DIR")"
key="$(printf '%s\n' "$python_id" "$torch_spec" "$torch_index" "$fairseq_spec" \
    "${project_args[*]:-}" "$extras" "$(basename "$release")" | sha256sum | cut -c1-12)"
env_dir="$release/venv-$key"
point_venv_link() { point_link "$release/venv" "venv-$key"; }

if [[ -f "$env_dir/.complete" ]]; then
    already_done "Python environment $env_dir"
    point_venv_link
    exit 0
fi

take_shared_lock
if [[ -f "$env_dir/.complete" ]]; then # another node built it while we waited
    already_done "Python environment $env_dir (built by another node)"
    point_venv_link
    exit 0
fi
rm -rf "$env_dir" # left half-built by an interrupted run
log "building Python environment $env_dir"
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then # Debian/Ubuntu split it off
    version="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    command -v apt-get >/dev/null 2>&1 || die "$python cannot make venvs (no ensurepip)"
    run apt-get update -q
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python$version-venv"
fi
run "$python" -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip --disable-pip-version-check install --no-input)
if [[ -n "$torch_spec" ]]; then
    index_args=()
    [[ -z "$torch_index" ]] || index_args=(--index-url "$torch_index")
    run "${pip[@]}" "${index_args[@]}" "$torch_spec"
else
    skip "torch (BOOTSTRAP_TORCH_SPEC is empty)"
fi
checks="import hpc_train"
if [[ -n "$fairseq_spec" ]]; then
    run "${pip[@]}" cython numpy setuptools wheel
    run env MAX_JOBS="$(nproc)" "${pip[@]}" --no-build-isolation "$fairseq_spec"
    checks+=", fairseq"
else
    skip "fairseq (BOOTSTRAP_FAIRSEQ_SPEC is empty)"
fi
project="$BOOTSTRAP_SOURCE_DIR"
[[ -z "$extras" ]] || project+="[$extras]"
run "${pip[@]}" "${project_args[@]}" "$project"
[[ -z "$torch_spec" ]] || checks+=", torch"
[[ ",$extras," != *,tracking,* ]] || checks+=", tensorboard, wandb"
run "$env_dir/bin/python" -c "$checks; print('imports ok: $checks')"
{
    printf 'python: %s\ntorch: %s (index: %s)\nfairseq: %s\n' "$python_id" "${torch_spec:-none}" \
        "${torch_index:-pip default}" "${fairseq_spec:-none}"
    printf 'project: %s %s\n' "$project" "${project_args[*]:-}"
} >"$env_dir/.complete"
log "Python environment ready: $env_dir"
point_venv_link
