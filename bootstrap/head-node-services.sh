#!/usr/bin/env bash
# hpc-train head-node services: `hpc-train metrics serve` (a service, on loopback) and
# `hpc-train doctor --all-users` (a oneshot service and its timer), as systemd units.
#
#   head-node-services.sh            (a bootstrap step: BOOTSTRAP_PREFIX, BOOTSTRAP_LOG_FILE set)
#
# On the head node only (BOOTSTRAP_NODE_TYPE=HeadNode; another node type is a logged skip). It
# renders bootstrap/systemd/*.{service,timer} with this cluster's paths, writes the settings to
# an environment file, installs both where they differ (a unit already up to date is "already
# done"), then reloads systemd and enables the metrics service and the doctor's timer. Safe to
# run again: nothing changes the second time, and a changed unit restarts only its service.
#
# Settings (environment):
#   HPC_TRAIN_VENV               the Python environment with hpc-train     [$BOOTSTRAP_PREFIX/venv]
#   HPC_TRAIN_SERVICE_USER       the user the services run as (read-only)  [root]
#   HPC_TRAIN_METRICS_ADDRESS    metrics listen address                     [127.0.0.1]
#   HPC_TRAIN_METRICS_PORT       metrics port                               [9478]
#   HPC_TRAIN_DOCTOR_EVERY       the doctor's period (systemd time span)    [5min]
#   HPC_TRAIN_DOCTOR_NOTIFY      webhook URL (or a command path) for findings [none]
#   HPC_TRAIN_SLURM_CONF         slurm.conf                                 [/opt/slurm/etc/slurm.conf]
#   HPC_TRAIN_SYSTEMD_DIR        where units go                             [/etc/systemd/system]
#   HPC_TRAIN_ENV_FILE           the services' environment file             [/etc/hpc-train/head-node.env]
#   HPC_TRAIN_SYSTEMCTL          systemctl (tests: a stub that records)     [systemctl]
set -euo pipefail
umask 022

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ "${BOOTSTRAP_NODE_TYPE:-HeadNode}" != HeadNode ]]; then
    skip "not the head node (${BOOTSTRAP_NODE_TYPE})"
    exit 0
fi

venv="${HPC_TRAIN_VENV:-$BOOTSTRAP_PREFIX/venv}"
user="${HPC_TRAIN_SERVICE_USER:-root}"
address="${HPC_TRAIN_METRICS_ADDRESS:-127.0.0.1}"
port="${HPC_TRAIN_METRICS_PORT:-9478}"
every="${HPC_TRAIN_DOCTOR_EVERY:-5min}"
notify="${HPC_TRAIN_DOCTOR_NOTIFY:-}"
slurm_conf="${HPC_TRAIN_SLURM_CONF:-/opt/slurm/etc/slurm.conf}"
unit_dir="${HPC_TRAIN_SYSTEMD_DIR:-/etc/systemd/system}"
env_file="${HPC_TRAIN_ENV_FILE:-/etc/hpc-train/head-node.env}"
systemctl="${HPC_TRAIN_SYSTEMCTL:-systemctl}"
docs="$(cd "$here/.." && pwd)/docs"

[[ -x "$venv/bin/hpc-train" ]] || die "no $venv/bin/hpc-train: run python-env.sh first (or set HPC_TRAIN_VENV)"
if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    die "HPC_TRAIN_METRICS_PORT=$port is not a TCP port"
fi
[[ "$every" =~ ^[0-9]+(s|min|h)$ ]] || die "HPC_TRAIN_DOCTOR_EVERY=$every is not a time span like 5min"
[[ "$notify" != *[[:space:]]* ]] || die "HPC_TRAIN_DOCTOR_NOTIFY must be a URL or a command path, without spaces"
id -u "$user" >/dev/null 2>&1 || die "HPC_TRAIN_SERVICE_USER=$user: no such user"
for value in "$venv" "$docs" "$env_file" "$user" "$every"; do
    [[ "$value" != *[\|\&\\]* ]] || die "'$value': the characters | & \\ are not allowed in a path or name here"
done

changed=()
# install_if_changed SRC DEST MODE: put SRC at DEST (atomically) unless it is already there.
install_if_changed() {
    local src="$1" dest="$2" mode="$3"
    if [[ -f "$dest" ]] && cmp -s "$src" "$dest"; then
        already_done "$dest"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    install -m "$mode" "$src" "$dest.tmp.$$"
    mv -f "$dest.tmp.$$" "$dest"
    log "installed $dest"
    changed+=("$(basename "$dest")")
}

was_installed=0
[[ ! -f "$unit_dir/hpc-train-metrics.service" ]] || was_installed=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

args=""
[[ -z "$notify" ]] || args="--notify $notify"
{
    printf '# hpc-train head-node services (written by bootstrap/head-node-services.sh)\n'
    printf 'SLURM_CONF=%s\n' "$slurm_conf"
    printf 'PATH=/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin\n'
    printf 'HPC_TRAIN_METRICS_ADDRESS=%s\n' "$address"
    printf 'HPC_TRAIN_METRICS_PORT=%s\n' "$port"
    printf 'HPC_TRAIN_DOCTOR_ARGS=%s\n' "$args"
} >"$work/head-node.env"
install_if_changed "$work/head-node.env" "$env_file" 0600 # a webhook URL is a secret

for unit in hpc-train-metrics.service hpc-train-doctor.service hpc-train-doctor.timer; do
    sed -e "s|@VENV@|$venv|g" -e "s|@ENV_FILE@|$env_file|g" -e "s|@USER@|$user|g" \
        -e "s|@EVERY@|$every|g" -e "s|@DOCS@|$docs|g" "$here/systemd/$unit" >"$work/$unit"
    install_if_changed "$work/$unit" "$unit_dir/$unit" 0644
done

if ((${#changed[@]} == 0)); then
    already_done "head-node services (metrics on $address:$port, doctor every $every)"
    exit 0
fi
run "$systemctl" daemon-reload
run "$systemctl" enable --now hpc-train-metrics.service hpc-train-doctor.timer
# `enable --now` starts a stopped service; a running one must restart to read a new unit or env
if ((was_installed)) && [[ " ${changed[*]} " =~ \ (hpc-train-metrics.service|head-node.env)\  ]]; then
    run "$systemctl" restart hpc-train-metrics.service
fi
log "done: metrics on $address:$port, doctor every $every (changed: ${changed[*]})"
