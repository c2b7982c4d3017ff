"""EC2 instance types and the process environment their ranks need. Pure.

Every function maps an instance type (and a flag or two) to variables, each with the reason it is
set, so the launcher, the nccl checks and the bootstrap scripts share one table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_INSTANCE_TYPE = "p3dn.24xlarge"  # the cluster pcluster_configs/p3dn.yaml builds


@dataclass(frozen=True)
class InstanceType:
    """What the launcher and the health checks need to know about one EC2 instance type."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int  # per GPU, as the instance type's spec sheet states it
    efa: bool
    gpudirect_rdma: bool  # EFA device supports RDMA read (GPUDirect); p3dn does not
    nvlink_links: int  # NVLink links expected up per GPU (0: do not check)
    cores: int  # physical cores (what Slurm sees with SMT off)
    # ParallelCluster's GPU health check (HealthChecks.Gpu: `dcgmi diag -r 2` in every job's
    # prolog) is fit for this type. Not for the V100 on an R580 driver (docs/on-aws.md, "The GPU
    # check before training"): the shipped configs turn it off there, and the launcher checks
    # each node through NVML before training instead (submit's --node-check, on by default there)
    dcgm_prolog: bool = True


def _types(*items: InstanceType) -> dict[str, InstanceType]:
    return {t.name: t for t in items}


# Sources: the EC2 accelerated-computing instance pages (GPU model, GPU memory, EFA, cores).
INSTANCE_TYPES: dict[str, InstanceType] = _types(
    InstanceType(
        "p3dn.24xlarge", 8, "V100", 32, True, False, nvlink_links=6, cores=48, dcgm_prolog=False
    ),
    InstanceType("p4d.24xlarge", 8, "A100", 40, True, True, nvlink_links=12, cores=48),
    InstanceType("p4de.24xlarge", 8, "A100", 80, True, True, nvlink_links=12, cores=48),
    InstanceType("p5.48xlarge", 8, "H100", 80, True, True, nvlink_links=18, cores=96),
)


@dataclass(frozen=True)
class Setting:
    value: str
    why: str


