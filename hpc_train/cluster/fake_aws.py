"""A fake AWS account (moto) holding what a ParallelCluster config refers to.

ParallelCluster's validators call EC2 and S3 (DescribeInstanceTypes, DescribeImages, DescribeSubnets,
HeadObject on the custom-action script, ...). Inside `fake_aws_account` every such call is answered
by moto, in memory:

- fake credentials, region from the config, instance metadata off, no AWS config/credential files:
  nothing of the caller's real AWS set-up is read;
- a guard on socket.connect: any attempt to reach a non-loopback address raises, so a call moto
  does not intercept fails loudly instead of reaching the network;
- the account holds what the config names, each as AWS would describe it, no kinder:
  - official ParallelCluster AMIs named and *described* the way ParallelCluster's own image build
    describes them ("AWS ParallelCluster AMI for <os>, kernel-..., nvidia-..."; its
    resources/imagebuilder/parallelcluster_tag.yaml), so InstanceTypeBaseAMICompatibleValidator
    refuses p3/p3dn on them with ParallelCluster's own message;
  - each `CustomAmi` as an image of this account made by `pcluster build-image`: the same
    description and the parallelcluster:os / parallelcluster:version tags that build sets (so the
    refusal fires on it too, until suppressed as ParallelCluster's message says);
  - subnets with their real public-IP mapping: the head node's subnet assigns public IPs
    (MapPublicIpOnLaunch true, a public subnet), every other subnet does not (a private one);
    a queue in the head node's subnet is therefore in a public subnet, as it would be on AWS;
  - key pairs, buckets, S3 objects; named placement groups and capacity reservations (ODCR,
    Capacity Block), which moto does not implement, answered at the botocore client level
    (DescribePlacementGroups, DescribeCapacityReservations) with AWS's error for a name or id the
    account does not hold.
  Existence checks therefore pass for what the config names: FakeAccount.not_checked lists each
  such thing by name, and `validate` prints it ("not checked offline: ...");
- what the account is like beyond the config (is a subnet private?) can be stated
  (AccountFacts: `validate --private-subnet`); each stated fact is listed as assumed;
- a call the fake account cannot answer as AWS would is a Gap, never a verdict: one moto does
  not implement ("Not yet implemented", NotImplementedError, or moto failing inside), or one about
  a kind of resource the account holds none of (security groups, IAM roles, secrets, KMS keys,
  EBS volumes and snapshots, FSx and EFS file systems: only your account holds them). The call
  fails with a ClientError saying so (pcluster handles it as any AWS error) and is recorded in
  FakeAccount.gaps; `validate` drops the verdict of the validator that made it and says
  "not checked offline" with the validator and the call.

Everything is undone on exit (environment, moto state, ParallelCluster's cached clients).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

# Validators that dry-run RunInstances with the generated launch template: moto rejects pcluster's
# block-device mappings, and only real EC2 could say whether the request would succeed.
UNJUDGEABLE_VALIDATORS: dict[str, str] = {
    "HeadNodeLaunchTemplateValidator": "dry-runs RunInstances, which only real EC2 can judge",
    "ComputeResourceLaunchTemplateValidator": "dry-runs RunInstances, which only real EC2 can judge",
}

_FAKE_AMI_DATE = "2026-01-01T00:00:00.000Z"
_ACCOUNT_ID = "123456789012"  # moto's default account
# What ParallelCluster's tag component appends to an AMI's description (parallelcluster_tag.yaml):
# kernel, lustre, efa, dcv, slurm, nvidia, cuda versions. The numbers are examples.
_DESCRIPTION_TAIL = (
    "kernel-6.8.0-1021-aws, lustre-2.15.6, efa-2.15.3-1, slurm-25-11-1-1, "
    "nvidia-{nvidia}, cuda-12.8"
)
OFFICIAL_NVIDIA = "595.71.05"  # an official 3.16 AMI's open-module driver (3.16.3 release notes)
CUSTOM_NVIDIA = "580.173.02"  # the driver pcluster_configs/images/p3dn-closed-driver.yaml pins


class NetworkAttempt(OSError):
    """Something tried to reach the network while AWS was faked (an OSError, as offline)."""


GAP_CODE = "NotCheckedOffline"  # the error code of a call the fake account could not answer

# Describe calls about kinds of resource the fake account never holds: an error from them says
# nothing about your account, only that the fake one has none.
_NEVER_HELD: dict[tuple[str, str], str] = {
    ("ec2", "DescribeSecurityGroups"): "security groups",
    ("ec2", "DescribeVolumes"): "EBS volumes",
    ("ec2", "DescribeSnapshots"): "EBS snapshots",
    ("iam", "GetRole"): "IAM roles",
    ("iam", "GetInstanceProfile"): "IAM instance profiles",
    ("secretsmanager", "DescribeSecret"): "secrets",
    ("kms", "DescribeKey"): "KMS keys",
    ("fsx", "DescribeFileSystems"): "FSx file systems",
    ("fsx", "DescribeVolumes"): "FSx volumes",
    ("fsx", "DescribeStorageVirtualMachines"): "FSx storage virtual machines",
    ("efs", "DescribeFileSystems"): "EFS file systems",
    ("efs", "DescribeMountTargets"): "EFS mount targets",
    ("resource-groups", "GetGroupConfiguration"): "resource groups",
    ("resource-groups", "ListGroupResources"): "resource groups",
}


@dataclass(frozen=True)
class Gap:
    """An AWS call the fake account could not answer as AWS would."""

    service: str
    operation: str
    why: str

    def __str__(self) -> str:
        return f"{self.service} {self.operation}: {self.why}"


class BadFact(ValueError):
    """A stated account fact the config gives no meaning to (a subnet it does not name)."""


@dataclass(frozen=True)
class AccountFacts:
    """What the caller states about the account, beyond the config; each is assumed, by name.

    By default the head node's subnet assigns public IPs and every other subnet does not (the
    templates' layout). `private_subnets` / `public_subnets` say otherwise for a subnet.
    """

    private_subnets: frozenset[str] = frozenset()
    public_subnets: frozenset[str] = frozenset()

    def check(self, refs: References) -> None:
        """BadFact where a stated subnet is not in the config, or stated both ways."""
        both = self.private_subnets & self.public_subnets
        if both:
            raise BadFact(f"subnet {sorted(both)[0]} is stated both private and public")
        for subnet in sorted(self.private_subnets | self.public_subnets):
            if subnet not in refs.subnets:
                raise BadFact(f"subnet {subnet} is not named in the config")

    def is_public(self, subnet: str, refs: References) -> bool:
        if subnet in self.private_subnets or subnet in self.public_subnets:
            return subnet in self.public_subnets
        return subnet == refs.head_subnet

    def assumed(self) -> list[str]:
        """The stated facts, one line each (`validate` prints them as assumed)."""
        return [
            *(
                f"subnet {s} does not assign public IPs (--private-subnet)"
                for s in sorted(self.private_subnets)
            ),
            *(
                f"subnet {s} assigns public IPs (--public-subnet)"
                for s in sorted(self.public_subnets)
            ),
        ]


@dataclass
class FakeAccount:
    """What was created in the fake account (for the report and for tests)."""

    region: str
    subnets: list[str] = field(default_factory=list)
    key_pairs: list[str] = field(default_factory=list)
    buckets: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    amis: list[str] = field(default_factory=list)
    custom_amis: list[str] = field(default_factory=list)
    public_subnets: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    capacity_reservations: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # network attempts the guard stopped
    not_checked: list[str] = field(default_factory=list)  # what only your real account can say
    gaps: list[Gap] = field(default_factory=list)  # calls the fake account could not answer
    assumed: list[str] = field(default_factory=list)  # facts the caller stated (AccountFacts)


@dataclass(frozen=True)
class References:
    """The AWS resources a cluster config names."""

    region: str
    os: str
    subnets: tuple[str, ...]
    key_pairs: tuple[str, ...]
    s3_objects: tuple[tuple[str, str], ...]  # (bucket, key); key "" for a bucket alone
    head_subnet: str | None = None  # the public one
    custom_amis: tuple[str, ...] = ()
    placement_groups: tuple[str, ...] = ()
    # (id, instance type, capacity type of the queue naming it, MaxCount): ODCR or Capacity Block
    capacity_reservations: tuple[tuple[str, str, str, int], ...] = ()
    file_systems: tuple[str, ...] = ()  # existing FSx / EFS ids the config mounts
    aws_policies: tuple[str, ...] = ()  # AWS managed policies named (arn:aws:iam::aws:policy/X)
    parent_images: tuple[str, ...] = ()  # build-image configs: Build.ParentImage (a plain OS AMI)
    # What runs on ParallelCluster's official AMI (no CustomAmi of its own nor a top-level one):
    # "the head node", "login node pool NAME", "queue NAME"; the fake account holds that AMI.
    official_ami_users: tuple[str, ...] = ()


def references(config: Mapping[str, Any]) -> References:
    """Collect the subnets, key pairs and S3 locations a ParallelCluster config dict names."""
    subnets: list[Any] = list(_find_key(config, "SubnetId"))  # head node
    for ids in _find_key(config, "SubnetIds"):  # queues, login node pools
        subnets.extend(ids if isinstance(ids, list) else [])
    keys = [_mapping(ssh).get("KeyName") for ssh in _find_key(config, "Ssh")]
    head_subnet = _mapping(_mapping(config.get("HeadNode")).get("Networking")).get("SubnetId")
    amis = [_mapping(image).get("CustomAmi") for image in _find_key(config, "Image")]
    groups = [
        _mapping(pg).get("Name") or _mapping(pg).get("Id")
        for pg in _find_key(config, "PlacementGroup")
    ]
    parent = _mapping(config.get("Build")).get("ParentImage")
    return References(
        official_ami_users=_official_ami_users(config),
        parent_images=(parent,) if isinstance(parent, str) and parent.startswith("ami-") else (),
        aws_policies=tuple(dict.fromkeys(_aws_policies(config))),
        head_subnet=head_subnet if isinstance(head_subnet, str) else None,
        custom_amis=tuple(dict.fromkeys(a for a in amis if isinstance(a, str))),
        placement_groups=tuple(dict.fromkeys(g for g in groups if isinstance(g, str))),
        capacity_reservations=_capacity_reservations(config),
        file_systems=tuple(dict.fromkeys(_file_systems(config))),
        region=str(config.get("Region") or "us-east-1"),
        os=str(_mapping(config.get("Image")).get("Os") or "alinux2023"),
        subnets=tuple(dict.fromkeys(s for s in subnets if isinstance(s, str))),
        key_pairs=tuple(dict.fromkeys(k for k in keys if isinstance(k, str) and k)),
        s3_objects=tuple(dict.fromkeys(_s3_locations(config))),
    )


def _s3_locations(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(bucket, key) for every s3:// string, the CustomS3Bucket and each S3Access bucket named
    without a wildcard; key "" for a bucket alone."""
    s3: list[tuple[str, str]] = []
    for value in _strings(config):
        if value.startswith("s3://"):
            bucket, _, obj = value[len("s3://") :].partition("/")
            s3.append((bucket, obj))
    custom_bucket = config.get("CustomS3Bucket")  # pcluster's own bucket for the cluster's files
    if isinstance(custom_bucket, str):
        s3.append((custom_bucket, ""))
    for access in _find_key(config, "S3Access"):
        for item in access if isinstance(access, list) else []:
            named = _mapping(item).get("BucketName")
            if isinstance(named, str) and "*" not in named:
                s3.append((named, ""))
    return s3


