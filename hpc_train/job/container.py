"""``submit --container IMAGE``: the job's launcher and ranks run inside an image.

The one owner of the container flags, in two forms, chosen by what IMAGE is:

- **pyxis** (AWS: ParallelCluster >= 3.11.1 ships enroot and pyxis, pyxis disabled until the head
  node enables it: ``bootstrap/container/enable-pyxis.sh``). IMAGE is a registry reference in
  enroot's URI form (``docker://[USER@][REGISTRY#]IMAGE[:TAG]``, or the same without
  ``docker://``, which pyxis adds) or a squashfs file made by ``enroot import``
  (``bootstrap/container/import.sh``). submitit's ``srun`` gets pyxis's options (``srun --help``
  once pyxis is loaded; NVIDIA/pyxis wiki, Usage)::

      --container-image=IMAGE --container-mounts=SRC:DST[:FLAGS][,...] --container-workdir=DIR

- **Slurm's own OCI support** (the local cluster: ``oci.conf`` beside ``slurm.conf`` runs runc;
  Slurm's containers guide). IMAGE is an OCI image directory: ``config.json`` (the runtime spec
  the image needs) and ``rootfs/`` (``slurm/local/build-image.sh`` builds one). Slurm 22.05 takes
  no mounts on the command line and runs the bundle's own ``rootfs/``, so each run gets its own
  bundle (``RunDir.oci_bundle``, written by ``write_bundle`` at submit): the image's spec, an
  empty rootfs of mount points, the image's own tree bound read-only, then the job's mounts;
  submitit's ``srun`` gets ``--container=BUNDLE``.

Mounted at their own paths either way: the save dir (checkpoints, logs, submitit's pickles, every
``.hpc-train/`` file), the data, ``--local-save-dir`` when set, and the nodes' Slurm client (the
launcher calls ``scontrol``/``sinfo``/``sbatch``; submitit requeues with ``scontrol requeue``);
then the user's ``--container-mounts``. Inside, submitit runs the image's interpreter,
``IMAGE_PYTHON``; the ranks log the image's marker (``contract.IMAGE_MARKER``).

What is checked here, offline: the reference's form, that a file image exists and starts with
squashfs's magic, that an OCI image has its spec, its rootfs and ``IMAGE_PYTHON``, that Slurm has
an ``oci.conf`` (without one Slurm ignores ``--container`` and the job would run on the host), that
each mount's source exists and its destination is absolute. What is not: that a registry holds the
image, that pyxis is enabled, that the nodes have the mounts' sources (``--local-save-dir``,
``SLURM_CLIENT_MOUNTS``). See docs/containers.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core import slurm_conf
from hpc_core.rundir import atomic_write

SQUASHFS_MAGIC = b"hsqs"  # the first 4 bytes of a squashfs filesystem (little-endian 0x73717368)
IMAGE_PYTHON = "/opt/hpc-train/venv/bin/python"  # the image's environment (the Containerfile's)
OCI_SPEC, OCI_ROOTFS = "config.json", "rootfs"  # an OCI image directory (and bundle)
REGISTRY_SCHEME = "docker://"
FILE_SUFFIXES = (".sqsh", ".squashfs")
# Docker's repository grammar, a component: lowercase alphanumerics joined by . _ __ or dashes
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    r"(?:(?P<user>[^@#/:\s]+)@)?"  # USER@ (credentials from enroot's .credentials)
    r"(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)#)?"  # REGISTRY# (enroot's separator)
    rf"(?P<image>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
)
# The nodes' Slurm client, as ParallelCluster installs it: binaries, libraries and slurm.conf
# under /opt/slurm; munged's socket. Mounted at the same paths; the image puts /opt/slurm/bin on
# PATH and has libmunge (the Containerfile).
SLURM_CLIENT_MOUNTS = ("/opt/slurm:/opt/slurm:ro", "/var/run/munge:/var/run/munge")


class ContainerError(ValueError):
    """Bad container input; the message is one line meant for the user."""


@dataclass(frozen=True)
class Mount:
    """One bind mount, pyxis's ``SRC:DST[:FLAGS]`` (FLAGS joined by ``+``, e.g. ``ro+rprivate``)."""

    source: Path
    destination: Path
    flags: str = ""

    def __str__(self) -> str:
        return f"{self.source}:{self.destination}" + (f":{self.flags}" if self.flags else "")


def _plain(path: str, what: str) -> str:
    """pyxis splits its list on ``,`` and each mount on ``:``: a path may contain neither."""
    if not path or "," in path or ":" in path:
        raise ContainerError(f"{what} {path!r}: a container mount path may not contain ',' or ':'")
    return path


def is_file_image(image: str) -> bool:
    """A path: a squashfs file, or an OCI image directory (pyxis imports anything else from a
    registry)."""
    return image.startswith(("/", ".", "~")) or image.endswith(FILE_SUFFIXES)


def is_oci_image(image: str) -> bool:
    """An OCI image directory: run through Slurm's own ``--container`` (runc), not pyxis."""
    return is_file_image(image) and Path(image).is_dir()


