#!/usr/bin/env bash
# Enable pyxis (srun --container-image) on a ParallelCluster >= 3.11.1 cluster, whose AMIs ship
# enroot and pyxis with pyxis disabled (aws-parallelcluster-cookbook CHANGELOG, 3.11.1). As the
# ParallelCluster guide "Running containerized jobs with Pyxis" does it, but copying the sample
# configurations from /opt/parallelcluster/examples instead of moving them, and idempotent: a
# second run changes nothing and does not reconfigure Slurm.
#
#   bootstrap/container/enable-pyxis.sh [--head | --compute] [--dry-run]
#
# Head node (--head, the default): enroot's directories and enroot.conf, pyxis's runtime directory, then the
# SPANK include (plugstack.conf: `include <slurm etc>/plugstack.conf.d/*`, added to an existing
# plugstack.conf that lacks it) and plugstack.conf.d/pyxis.conf, and `scontrol reconfigure` when
# one of the two changed. --compute: the directories and enroot.conf only (OnNodeStart on the
# compute nodes, as the guide says).
#
#   PYXIS_SLURM_ETC        [/opt/slurm/etc]
#   PYXIS_EXAMPLES         [/opt/parallelcluster/examples]
#   PYXIS_RUNTIME_DIR      [/run/pyxis]
#   ENROOT_CONF_DIR        [/etc/enroot]
#   ENROOT_PERSISTENT_DIR  [/var/enroot]
#   ENROOT_VOLATILE_DIR    [/run/enroot]
#   SCONTROL               [scontrol]
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { printf '%s [%s] enable-pyxis: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname -s)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

compute=0
dry_run=0
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --head) compute=0 ;;
        --compute) compute=1 ;;
        --dry-run) dry_run=1 ;;
        *) printf 'enable-pyxis.sh: unknown argument %s (see --help)\n' "$1" >&2; exit 2 ;;
    esac
    shift
done

slurm_etc="${PYXIS_SLURM_ETC:-/opt/slurm/etc}"
examples="${PYXIS_EXAMPLES:-/opt/parallelcluster/examples}"
pyxis_runtime="${PYXIS_RUNTIME_DIR:-/run/pyxis}"
enroot_conf_dir="${ENROOT_CONF_DIR:-/etc/enroot}"
enroot_persistent="${ENROOT_PERSISTENT_DIR:-/var/enroot}"
enroot_volatile="${ENROOT_VOLATILE_DIR:-/run/enroot}"
scontrol="${SCONTROL:-scontrol}"
plugstack="$slurm_etc/plugstack.conf"
include_line="include $slurm_etc/plugstack.conf.d/*"
changed=0

# act DESCRIPTION CMD...: run CMD (or only say it with --dry-run); counts as a change.
act() {
    local what="$1"
    shift
    changed=1
    if ((dry_run)); then
        log "dry run: would $what"
    else
        "$@" || die "could not $what"
        log "$what"
    fi
}

append_line() { printf '%s\n' "$1" >>"$2"; }

# shared_dir DIR: a world-writable sticky directory (1777), as the guide makes them.
shared_dir() {
    local dir="$1"
    if [[ -d "$dir" && "$(stat -c %a "$dir")" == 1777 ]]; then
        log "already done: $dir"
        return 0
    fi
    act "create $dir (1777)" install -d -m 1777 "$dir"
}

# copy_if_changed SRC DEST: DEST gets SRC's content unless it already has it.
copy_if_changed() {
    local src="$1" dest="$2"
    if [[ -f "$dest" ]] && cmp -s "$src" "$dest"; then
        log "already done: $dest"
        return 0
    fi
    [[ -f "$src" ]] || die "$src not found: not a ParallelCluster >= 3.11.1 AMI? (it ships pyxis's sample configurations there)"
    act "install $dest from $src" install -D -m 0644 "$src" "$dest"
}

shared_dir "$enroot_persistent"
shared_dir "$enroot_volatile"
shared_dir "$pyxis_runtime"
copy_if_changed "$examples/enroot/enroot.conf" "$enroot_conf_dir/enroot.conf"
if ((compute)); then
    log "compute node: directories and enroot.conf ready (Slurm's plugstack is the head node's)"
    exit 0
fi

changed=0 # only the SPANK configuration needs Slurm reconfigured
if [[ ! -f "$plugstack" ]]; then
    copy_if_changed "$examples/spank/plugstack.conf" "$plugstack"
    grep -qxF "$include_line" "$plugstack" 2>/dev/null || ((dry_run)) ||
        die "$plugstack does not include $slurm_etc/plugstack.conf.d/*"
elif grep -qxF "$include_line" "$plugstack"; then
    log "already done: $plugstack includes plugstack.conf.d"
else
    act "add '$include_line' to $plugstack" append_line "$include_line" "$plugstack"
fi
copy_if_changed "$examples/pyxis/pyxis.conf" "$slurm_etc/plugstack.conf.d/pyxis.conf"
if ((changed)); then
    act "reconfigure Slurm ($scontrol reconfigure)" "$scontrol" reconfigure
else
    log "pyxis already enabled: Slurm not reconfigured"
fi