def _capacity_reservations(config: Mapping[str, Any]) -> tuple[tuple[str, str, str, int], ...]:
    """(id, instance type, capacity type, MaxCount) for each reservation the queues target, one
    per id, as the first compute resource naming it says (a queue's target is its resources')."""
    first_by_id: dict[str, tuple[str, str, str, int]] = {}
    for queue in _list(_mapping(config.get("Scheduling")).get("SlurmQueues")):
        queue = _mapping(queue)
        capacity_type = str(queue.get("CapacityType") or "ONDEMAND")
        queue_target = _mapping(queue.get("CapacityReservationTarget")).get("CapacityReservationId")
        for resource in _list(queue.get("ComputeResources")):
            resource = _mapping(resource)
            target = _mapping(resource.get("CapacityReservationTarget")).get(
                "CapacityReservationId", queue_target
            )
            instance_type = resource.get("InstanceType")
            if isinstance(target, str) and isinstance(instance_type, str):
                max_count = resource.get("MaxCount")
                count = max_count if isinstance(max_count, int) else 10
                first_by_id.setdefault(target, (target, instance_type, capacity_type, count))
    return tuple(first_by_id.values())


def _file_systems(config: Mapping[str, Any]) -> list[str]:
    """The existing FSx / EFS file systems (and FSx volumes) the config mounts, by id."""
    file_systems: list[str] = []
    for settings in ("FsxLustreSettings", "EfsSettings", "FsxOntapSettings", "FsxOpenZfsSettings"):
        for found in _find_key(config, settings):
            for key in ("FileSystemId", "VolumeId"):
                fs_id = _mapping(found).get(key)
                if isinstance(fs_id, str):
                    file_systems.append(fs_id)
    return file_systems