def parse_image(text: str) -> str:
    """``--container``: a registry reference as given, or a squashfs file's absolute path (its
    existence and magic are ``check_image_file``'s). ContainerError, one line, when malformed."""
    image = text.strip()
    flag = f"--container {text!r}"
    if not image:
        raise ContainerError(f"{flag}: empty (a registry reference or a .sqsh file)")
    if is_file_image(image):
        return str(Path(image).expanduser().absolute())
    if "://" in image and not image.startswith(REGISTRY_SCHEME):
        raise ContainerError(
            f"{flag}: only {REGISTRY_SCHEME} references (enroot's URI) or a .sqsh file, "
            "e.g. docker://nvcr.io#nvidia/pytorch:24.12-py3 or /lustre/images/hpc-train.sqsh"
        )
    reference = image.removeprefix(REGISTRY_SCHEME)
    first, slash, _ = reference.rpartition("@")[2].partition("/")
    if slash and "#" not in reference and ("." in first or ":" in first or first == "localhost"):
        raise ContainerError(
            f"{flag}: enroot separates the registry with '#', not '/': "
            f"{REGISTRY_SCHEME}{reference.replace('/', '#', 1)}"
        )
    if not _REFERENCE.fullmatch(reference):
        raise ContainerError(
            f"{flag}: neither a registry reference ([USER@][REGISTRY#]IMAGE[:TAG], "
            "e.g. docker://nvcr.io#nvidia/pytorch:24.12-py3) nor a .sqsh file"
        )
    return image


def check_image_file(image: str) -> None:
    """A file image must exist and be a squashfs (``enroot import``'s output), a directory an OCI
    image (``check_oci_image``); no-op for a registry reference. ContainerError, one line."""
    if not is_file_image(image):
        return
    path = Path(image)
    flag = f"--container {image}"
    if path.is_dir():
        check_oci_image(path)
        return
    if not path.is_file():
        raise ContainerError(f"{flag}: no such file (import one: bootstrap/container/import.sh)")
    try:
        with path.open("rb") as fh:
            magic = fh.read(len(SQUASHFS_MAGIC))
    except OSError as err:
        raise ContainerError(f"{flag}: cannot read it ({err.strerror})") from None
    if magic != SQUASHFS_MAGIC:
        raise ContainerError(
            f"{flag}: not a squashfs image (no 'hsqs' magic); make one with "
            "`enroot import` (bootstrap/container/import.sh)"
        )


