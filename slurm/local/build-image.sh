#!/usr/bin/env bash
# The local cluster's container image: an OCI image directory that `submit --container DIR` runs
# through Slurm's own OCI support (oci.conf, written by cluster.sh, runs Debian's runc).
#
#   build-image.sh [--venv DIR] [--out DIR]     (defaults: <repo>/.venv, <repo>/.local/images/hpc-train)
#
# What the image holds (its own layer, copied in): /opt/hpc-train/venv, a Python environment with
# torch, fairseq and their dependencies, and the tracking extra's tensorboard and wandb as `make
# install-python` installs them (hard links to the project's venv files where the file system
# allows, else copies) and this project installed from the working tree's files as a wheel
# (not editable: the image does not see the source tree), its scripts' #! lines pointing at the
# image's interpreter; and /opt/hpc-train/image.json, the marker only the image has (what it was
# built from, when; the ranks log it). What it borrows: the operating system. No base image can
# be pulled here (no registry but PyPI and Debian's), so config.json binds the host's /usr, /lib,
# /lib64, /bin, /sbin and /etc read-only, and the interpreter's installation (sys.base_prefix,
# e.g. pyenv's) where it is elsewhere: the image's venv is made for that interpreter. The rootfs
# is read-only inside the container; /tmp is the container's own tmpfs; there is one namespace,
# mount: the node's hostname (UTS), network and process ids stay the host's (Slurm's containers
# guide: the host network only), so rendezvous, heartbeat pids and signals work as outside.
#
# Idempotent and cached: the image's key is the hash of the project's files as the working tree has
# them and the venv's install stamp; an image with the same key is reused, a different one
# replaced. Built in a temporary sibling and renamed into place: a build that fails or is killed
# leaves no image.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=$repo/.venv
out=$repo/.local/images/hpc-train
prefix=/opt/hpc-train # the image's own tree; IMAGE_PYTHON and IMAGE_MARKER in hpc_train.job.container

log() { printf '[%s] build-image: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }
die() { log "error: $*"; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --venv) venv=${2:?--venv DIR}; shift 2 ;;
    --out) out=${2:?--out DIR}; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

command -v runc >/dev/null || die "runc is not installed: run 'make install-system'"
[ -x "$venv/bin/python" ] || die "no Python environment at $venv: run 'make install-python'"
py_version=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
site=lib/python$py_version/site-packages
# The interpreter's own installation (pyenv's, a distribution's /usr, ...): bound like the OS.
base_prefix=$("$venv/bin/python" -c 'import sys; print(sys.base_prefix)')
[ -d "$venv/$site" ] || die "$venv has no $site"

# The project's files as the working tree has them: tracked and new ones git does not ignore.
project_files() {
  local f
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -f "$repo/$f" ]; then printf '%s\0' "$f"; fi; done
}
key=$(
  cd "$repo"
  { project_files | xargs -0 sha256sum; stat -c '%Y %s' "$venv/.installed" 2>/dev/null || echo no-stamp; } |
    sha256sum | cut -c1-16
)
if [ -f "$out/rootfs$prefix/image.json" ] && grep -q "\"key\": \"$key\"" "$out/rootfs$prefix/image.json"; then
  log "up to date: $out (key $key)"
  echo "$out"
  exit 0
fi

mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d "$(dirname "$out")/.$(basename "$out").XXXXXX")
trap 'rm -rf "$tmp"' EXIT
rootfs=$tmp/rootfs
image_venv=$rootfs$prefix/venv
log "building $out (key $key) from $venv"

# The operating system's mount points (bound from the host) and the container's own.
mkdir -p "$rootfs"/{usr,lib,lib64,bin,sbin,etc,proc,dev,sys,tmp,run,var/tmp}

# The image's environment: a venv for the host's interpreter, the packages linked in, then the
# project from the working tree's tracked files, installed by the image's own pip into the image
# (the host venv's pip would uninstall the host's editable install first). The editable install's
# hooks are not copied: they point at the source tree, which the image does not see.
"$base_prefix/bin/python$py_version" -m venv --without-pip "$image_venv"
cp -al "$venv/$site/." "$image_venv/$site/" 2>/dev/null || cp -a "$venv/$site/." "$image_venv/$site/"
find "$image_venv/$site" -maxdepth 1 \( -name '__editable__*' -o -name 'hpc_train-*.dist-info' \) \
  -exec rm -rf {} +
mkdir -p "$tmp/src"
project_files | (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$tmp/src"
"$image_venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index "$tmp/src" 2>&1 |
  { grep -v -e 'is ignored: it is neither a file nor a directory' -e '^ *!!' || true; }
rm -rf "$tmp/src"
# Console scripts (torchrun, hpc-train, ...): the venv's, with the image's interpreter.
for script in "$venv"/bin/*; do
  name=$(basename "$script")
  if [ ! -f "$script" ] || [ -L "$script" ] || [ -e "$image_venv/bin/$name" ]; then continue; fi
  head -c 2 "$script" | grep -q '^#!' || continue
  sed "1s|^#!.*|#!$prefix/venv/bin/python|" "$script" >"$image_venv/bin/$name"
  chmod 0755 "$image_venv/bin/$name"
done
for script in "$image_venv"/bin/*; do
  if [ ! -f "$script" ] || [ -L "$script" ]; then continue; fi
  if head -n 1 "$script" | grep -q "^#!.*$tmp"; then sed -i "1s|^#!.*|#!$prefix/venv/bin/python|" "$script"; fi
done

# The marker only the image has.
cat >"$rootfs$prefix/image.json" <<EOF
{"image": "hpc-train-local", "key": "$key", "built": "$(date -u +%FT%TZ)", "python": "$py_version", "commit": "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"}
EOF

# config.json: runc's own default spec, then what this image needs (see the header).
(cd "$tmp" && runc spec)
python3 - "$tmp/config.json" "$base_prefix" <<'EOF'
import json, sys

path, base_prefix = sys.argv[1], sys.argv[2]
spec = json.load(open(path))
spec.pop("hostname", None)  # the node's own (UTS namespace shared)
spec["root"] = {"path": "rootfs", "readonly": True}
spec["process"].update(terminal=False, args=["/bin/false"], cwd="/")
spec["process"].pop("rlimits", None)  # the job's limits, not runc's 1024 open files
spec["linux"]["namespaces"] = [{"type": "mount"}]
for mount in spec["mounts"]:
    if mount["destination"] == "/dev/shm":  # data loaders' shared memory: no 64 MiB cap
        mount["options"] = [o for o in mount["options"] if not o.startswith("size=")]
spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]})
host_dirs = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"]
if not any(base_prefix == d or base_prefix.startswith(d + "/") for d in host_dirs):
    host_dirs.append(base_prefix)
for host_dir in host_dirs:
    spec["mounts"].append({"destination": host_dir, "type": "bind", "source": host_dir,
                           "options": ["rbind", "ro", "nosuid"]})
json.dump(spec, open(path, "w"), indent=1)
EOF

rm -rf "$out.old"
if [ -e "$out" ]; then mv "$out" "$out.old"; fi
mv "$tmp" "$out"
trap - EXIT
rm -rf "$out.old"
log "built $out"
echo "$out"