def _aws_policies(config: Mapping[str, Any]) -> list[str]:
    """The AWS managed policies AdditionalIamPolicies names (arn:aws:iam::aws:policy/X -> X)."""
    policies = [
        _mapping(item).get("Policy")
        for listed in _find_key(config, "AdditionalIamPolicies")
        for item in _list(listed)
    ]
    return [
        p.rpartition("/")[2]
        for p in policies
        if isinstance(p, str) and re.fullmatch(r"arn:aws[a-z-]*:iam::aws:policy/(.+/)?[^/]+", p)
    ]


def _official_ami_users(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes that boot ParallelCluster's official AMI: ParallelCluster looks it up by name in
    the region (aws-parallelcluster-<version>-<os>-*) unless Image.CustomAmi, the top-level one or
    the queue's / pool's own, names another. A build-image config starts from its ParentImage."""
    if "Build" in config and "Scheduling" not in config:
        return ()
    if _mapping(config.get("Image")).get("CustomAmi"):
        return ()
    users = ["the head node"]
    for kind, groups in (
        ("login node pool", _mapping(config.get("LoginNodes")).get("Pools")),
        ("queue", _mapping(config.get("Scheduling")).get("SlurmQueues")),
    ):
        for group in _list(groups):
            group = _mapping(group)
            if not _mapping(group.get("Image")).get("CustomAmi"):
                users.append(f"{kind} {group.get('Name')}")
    return tuple(users)


@contextmanager
def fake_aws_account(
    config: Mapping[str, Any], facts: AccountFacts = AccountFacts()
) -> Iterator[FakeAccount]:
    """Run the body against a moto AWS account pre-filled with what `config` refers to, and as
    `facts` state (BadFact, before anything is faked, where they name what the config does not)."""
    import moto  # the `aws` extra; imported here so the rest of hpc_train never needs it
    from pcluster.aws.aws_api import AWSApi
    from pcluster.aws.common import Cache

    refs = references(config)
    facts.check(refs)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hpc-train-moto-") as tmp:
        stack.enter_context(_quiet_logging())
        amis = _fake_official_amis(refs.os)  # moto loads these as Amazon's
        amis_path = Path(tmp) / "amis.json"
        amis_path.write_text(json.dumps(amis))
        stack.enter_context(mock.patch.dict(os.environ, _fake_env(refs.region, amis_path)))

        for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"):
            os.environ.pop(var, None)  # restored by patch.dict on exit
        import moto.ec2.models.amis as moto_amis

        # moto reads MOTO_AMIS_PATH when it is first imported; patch the list for later runs too.
        stack.enter_context(mock.patch.object(moto_amis, "AMIS", amis))
        refused: list[str] = []
        stack.enter_context(_no_network(refused))
        stack.enter_context(_bundled_region_list())
        import moto.iam.models as moto_iam

        stack.enter_context(
            mock.patch.object(
                moto_iam, "aws_managed_policies_data", _aws_managed_policies(refs.aws_policies)
            )
        )
        stack.enter_context(_moto_fixed())
        stack.enter_context(moto.mock_aws())
        account = FakeAccount(region=refs.region)
        stack.enter_context(_unimplemented_calls_faked(account, refs))
        AWSApi.reset()
        Cache.clear_all()
        try:
            _populate(refs, account, facts)
            account.amis = [a["ami_id"] for a in amis]
            account.custom_amis = list(refs.custom_amis)
            account.refused = refused
            account.not_checked = not_checked_offline(refs, facts)
            account.assumed = facts.assumed()
            yield account
        finally:
            AWSApi.reset()
            Cache.clear_all()


@functools.cache
def _all_aws_managed_policies() -> dict[str, Any]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    return dict(json.loads(aws_managed_policies_data))


def _aws_managed_policies(names: tuple[str, ...]) -> str:
    """moto's AWS managed policies, only those named (loading all ~1,300 costs seconds per run).

    A name AWS has but moto's copy lacks is refused, as an unknown policy would be."""
    every = _all_aws_managed_policies()
    return json.dumps({name: every[name] for name in names if name in every})


def _fake_env(region: str, amis_path: Path) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "MOTO_AMIS_PATH": str(amis_path),
        # AWS managed policies (AmazonSSMManagedInstanceCore, ...) exist in every real account;
        # moto makes those _aws_managed_policies() leaves it (the ones the config names).
        "MOTO_IAM_LOAD_MANAGED_POLICIES": "true",
    }


