"""Fill a cluster template's ${NAME} placeholders with checked values.

Templates in pcluster_configs/ are ParallelCluster configs with `${NAME}` placeholders (names in
PLACEHOLDERS). Values come from a small YAML file (lower-case keys: `subnet_id: subnet-...`) and/or
command-line flags; each is checked here before anything is written, and a bad one is reported
in one line naming it. Full-line comments are left as they are.

Pure; no AWS, no pcluster import (the CLI writes with ``hpc_core.rundir.atomic_write``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]*)\}")

# Image.Os values of ParallelCluster 3.16 (pcluster.constants.SUPPORTED_OSES; a test checks).
SUPPORTED_OSES = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")

_REGION = re.compile(
    r"(us|eu|ap|sa|ca|me|af|il|mx|cn)(-gov|-iso[a-z]?)?"
    r"-(north|south|east|west|central|northeast|northwest|southeast|southwest)-[1-9]"
)
_SUBNET = re.compile(r"subnet-([0-9a-f]{8}|[0-9a-f]{17})")
_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_AMI = re.compile(r"ami-([0-9a-f]{8}|[0-9a-f]{17})")
_CAPACITY_RESERVATION = re.compile(r"cr-([0-9a-f]{8}|[0-9a-f]{17})")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


class RenderError(ValueError):
    """A value or template problem, as one line naming the culprit."""


def check_region(value: str) -> str | None:
    if not _REGION.fullmatch(value):
        return "not an AWS region name (like us-east-1)"
    return None


def check_os(value: str) -> str | None:
    if value not in SUPPORTED_OSES:
        return f"not an OS ParallelCluster 3.16 supports ({', '.join(SUPPORTED_OSES)})"
    return None


def check_subnet_id(value: str) -> str | None:
    if not _SUBNET.fullmatch(value):
        return "must be 'subnet-' and 8 or 17 lower-case hex digits (subnet-0123456789abcdef0)"
    return None


# The widest block one organisation's network holds: IANA hands the registries IPv4 /8s, and an
# IPv6 /32 is a registry's usual allocation to a provider. Anything wider (0.0.0.0/1 is half the
# internet) is not "your network": render refuses it, as it refuses 0.0.0.0/0.
WIDEST_PREFIX = {4: 8, 6: 32}


def check_allowed_ips(value: str) -> str | None:
    """One IPv4 CIDR for ssh to the head node; never the whole internet, nor a large part of it."""
    try:
        if "/" not in value:
            raise ValueError(value)
        network = ipaddress.ip_network(value, strict=True)
    except ValueError:
        return "must be one CIDR block like 203.0.113.7/32 (your address, curl https://checkip.amazonaws.com)"
    if network.prefixlen == 0:
        return "opens ssh to the whole internet: give your own address or your network's CIDR"
    widest = WIDEST_PREFIX[network.version]
    if network.prefixlen < widest:
        return (
            f"opens ssh to a large part of the internet (a /{network.prefixlen}, wider than "
            f"/{widest}, the largest block one network holds): give your own address or your "
            "network's CIDR"
        )
    if network.version != 4:
        return "ParallelCluster takes an IPv4 CIDR block here"
    return None


def check_ami_id(value: str) -> str | None:
    if not _AMI.fullmatch(value):
        return "must be 'ami-' and 8 or 17 lower-case hex digits (ami-0123456789abcdef0)"
    return None


def check_capacity_reservation_id(value: str) -> str | None:
    if not _CAPACITY_RESERVATION.fullmatch(value):
        return "must be 'cr-' and 8 or 17 lower-case hex digits (cr-0123456789abcdef0)"
    return None


def check_key_name(value: str) -> str | None:
    if not value:
        return "empty: name the EC2 key pair for ssh to the head node"
    if not _KEY_NAME.fullmatch(value):
        return "use 1-255 letters, digits, '.', '_' or '-' (keeps the YAML plain)"
    return None


def check_bucket(value: str) -> str | None:
    """S3 bucket naming rules (general purpose buckets)."""
    if value.startswith("s3://"):
        return "give the bucket name alone, without s3://"
    if value != value.lower():
        return "bucket names are lower case"
    if not 3 <= len(value) <= 63:
        return "bucket names have 3 to 63 characters"
    if not _BUCKET.fullmatch(value):
        return (
            "use lower-case letters, digits, '.' and '-', starting and ending with a letter/digit"
        )
    if ".." in value or ".-" in value or "-." in value:
        return "no '..', '.-' or '-.' in bucket names"
    if _is_ip_address(value):
        return "a bucket name cannot look like an IP address"
    if value.startswith(_BUCKET_RESERVED_PREFIXES) or value.endswith(_BUCKET_RESERVED_SUFFIXES):
        return "that prefix/suffix is reserved by S3"
    return None


def check_sha256(value: str) -> str | None:
    if not _SHA256.fullmatch(value):
        return "must be 64 lower-case hex digits (sha256sum of the source tarball)"
    return None


@dataclass(frozen=True)
class Placeholder:
    name: str  # as written in templates: ${NAME}
    help: str
    check: Callable[[str], str | None]

    @property
    def key(self) -> str:
        """Key in a values file, e.g. subnet_id."""
        return self.name.lower()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


PLACEHOLDERS: tuple[Placeholder, ...] = (
    Placeholder("REGION", "AWS region, e.g. us-east-1", check_region),
    Placeholder("OS", f"node OS: {', '.join(SUPPORTED_OSES)}", check_os),
    Placeholder(
        "HEAD_SUBNET_ID", "public subnet of the head node (assigns public IPs)", check_subnet_id
    ),
    Placeholder(
        "COMPUTE_SUBNET_ID",
        "private subnet of the compute nodes (no public IPs; NAT for outbound)",
        check_subnet_id,
    ),
    Placeholder(
        "ALLOWED_IPS",
        "CIDR allowed to ssh to the head node, e.g. 203.0.113.7/32",
        check_allowed_ips,
    ),
    Placeholder("KEY_NAME", "EC2 key pair name for ssh to the head node", check_key_name),
    Placeholder("BUCKET", "S3 bucket: FSx data repository + bootstrap files", check_bucket),
    Placeholder(
        "SOURCE_SHA256", "sha256 of s3://BUCKET/hpc-train/hpc-train-src.tar.gz", check_sha256
    ),
    Placeholder(
        "UPDATE_SHA256",
        "sha256 of the tarball OnNodeUpdated installs (default: source_sha256)",
        check_sha256,
    ),
    Placeholder(
        "P3DN_AMI_ID",
        "AMI built by `pcluster build-image` from pcluster_configs/images/ (closed NVIDIA driver)",
        check_ami_id,
    ),
    Placeholder(
        "PARENT_AMI_ID", "plain OS AMI that `pcluster build-image` starts from", check_ami_id
    ),
    Placeholder(
        "CAPACITY_RESERVATION_ID",
        "On-Demand Capacity Reservation or Capacity Block id (cr-...)",
        check_capacity_reservation_id,
    ),
)
# Filled from other values, never given: the first 16 hex digits of update_sha256 name the
# tarball OnNodeUpdated downloads (hpc-train-src-<UPDATE_SHA16>.tar.gz).
DERIVED: dict[str, Callable[[Mapping[str, str]], str]] = {
    "UPDATE_SHA16": lambda checked: checked["UPDATE_SHA256"][:16],
}
DERIVED_NEEDS = {"UPDATE_SHA16": ("UPDATE_SHA256",)}
DEFAULTS = {"update_sha256": "source_sha256"}  # a missing key takes the other key's value
RENAMED = {"subnet_id": "head_subnet_id and compute_subnet_id (a public and a private subnet)"}
BY_NAME: dict[str, Placeholder] = {p.name: p for p in PLACEHOLDERS}
BY_KEY: dict[str, Placeholder] = {p.key: p for p in PLACEHOLDERS}


def check_values(values: Mapping[str, Any], needed: list[str] | None = None) -> dict[str, str]:
    """Values by placeholder NAME, each checked; RenderError names the first bad or missing one.

    `values` is keyed like a values file (`head_subnet_id`); `needed` are the placeholder names the
    template uses (all known ones when None). Derived names (UPDATE_SHA16) are filled too.
    """
    for key in values:
        if key in RENAMED:
            raise RenderError(f"{key!r} is gone: give {RENAMED[key]}")
        if key not in BY_KEY:
            raise RenderError(f"unknown value {key!r} (known: {', '.join(BY_KEY)})")
    values = dict(values)
    for key, default_key in DEFAULTS.items():
        if values.get(key) is None and values.get(default_key) is not None:
            values[key] = values[default_key]
    wanted = [*BY_NAME, *DERIVED] if needed is None else list(needed)
    for name in list(wanted):
        wanted.extend(n for n in DERIVED_NEEDS.get(name, ()) if n not in wanted)
    checked: dict[str, str] = {}
    for name in wanted:
        if name in DERIVED:
            continue
        spec = BY_NAME[name]
        if spec.key not in values or values[spec.key] is None:
            raise RenderError(
                f"{spec.key}: missing (give {spec.flag} or '{spec.key}:' in --values)"
            )
        value = values[spec.key]
        if not isinstance(value, str):
            raise RenderError(
                f"{spec.key}: must be a string, got {type(value).__name__} {value!r} (quote it)"
            )
        problem = spec.check(value)
        if problem:
            raise RenderError(f"{spec.key} {value!r}: {problem}")
        checked[name] = value
    for name in wanted:
        if name in DERIVED:
            checked[name] = DERIVED[name](checked)
    return checked


def placeholders_in(text: str) -> list[str]:
    """Placeholder names used outside full-line comments, in order of first use."""
    names: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        names.extend(n for n in PLACEHOLDER.findall(line) if n not in names)
    return names


def render_text(template: str, values: Mapping[str, Any]) -> str:
    """The template with its placeholders replaced; the result must parse as a YAML mapping."""
    used = placeholders_in(template)
    unknown = [n for n in used if n not in BY_NAME and n not in DERIVED]
    if unknown:
        raise RenderError(f"template uses unknown placeholder ${{{unknown[0]}}}")
    checked = check_values(values, used)
    lines = []
    for line in template.splitlines(keepends=True):
        if not line.lstrip().startswith("#"):
            line = PLACEHOLDER.sub(lambda m: checked[m.group(1)], line)
        lines.append(line)
    text = "".join(lines)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RenderError(
            f"rendered config is not valid YAML: {' '.join(str(err).split())}"
        ) from None
    if not isinstance(data, dict):
        raise RenderError("rendered config is not a YAML mapping")
    return text


def load_values(path: Path) -> dict[str, Any]:
    """A values file: a YAML mapping of placeholder keys (subnet_id: ...) to strings."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise RenderError(f"cannot read values file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise RenderError(
            f"values file {path} is not valid YAML: {' '.join(str(err).split())}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RenderError(f"values file {path} must be a mapping of key: value")
    return data


def _is_ip_address(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True
