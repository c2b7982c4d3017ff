"""A fake AWS account (moto) holding what a ParallelCluster config refers to.

ParallelCluster's validators call EC2 and S3 (DescribeInstanceTypes, DescribeImages, DescribeSubnets,
HeadObject on the custom-action script, ...). Inside `fake_aws_account` every such call is answered
by moto, in memory:

- fake credentials, region from the config, instance metadata off, no AWS config/credential files:
  nothing of the caller's real AWS set-up is read;
- a guard on socket.connect: any attempt to reach a non-loopback address raises, so a call moto
  does not intercept fails loudly instead of reaching the network;
- the account holds the subnets, key pair, buckets and S3 objects the config names, and a fake
  official ParallelCluster AMI for its OS. Existence checks therefore always pass: they say
  nothing about the real account.

Everything is undone on exit (environment, moto state, ParallelCluster's cached clients).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
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


class NetworkAttempt(OSError):
    """Something tried to reach the network while AWS was faked (an OSError, as offline)."""


@dataclass
class FakeAccount:
    """What was created in the fake account (for the report and for tests)."""

    region: str
    subnets: list[str] = field(default_factory=list)
    key_pairs: list[str] = field(default_factory=list)
    buckets: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    amis: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # network attempts the guard stopped


@dataclass(frozen=True)
class References:
    """The AWS resources a cluster config names."""

    region: str
    os: str
    subnets: tuple[str, ...]
    key_pairs: tuple[str, ...]
    s3_objects: tuple[tuple[str, str], ...]  # (bucket, key); key "" for a bucket alone


def references(config: Mapping[str, Any]) -> References:
    """Collect the subnets, key pairs and S3 locations a ParallelCluster config dict names."""
    subnets: list[Any] = list(_find_key(config, "SubnetId"))  # head node
    for ids in _find_key(config, "SubnetIds"):  # queues, login node pools
        subnets.extend(ids if isinstance(ids, list) else [])
    keys = [_mapping(ssh).get("KeyName") for ssh in _find_key(config, "Ssh")]
    s3: list[tuple[str, str]] = []
    for value in _strings(config):
        if value.startswith("s3://"):
            bucket, _, obj = value[len("s3://") :].partition("/")
            s3.append((bucket, obj))
    for access in _find_key(config, "S3Access"):
        for item in access if isinstance(access, list) else []:
            named = _mapping(item).get("BucketName")
            if isinstance(named, str) and "*" not in named:
                s3.append((named, ""))
    return References(
        region=str(config.get("Region") or "us-east-1"),
        os=str(_mapping(config.get("Image")).get("Os") or "alinux2023"),
        subnets=tuple(dict.fromkeys(s for s in subnets if isinstance(s, str))),
        key_pairs=tuple(dict.fromkeys(k for k in keys if isinstance(k, str) and k)),
        s3_objects=tuple(dict.fromkeys(s3)),
    )


@contextmanager
def fake_aws_account(config: Mapping[str, Any]) -> Iterator[FakeAccount]:
    """Run the body against a moto AWS account pre-filled with what `config` refers to."""
    import moto  # the `aws` extra; imported here so the rest of hpc_train never needs it
    from pcluster.aws.aws_api import AWSApi
    from pcluster.aws.common import Cache

    refs = references(config)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hpc-train-moto-") as tmp:
        amis = _fake_official_amis(refs.os)
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
        stack.enter_context(moto.mock_aws())
        AWSApi.reset()
        Cache.clear_all()
        try:
            account = _populate(refs)
            account.amis = [a["ami_id"] for a in amis]
            account.refused = refused
            yield account
        finally:
            AWSApi.reset()
            Cache.clear_all()


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
    }


def _fake_official_amis(os_name: str) -> list[dict[str, Any]]:
    """An 'official' ParallelCluster AMI per architecture, named the way pcluster searches."""
    from pcluster.constants import OS_TO_IMAGE_NAME_PART_MAP
    from pcluster.utils import get_installed_version

    part = OS_TO_IMAGE_NAME_PART_MAP.get(os_name, "amzn2023-hvm")
    version = get_installed_version()
    return [
        {
            "ami_id": f"ami-0{index:016x}",
            "name": f"aws-parallelcluster-{version}-{part}-{arch}-202601010000 {_FAKE_AMI_DATE}",
            "description": "hpc-train fake official ParallelCluster AMI (moto)",
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
        }
        for index, arch in enumerate(("x86_64", "arm64"), start=1)
    ]


def _populate(refs: References) -> FakeAccount:
    import boto3

    account = FakeAccount(region=refs.region)
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
            raise NetworkAttempt(f"network access to {address[0]!r} refused while AWS is faked")

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host):
            refused.append(str(host))
            raise NetworkAttempt(f"name look-up of {host!r} refused while AWS is faked")
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


def _find_key(node: Any, wanted: str) -> Iterator[Any]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == wanted:
                yield value
            yield from _find_key(value, wanted)
    elif isinstance(node, list):
        for value in node:
            yield from _find_key(value, wanted)