def not_checked_offline(refs: References, facts: AccountFacts = AccountFacts()) -> list[str]:
    """What the fake account holds because the config names it: only your account can say."""
    lines = [f"subnet {s} exists" for s in refs.subnets]
    stated = facts.private_subnets | facts.public_subnets
    for subnet in refs.subnets:
        if subnet in stated:
            continue  # listed as assumed (AccountFacts.assumed)
        if facts.is_public(subnet, refs):
            lines.append(
                f"subnet {subnet} assigns public IPs (assumed: it is the head node's; "
                "--private-subnet says otherwise)"
            )
        else:
            lines.append(
                f"subnet {subnet} does not assign public IPs (assumed: private, with a NAT gateway)"
            )
    lines += [f"key pair {k} exists" for k in refs.key_pairs]
    lines += [
        f"s3://{b}/{k} exists" if k else f"bucket {b} exists and is yours"
        for b, k in refs.s3_objects
    ]
    lines += [
        f"AMI {a} exists, was built by `pcluster build-image` {_installed_version()} for "
        f"{refs.os}, with the NVIDIA driver you asked for (assumed: closed source {CUSTOM_NVIDIA})"
        for a in refs.custom_amis
    ]
    if refs.official_ami_users:
        lines.append(
            f"that ParallelCluster's official AMI for {refs.os} "
            f"(aws-parallelcluster-{_installed_version()}-*) exists in {refs.region} "
            f"(used by {', '.join(refs.official_ami_users)})"
        )
    lines += [
        f"AMI {a} exists and is a plain OS image (not a ParallelCluster AMI, no NVIDIA driver)"
        for a in refs.parent_images
    ]
    lines += [
        f"placement group {g} exists (assumed: strategy cluster)" for g in refs.placement_groups
    ]
    lines += [
        f"capacity reservation {cr} exists, is active, "
        f"{'a Capacity Block' if kind == 'CAPACITY_BLOCK' else 'an ODCR'} for {count} x {itype} "
        "in the subnet's zone (assumed from the config)"
        for cr, itype, kind, count in refs.capacity_reservations
    ]
    lines += [
        f"file system {f} exists and is reachable from the subnets" for f in refs.file_systems
    ]
    lines.append(
        "the region offers the instance types (moto's bundled data), your quotas, capacity"
    )
    return lines