def check_oci_image(image: Path) -> None:
    """An OCI image directory as ``write_bundle`` needs it, and a Slurm that runs it: its spec
    (JSON with a ``process``), its ``rootfs/`` with ``IMAGE_PYTHON``, and ``oci.conf`` beside
    slurm.conf (without it Slurm takes ``--container`` as advice and runs the job on the host).
    ContainerError, one line."""
    flag = f"--container {image}"
    build = "build one: slurm/local/build-image.sh"
    try:
        spec = json.loads((image / OCI_SPEC).read_text())
    except OSError:
        raise ContainerError(
            f"{flag}: a directory without {OCI_SPEC}: not an OCI image ({build})"
        ) from None
    except ValueError as err:
        raise ContainerError(f"{flag}: {OCI_SPEC} is not JSON ({err})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("process"), dict):
        raise ContainerError(f"{flag}: {OCI_SPEC} has no process: not an OCI runtime spec")
    rootfs = image / OCI_ROOTFS
    if not rootfs.is_dir():
        raise ContainerError(f"{flag}: no {OCI_ROOTFS}/ directory: not an OCI image ({build})")
    python = rootfs / IMAGE_PYTHON.lstrip("/")
    if not (python.is_symlink() or python.exists()):  # a link into the image's own tree, unresolved
        raise ContainerError(f"{flag}: the image has no {IMAGE_PYTHON} to run the job ({build})")
    conf = slurm_conf.conf_path()
    if conf is None or not (conf.parent / "oci.conf").is_file():
        where = f"beside {conf}" if conf else "(no slurm.conf found)"
        raise ContainerError(
            f"{flag}: Slurm's OCI support is not configured (no oci.conf {where}); Slurm would "
            "run the job on the host"
        )


def parse_mount(text: str) -> Mount:
    """``SRC:DST[:FLAGS]``; SRC relative to here is made absolute, DST must be absolute."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ContainerError(
            f"--container-mounts {text!r}: expected SRC:DST[:FLAGS], e.g. /lustre/tok:/tok:ro"
        )
    source, destination = Path(parts[0]).expanduser().absolute(), Path(parts[1])
    if not destination.is_absolute():
        raise ContainerError(
            f"--container-mounts {text!r}: the destination {parts[1]} must be an absolute path"
        )
    flags = parts[2] if len(parts) == 3 else ""
    if flags and not re.fullmatch(r"[a-z]+(\+[a-z]+)*", flags):
        raise ContainerError(f"--container-mounts {text!r}: FLAGS are words joined by '+'")
    return Mount(source, destination, flags)


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """``--container-mounts``: a comma list of ``SRC:DST[:FLAGS]``."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ContainerError(f"--container-mounts {text!r}: expected SRC:DST[:FLAGS][,...]")
    return tuple(parse_mount(item) for item in items)


def check_mount_sources(mounts: Iterable[Mount]) -> None:
    """Each user mount's source must exist here (the submit host sees the shared file systems
    the nodes see). ContainerError, one line."""
    for mount in mounts:
        if not mount.source.exists():
            raise ContainerError(f"--container-mounts {mount}: no such source {mount.source}")


def local_client_mounts(conf: Path | None) -> tuple[Mount, ...]:
    """The Slurm client of a cluster that runs OCI images itself: slurm.conf's directory and
    munged's socket directory (``AuthInfo=socket=``, else munge's default), at their own paths;
    the binaries are the host's /usr, which the image binds."""
    if conf is None:
        return ()
    auth = slurm_conf.conf_value(conf, "AuthInfo") or ""
    socket = next(
        (kv.partition("=")[2] for kv in auth.split(",") if kv.startswith("socket=")),
        "/run/munge/munge.socket.2",
    )
    dirs = [conf.parent, Path(socket).parent]
    return tuple(Mount(d, d) for d in dict.fromkeys(dirs) if d.exists())


def client_mounts(image: str) -> tuple[Mount, ...]:
    """The nodes' Slurm client, as the image's runtime needs it: ParallelCluster's paths for
    pyxis, this cluster's own (``local_client_mounts``) for an OCI image."""
    if is_oci_image(image):
        return local_client_mounts(slurm_conf.conf_path())
    return tuple(parse_mount(m) for m in SLURM_CLIENT_MOUNTS)


def job_mounts(
    save_dir: Path,
    data: Path,
    local_save_dir: Path | None,
    extra: Sequence[Mount] = (),
    client: Sequence[Mount] = (),
) -> tuple[Mount, ...]:
    """Every mount of the job's container, in order: the save dir, the data, the node-local
    tier, the Slurm client (``client_mounts``), the user's. Each path once; two mounts on one
    destination are an error (ContainerError)."""
    own = [save_dir, data, *([local_save_dir] if local_save_dir is not None else [])]
    mounts = [Mount(p, p) for p in own]
    mounts += client
    mounts += extra
    unique: list[Mount] = []
    for mount in mounts:
        _plain(str(mount.source), "mount source")
        _plain(str(mount.destination), "mount destination")
        if mount in unique:
            continue
        clash = next((m for m in unique if m.destination == mount.destination), None)
        if clash is not None:
            raise ContainerError(
                f"--container-mounts {mount}: {mount.destination} is already mounted ({clash})"
            )
        unique.append(mount)
    return tuple(unique)


def bundle_spec(image: Path, mounts: Sequence[Mount], workdir: Path) -> dict[str, Any]:
    """The run's OCI runtime spec: the image's, its root the bundle's own (empty, read-only)
    ``rootfs`` of mount points, then each top-level entry of the image's rootfs that holds
    something (the image's own tree, e.g. /opt) bound read-only, then the job's ``mounts``; the
    working directory the save dir (pyxis's ``--container-workdir``). Slurm replaces the
    process's arguments and environment with the step's."""
    spec: dict[str, Any] = json.loads((image / OCI_SPEC).read_text())
    spec["root"] = {"path": OCI_ROOTFS, "readonly": True}
    spec["process"]["cwd"] = str(workdir)
    rootfs = (image / OCI_ROOTFS).absolute()
    own = [e for e in sorted(rootfs.iterdir()) if e.is_file() or any(e.iterdir())]
    binds = [Mount(e, Path("/", e.name), "ro") for e in own] + list(mounts)
    spec.setdefault("mounts", [])
    for mount in binds:
        options = ["rbind", "nosuid", *(f for f in mount.flags.split("+") if f)]
        spec["mounts"].append(
            {"destination": str(mount.destination), "type": "bind",
             "source": str(mount.source), "options": options}
        )  # fmt: skip
    return spec


def write_bundle(bundle: Path, image: Path, mounts: Sequence[Mount], workdir: Path) -> None:
    """The run's OCI bundle for Slurm's ``--container`` (``bundle_spec``), written before the
    job is submitted; a resubmit of the run writes it anew (atomic: whole or the old one)."""
    (bundle / OCI_ROOTFS).mkdir(parents=True, exist_ok=True)
    atomic_write(bundle / OCI_SPEC, json.dumps(bundle_spec(image, mounts, workdir), indent=1))


def srun_args(image: str, mounts: Sequence[Mount], workdir: Path, bundle: Path) -> list[str]:
    """The options for submitit's ``srun`` (``SlurmExecutor``'s ``srun_args``): Slurm's own
    ``--container`` with the run's bundle for an OCI image (``write_bundle``), pyxis's else."""
    if is_oci_image(image):
        return [f"--container={bundle}"]
    return [
        f"--container-image={image}",
        f"--container-mounts={','.join(map(str, mounts))}",
        f"--container-workdir={workdir}",
    ]
