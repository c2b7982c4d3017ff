"""fake_aws: the moto (fake AWS) account validate runs in: what it holds, what it refuses, cleanup."""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path

import pytest
import yaml

from hpc_train.cluster import render
from hpc_train.cluster.fake_aws import NetworkAttempt, references

REPO = Path(__file__).resolve().parents[3]
VALUES = yaml.safe_load((REPO / "pcluster_configs" / "examples" / "values.yaml").read_text())
CONFIG = yaml.safe_load(
    render.render_text((REPO / "pcluster_configs" / "p3dn.yaml").read_text(), VALUES)
)


def test_references_lists_what_the_config_names() -> None:
    refs = references(CONFIG)
    bucket = VALUES["bucket"]
    assert refs.region == "us-east-1"
    assert refs.os == "ubuntu2404"
    assert refs.subnets == (VALUES["subnet_id"],)  # head node and queue share it: listed once
    assert refs.key_pairs == ("hpc-train",)
    assert (bucket, "hpc-train/on-node-configured.sh") in refs.s3_objects
    assert (bucket, "hpc-train/hpc-train-src.tar.gz") in refs.s3_objects
    assert (bucket, "") in refs.s3_objects


def test_references_include_login_node_pools() -> None:
    config = {
        **CONFIG,
        "LoginNodes": {
            "Pools": [
                {
                    "Name": "login",
                    "Networking": {"SubnetIds": ["subnet-0aaaaaaaaaaaaaaaa"]},
                    "Ssh": {"KeyName": "other-key"},
                }
            ]
        },
    }
    refs = references(config)
    assert refs.subnets == (VALUES["subnet_id"], "subnet-0aaaaaaaaaaaaaaaa")
    assert refs.key_pairs == ("hpc-train", "other-key")


def test_references_tolerates_a_sparse_config() -> None:
    refs = references({"HeadNode": "oops", "Scheduling": {"SlurmQueues": [{}]}})
    assert refs.subnets == () and refs.key_pairs == () and refs.s3_objects == ()


aws = pytest.mark.aws


@pytest.fixture
def fake_account():
    pytest.importorskip("pcluster", reason="needs the aws extra: pip install -e '.[aws]'")
    from hpc_train.cluster.fake_aws import fake_aws_account

    return fake_aws_account


@aws
def test_fake_account_holds_the_referenced_resources(fake_account, monkeypatch) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALLOOKINGKEY")
    with fake_account(CONFIG) as account:
        ec2 = boto3.client("ec2")
        subnets = ec2.describe_subnets(SubnetIds=[VALUES["subnet_id"]])["Subnets"]
        assert subnets[0]["AvailabilityZone"] == "us-east-1a"
        keys = ec2.describe_key_pairs(KeyNames=["hpc-train"])["KeyPairs"]
        assert keys[0]["KeyType"] == "ed25519"
        images = ec2.describe_images(Owners=["amazon"])["Images"]
        assert any(i["Name"].startswith("aws-parallelcluster-3.16.1-ubuntu-2404") for i in images)
        head = boto3.client("s3").head_object(
            Bucket=VALUES["bucket"], Key="hpc-train/on-node-configured.sh"
        )
        assert head["ContentLength"] > 0
        assert account.subnets == [VALUES["subnet_id"]]
        assert os.environ["AWS_ACCESS_KEY_ID"] != "AKIAREALLOOKINGKEY"  # fake credentials only


@aws
def test_fake_account_refuses_the_network_and_records_it(fake_account) -> None:
    with fake_account(CONFIG) as account:
        with pytest.raises(NetworkAttempt):
            socket.create_connection(("192.0.2.1", 443), timeout=1)
        # urllib turns it into URLError, the way an offline machine looks to callers like pcluster
        with pytest.raises(OSError):
            urllib.request.urlopen("https://example.com/", timeout=1)
        assert "192.0.2.1" in account.refused and "example.com" in account.refused
        # loopback stays usable (moto, local test servers)
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=1):
            pass
        server.close()


@aws
def test_fake_account_restores_environment_and_network(fake_account, monkeypatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "my-real-profile")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with fake_account(CONFIG):
        assert "AWS_PROFILE" not in os.environ
        assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
    assert os.environ["AWS_PROFILE"] == "my-real-profile"
    assert "AWS_ACCESS_KEY_ID" not in os.environ
    assert socket.getaddrinfo.__module__ == "socket"  # the guard is gone