def _installed_version() -> str:
    from pcluster.utils import get_installed_version

    return str(get_installed_version())


def _description(os_name: str, nvidia: str) -> str:
    return f"AWS ParallelCluster AMI for {os_name}, " + _DESCRIPTION_TAIL.format(nvidia=nvidia)


# what every fake image says alike (moto's Ami fields)
_AMI_FIELDS: dict[str, Any] = {
    "virtualization_type": "hvm",
    "architecture": "x86_64",
    "state": "available",
    "creation_date": _FAKE_AMI_DATE,
    "image_type": "machine",
    "root_device_name": "/dev/sda1",
    "root_device_type": "ebs",
    "sriov": "simple",
    "hypervisor": "xen",
}


def _fake_custom_amis(refs: References) -> list[dict[str, Any]]:
    """Each CustomAmi the config names, as `pcluster build-image` leaves it in your account."""
    version = _installed_version()
    return [
        {
            "ami_id": ami_id,
            "name": f"hpc-train-p3dn-{index}",
            "description": _description(refs.os, CUSTOM_NVIDIA),
            "owner_id": _ACCOUNT_ID,
            "public": False,
            **_AMI_FIELDS,
            "tags": {
                "parallelcluster:os": refs.os,
                "parallelcluster:version": version,
                "parallelcluster:image_id": f"hpc-train-p3dn-{index}",
                "parallelcluster:nvidia_version": CUSTOM_NVIDIA,
                "parallelcluster:build_status": "available",  # a build that finished
            },
        }
        for index, ami_id in enumerate(refs.custom_amis, start=1)
    ]