def instance_type(name: str) -> InstanceType:
    """Look up an instance type; ValueError names the known ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise ValueError(f"unknown instance type {name!r} (known: {known})") from None


# What aws-ofi-nccl's own table says to set for which versions (doc/efa-env-var.md in
# github.com/aws/aws-ofi-nccl, "Sample Presets"): FI_EFA_USE_DEVICE_RDMA=1 on p4/p5 only until
# libfabric 1.18 and aws-ofi-nccl 1.7 (from then on the plugin enables it itself); FI_PROVIDER=efa
# and NCCL_PROTO=simple only for aws-ofi-nccl <= 1.5. `versions` is what the node has installed,
# as bootstrap/nccl-profile.sh records it (read_versions); a missing key means "not found".
LIBFABRIC = "libfabric"
AWS_OFI_NCCL = "aws-ofi-nccl"
NCCL = "nccl"
LIBFABRIC_DEVICE_RDMA_DEFAULT = (1, 18)  # libfabric >= 1.18 ...
OFI_NCCL_DEVICE_RDMA_DEFAULT = (1, 7)  # ... and aws-ofi-nccl >= 1.7: RDMA without the variable
OFI_NCCL_LAST_NEEDING_PROVIDER = (1, 5)  # aws-ofi-nccl <= 1.5: FI_PROVIDER=efa, NCCL_PROTO=simple


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The leading X.Y[.Z] of a version as tools print it ("1.22.0amzn4.0", "1.11.0-aws")."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def read_versions(text: str) -> dict[str, str]:
    """`name=version` lines (# comments and blank lines ignored), as nccl-profile.sh writes them.

    ValueError for a line that is not `name=version` or a version that does not start X.Y.
    """
    versions: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep or not name or parse_version(value) is None:
            raise ValueError(f"line {number}: {raw!r} is not name=X.Y.Z")
        versions[name] = value
    return versions


def efa_nccl_env(
    name: str, debug: bool = False, versions: Mapping[str, str] | None = None
) -> dict[str, Setting]:
    """NCCL over EFA (aws-ofi-nccl) for a GPU instance type, each variable with its reason.

    ``versions`` (libfabric, aws-ofi-nccl; see read_versions) picks the variables aws-ofi-nccl's
    documentation asks for those versions. A version that is not known is named as unknown in
    the reason of every setting that depends on it, and the setting kept as the older software
    needs it (harmless on newer software, by the same document).
    """
    itype = instance_type(name)
    versions = versions or {}
    fabric_text = versions.get(LIBFABRIC)
    plugin_text = versions.get(AWS_OFI_NCCL)
    fabric = parse_version(fabric_text) if fabric_text else None
    plugin = parse_version(plugin_text) if plugin_text else None
    fabric_is = f"libfabric {fabric_text}" if fabric else "libfabric version unknown"
    plugin_is = f"aws-ofi-nccl {plugin_text}" if plugin else "aws-ofi-nccl version unknown"
    env: dict[str, Setting] = {}
    if plugin is None:
        env["FI_PROVIDER"] = Setting(
            "efa", f"{plugin_is}: set as aws-ofi-nccl <= 1.5 needs it (libfabric's EFA provider)"
        )
    elif plugin[:2] <= OFI_NCCL_LAST_NEEDING_PROVIDER:
        env["FI_PROVIDER"] = Setting("efa", f"{plugin_is} (<= 1.5): use libfabric's EFA provider")
        env["NCCL_PROTO"] = Setting("simple", f"{plugin_is} (<= 1.5) needs the simple protocol")
    # aws-ofi-nccl >= 1.6 picks the EFA provider itself: FI_PROVIDER stays unset. Unknown: only
    # FI_PROVIDER (harmless with a newer plugin), not NCCL_PROTO=simple (costs bandwidth there).
    env["FI_EFA_USE_HUGE_PAGE"] = Setting(
        "0", "avoid fork() failures in dataloader workers when huge pages are exhausted"
    )
    env["NCCL_DEBUG"] = Setting(
        "INFO" if debug else "WARN",
        "INFO prints the transport NCCL picked (look for 'NET/AWS Libfabric')",
    )
    if itype.gpudirect_rdma:
        rdma_by_default = (
            fabric is not None
            and plugin is not None
            and fabric[:2] >= LIBFABRIC_DEVICE_RDMA_DEFAULT
            and plugin[:2] >= OFI_NCCL_DEVICE_RDMA_DEFAULT
        )
        if not rdma_by_default:
            unknown = [w for w in (fabric_is, plugin_is) if w.endswith("unknown")]
            because = ", ".join(unknown) if unknown else f"{fabric_is}, {plugin_is}"
            env["FI_EFA_USE_DEVICE_RDMA"] = Setting(
                "1",
                f"{itype.name} EFA supports RDMA read: GPUDirect RDMA between nodes "
                f"({because}; not needed from libfabric 1.18 + aws-ofi-nccl 1.7)",
            )
        # else: libfabric >= 1.18 with aws-ofi-nccl >= 1.7 uses RDMA read without being told
    # p3dn: FI_EFA_USE_DEVICE_RDMA must stay unset (the device has no RDMA read; setting it
    # aborts). FI_EFA_FORK_SAFE is a no-op on kernels >= 5.15 and RDMAV_FORK_SAFE must never be
    # set (doc/efa-env-var.md).
    return env


# What bootstrap/nccl-profile.sh leaves on a node (its BOOTSTRAP_VERSIONS_FILE and
# BOOTSTRAP_PROFILE_DIR defaults): the versions it found, and the profile `python -m
# hpc_train.environment --versions FILE` wrote from them. Jobs read these at start, so their
# variables are the node's, not the unknown-version set a submit host (which cannot know the
# nodes' software) would pick. The *_ENV variables name another path (tests, other set-ups).
NODE_VERSIONS_FILE = "/etc/hpc-train/efa-versions"
NODE_VERSIONS_ENV = "HPC_TRAIN_EFA_VERSIONS"
NODE_PROFILE = "/etc/profile.d/hpc-train-nccl.sh"
NODE_PROFILE_ENV = "HPC_TRAIN_NCCL_PROFILE"


def node_versions(path: str | Path | None = None) -> dict[str, str] | None:
    """The versions recorded on this node (read_versions); None when the node has no such file.

    ``path``: default $HPC_TRAIN_EFA_VERSIONS, else NODE_VERSIONS_FILE. ValueError (naming the
    file) for a file that is not name=version lines: a broken record is said, never guessed at.
    """
    where = Path(path or os.environ.get(NODE_VERSIONS_ENV) or NODE_VERSIONS_FILE)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"{where}: {err.strerror}") from None
    try:
        return read_versions(text)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def node_env_lines(name: str) -> list[str]:
    """Job-script lines: at job start, the node's own EFA/NCCL profile (what the bootstrap wrote
    with efa_nccl_env for the versions it found); only on a node without one, the unknown-version
    set, each variable naming the unknown version as its reason.

    Shell, not Python: the batch script runs on the host, whose Python may not hold hpc_train
    (a --container job); the profile is that Python's answer, written when the node was set up.
    """
    fallback = shell_lines(efa_nccl_env(name))
    return [
        "# the node's own EFA/NCCL variables: bootstrap/nccl-profile.sh wrote them with "
        f"hpc_train.environment for the versions it found ({NODE_VERSIONS_FILE})",
        f'nccl_profile="${{{NODE_PROFILE_ENV}:-{NODE_PROFILE}}}"',
        'if [ -r "$nccl_profile" ]; then',
        '    . "$nccl_profile"',
        "else",
        "    # no profile: not a node bootstrap/nccl-profile.sh set up, its versions are unknown",
        *(f"    {line}" for line in fallback),
        "fi",
    ]


FLIGHT_RECORDER_ENTRIES = 2000


def flight_recorder_env(
    dump_prefix: str, pipe_prefix: str, entries: int = FLIGHT_RECORDER_ENTRIES
) -> dict[str, Setting]:
    """PyTorch's NCCL flight recorder for GPU ranks (ProcessGroupNCCL; gloo ignores all of it).

    Each rank keeps its last ``entries`` collectives and dumps them to ``<dump_prefix><rank>``
    when one times out, or when anything is written to the FIFO ``<pipe_prefix><rank>.pipe``
    that the rank makes at start (read about once a second by its NCCL monitor thread, which
    ``TORCH_NCCL_ENABLE_MONITORING``, on by default, runs). torch 2.13 reads the newer
    ``TORCH_FR_*`` names first, older code paths only the ``TORCH_NCCL_*`` ones: both are set.
    """
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": Setting(
            str(entries), "NCCL flight recorder: each rank keeps its last N collectives (0: off)"
        ),
        "TORCH_FR_BUFFER_SIZE": Setting(str(entries), "the same, torch's newer name"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": Setting(
            "1", "a collective that times out dumps the flight recorder before the abort"
        ),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": Setting(
            dump_prefix, "where a rank's dump goes: this prefix + its global rank"
        ),
        "TORCH_FR_DUMP_TEMP_FILE": Setting(dump_prefix, "the same, torch's newer name"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": Setting(
            pipe_prefix, "each rank makes the FIFO <prefix><rank>.pipe: a write to it dumps now"
        ),
    }


def cpu_env(threads: int = 1) -> dict[str, Setting]:
    """CPU ranks (gloo): one BLAS/OpenMP thread per rank so co-located ranks don't oversubscribe."""
    return {
        "OMP_NUM_THREADS": Setting(
            str(threads),
            "torchrun leaves it unset with one rank per node; 2 threads per rank stall",
        )
    }


def plain(env: dict[str, Setting]) -> dict[str, str]:
    return {key: s.value for key, s in env.items()}


def shell_lines(env: dict[str, Setting]) -> list[str]:
    """`export K=V  # why` lines, for sbatch scripts and the bootstrap's profile file."""
    return [f"export {key}={s.value}  # {s.why}" for key, s in env.items()]