def _register_custom_amis(refs: References) -> None:
    """Put the custom AMIs into moto's EC2 backend as images this account owns."""
    from moto.core.parse import default_timestamp_parser as parse_timestamp
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.amis import Ami

    backend = ec2_backends[_ACCOUNT_ID][refs.region]
    for spec in _fake_custom_amis(refs) + _fake_parent_amis(refs):
        spec = {**spec, "creation_date": parse_timestamp(spec["creation_date"])}
        ami_id = spec.pop("ami_id")
        backend.amis[ami_id] = Ami(backend, ami_id=ami_id, **spec)


def _fake_parent_amis(refs: References) -> list[dict[str, Any]]:
    """A build-image ParentImage: an OS vendor's public image (here Canonical's), no pcluster tags."""
    return [
        {
            "ami_id": ami_id,
            "name": "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20260101",
            "description": "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image",
            "owner_id": "099720109477",
            "public": True,
            **_AMI_FIELDS,
        }
        for ami_id in refs.parent_images
    ]


def _fake_official_amis(os_name: str) -> list[dict[str, Any]]:
    """An official ParallelCluster AMI per architecture, named and described as pcluster does."""
    from pcluster.constants import OS_TO_IMAGE_NAME_PART_MAP
    from pcluster.utils import get_installed_version

    part = OS_TO_IMAGE_NAME_PART_MAP.get(os_name, "amzn2023-hvm")
    version = get_installed_version()
    return [
        {
            "ami_id": f"ami-0{index:016x}",
            "name": f"aws-parallelcluster-{version}-{part}-{arch}-202601010000 {_FAKE_AMI_DATE}",
            "description": _description(os_name, OFFICIAL_NVIDIA),
            "owner_id": "amazon",
            "public": True,
            "virtualization_type": "hvm",
            "architecture": arch,
            "state": "available",
            "creation_date": _FAKE_AMI_DATE,
            "image_type": "machine",
            "root_device_name": "/dev/sda1",
            "root_device_type": "ebs",
            "sriov": "simple",
            "hypervisor": "xen",
            "tags": {"parallelcluster:os": os_name, "parallelcluster:version": str(version)},
        }
        for index, arch in enumerate(("x86_64", "arm64"), start=1)
    ]


def _populate(refs: References, account: FakeAccount, facts: AccountFacts) -> FakeAccount:
    import boto3

    ec2 = boto3.client("ec2", region_name=refs.region)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    for attribute in ("EnableDnsHostnames", "EnableDnsSupport"):
        ec2.modify_vpc_attribute(VpcId=vpc, **{attribute: {"Value": True}})
    for index, subnet_id in enumerate(refs.subnets):
        # moto draws subnet ids at random; give it the one the config names.
        with mock.patch("moto.ec2.models.subnets.random_subnet_id", return_value=subnet_id):
            ec2.create_subnet(
                VpcId=vpc, CidrBlock=f"10.0.{index * 16}.0/20", AvailabilityZone=f"{refs.region}a"
            )
        account.subnets.append(subnet_id)
        if facts.is_public(subnet_id, refs):  # the head node's, as the templates ask for it
            ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
            account.public_subnets.append(subnet_id)
    _register_custom_amis(refs)
    for key in refs.key_pairs:
        ec2.create_key_pair(KeyName=key, KeyType="ed25519")  # moto's RSA keys fail pcluster's check
        account.key_pairs.append(key)
    s3 = boto3.client("s3", region_name=refs.region)
    for bucket, key in refs.s3_objects:
        if bucket not in account.buckets:
            where = {} if refs.region == "us-east-1" else {"LocationConstraint": refs.region}
            s3.create_bucket(
                Bucket=bucket, **({"CreateBucketConfiguration": where} if where else {})
            )
            account.buckets.append(bucket)
        if key and not key.endswith("/"):
            s3.put_object(Bucket=bucket, Key=key, Body=b"#!/usr/bin/env bash\n")
            account.objects.append(f"s3://{bucket}/{key}")
    return account


@contextmanager
def _moto_fixed() -> Iterator[None]:
    """Where moto is stricter than AWS: DescribeSubnets with one id twice (pcluster asks so when
    login nodes share the head node's subnet) answers once on AWS, 'does not exist' in moto."""
    from moto.ec2.models.subnets import SubnetBackend

    real = SubnetBackend.describe_subnets

    def describe_subnets(
        backend: Any, subnet_ids: list[str] | None = None, filters: Any | None = None
    ) -> Any:
        unique = list(dict.fromkeys(subnet_ids)) if subnet_ids else subnet_ids
        return real(backend, subnet_ids=unique, filters=filters)

    with mock.patch.object(SubnetBackend, "describe_subnets", describe_subnets):
        yield


@contextmanager
def _unimplemented_calls_faked(account: FakeAccount, refs: References) -> Iterator[None]:
    """Answer the EC2 calls moto raises NotImplementedError for, from what the config names.

    Patched in botocore's BaseClient._make_api_call, so ParallelCluster's own client code
    (paginators, error handling) runs unchanged. A name or id the account does not hold gets the
    error code AWS returns for it.
    """
    from botocore.client import BaseClient
    from botocore.exceptions import ClientError

    groups = _placement_group_records(refs)
    reservations = _capacity_reservation_records(refs)
    account.placement_groups = list(groups)
    account.capacity_reservations = list(reservations)
    fakes = {
        ("ec2", "DescribePlacementGroups"): _describe(
            groups,
            "DescribePlacementGroups",
            ("GroupNames", "PlacementGroups"),
            ("InvalidPlacementGroup.Unknown", "The Placement Group '{}' is unknown."),
        ),
        ("ec2", "DescribeCapacityReservations"): _describe(
            reservations,
            "DescribeCapacityReservations",
            ("CapacityReservationIds", "CapacityReservations"),
            (
                "InvalidCapacityReservationId.NotFound",
                "The capacity reservation ID '{}' does not exist",
            ),
        ),
    }
    real = BaseClient._make_api_call

    def make_api_call(client: Any, operation_name: str, api_params: Mapping[str, Any]) -> Any:
        service = client.meta.service_model.service_name
        fake = fakes.get((service, operation_name))
        if fake is not None:
            return fake(api_params)
        try:
            return real(client, operation_name, api_params)
        except Exception as err:
            gap = _gap_of(service, operation_name, err)
            if gap is None:
                raise
            account.gaps.append(gap)
            raise ClientError(
                {"Error": {"Code": GAP_CODE, "Message": f"not checked offline: {gap}"}},
                operation_name,
            ) from None

    with mock.patch.object(BaseClient, "_make_api_call", make_api_call):
        yield


def _placement_group_records(refs: References) -> dict[str, dict[str, Any]]:
    """DescribePlacementGroups' record of each placement group the config names, by name."""
    return {
        name: {
            "GroupName": name,
            "GroupId": f"pg-{index:017x}",
            "GroupArn": f"arn:aws:ec2:{refs.region}:{_ACCOUNT_ID}:placement-group/{name}",
            "Strategy": "cluster",
            "State": "available",
        }
        for index, name in enumerate(refs.placement_groups, start=1)
    }


def _capacity_reservation_records(refs: References) -> dict[str, dict[str, Any]]:
    """DescribeCapacityReservations' record of each reservation the config names, by id: active,
    in the region's first zone, as many instances free as the compute resource's MaxCount."""
    from pcluster.constants import CAPACITY_RESERVATION_OS_MAP

    return {
        cr: {
            "CapacityReservationId": cr,
            "CapacityReservationArn": f"arn:aws:ec2:{refs.region}:{_ACCOUNT_ID}:capacity-reservation/{cr}",
            "OwnerId": _ACCOUNT_ID,
            "InstanceType": instance_type,
            "InstancePlatform": CAPACITY_RESERVATION_OS_MAP.get(refs.os, "Linux/UNIX"),
            "AvailabilityZone": f"{refs.region}a",
            "Tenancy": "default",
            "TotalInstanceCount": count,
            "AvailableInstanceCount": count,
            "State": "active",
            "InstanceMatchCriteria": "targeted",
            "ReservationType": "capacity-block" if kind == "CAPACITY_BLOCK" else "default",
        }
        for cr, instance_type, kind, count in refs.capacity_reservations
    }


def _describe(
    held: Mapping[str, dict[str, Any]],
    operation: str,
    keys: tuple[str, str],
    unknown: tuple[str, str],
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A Describe* call answered from `held`. `keys`: the request's list of names or ids and the
    answer's list; every record when none is asked for. `unknown`: the error code and message
    ('{}': the name) AWS gives for one the account does not hold."""
    from botocore.exceptions import ClientError

    asked_key, answer_key = keys
    code, message = unknown

    def describe(params: Mapping[str, Any]) -> dict[str, Any]:
        asked = params.get(asked_key) or []
        for name in asked:
            if name not in held:
                raise ClientError(
                    {"Error": {"Code": code, "Message": message.format(name)}}, operation
                )
        return {answer_key: [held[n] for n in asked] if asked else list(held.values())}

    return describe


def _gap_of(service: str, operation: str, err: Exception) -> Gap | None:
    """The Gap an error from moto is, or None for an answer AWS could give (its error codes)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(err, BotoCoreError):  # botocore's own (a bad parameter): AWS's too
        return None
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        if error.get("Message") == "Not yet implemented":  # moto's answer to an unknown action
            return Gap(service, operation, "moto does not implement it")
        kind = _NEVER_HELD.get((service, operation))
        if kind is None:
            return None
        return Gap(
            service,
            operation,
            f"the fake account holds no {kind} ({error.get('Code')}): only yours can answer",
        )
    if isinstance(err, NotImplementedError):
        return Gap(service, operation, "moto does not implement it")
    return Gap(service, operation, f"moto failed answering it ({type(err).__name__})")


@contextmanager
def _quiet_logging() -> Iterator[None]:
    """pcluster logs every failed AWS call (and `logging.warning`s on the root logger): under the
    fake account those are the fake's, and what matters is in the report. Restored on exit."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)


@contextmanager
def _bundled_region_list() -> Iterator[None]:
    """pcluster fetches its supported-region list over HTTPS; use the copy it ships instead."""
    from importlib.resources import files

    from pcluster import utils

    bundled = (files("pcluster") / "resources" / "supported-regions").read_text(encoding="utf-8")
    with mock.patch.object(
        utils.retrieve_supported_regions, "cache", bundled.split("\n"), create=True
    ):
        yield


@contextmanager
def _no_network(refused: list[str]) -> Iterator[None]:
    """Refuse name look-ups and connections for anything but loopback and AF_UNIX sockets."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            refused.append(str(address[0]))
            raise NetworkAttempt(
                f"not checked offline: network access to {address[0]!r} refused while AWS is faked"
            )

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host):
            refused.append(str(host))
            raise NetworkAttempt(
                f"not checked offline: name look-up of {host!r} refused while AWS is faked"
            )
        return real_getaddrinfo(host, *args, **kwargs)

    with (
        mock.patch.object(socket.socket, "connect", connect),
        mock.patch.object(socket.socket, "connect_ex", connect_ex),
        mock.patch.object(socket, "getaddrinfo", getaddrinfo),
    ):
        yield


def _is_loopback(host: str | bytes) -> bool:
    name = host.decode() if isinstance(host, bytes) else str(host)
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _find_key(node: Any, wanted: str) -> Iterator[Any]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == wanted:
                yield value
            yield from _find_key(value, wanted)
    elif isinstance(node, list):
        for value in node:
            yield from _find_key(value, wanted)
