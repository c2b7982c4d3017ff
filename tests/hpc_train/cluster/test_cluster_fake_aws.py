"""fake_aws: the moto (fake AWS) account validate runs in: what it holds, what it refuses, cleanup."""

from __future__ import annotations

import copy
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
    assert refs.os == "ubuntu2204"
    assert refs.subnets == (VALUES["head_subnet_id"], VALUES["compute_subnet_id"])
    assert refs.head_subnet == VALUES["head_subnet_id"]
    assert refs.custom_amis == (VALUES["p3dn_ami_id"],)
    assert refs.aws_policies == ("AmazonSSMManagedInstanceCore",)
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
    assert refs.subnets == (
        VALUES["head_subnet_id"],
        VALUES["compute_subnet_id"],
        "subnet-0aaaaaaaaaaaaaaaa",
    )
    assert refs.key_pairs == ("hpc-train", "other-key")
    # the pool has no CustomAmi and neither has the cluster: it boots the official AMI
    assert refs.official_ami_users == ("the head node", "login node pool login")


def test_who_boots_the_official_ami() -> None:
    """ParallelCluster looks its official AMI up unless a CustomAmi (top level, queue's) says."""
    assert references(CONFIG).official_ami_users == ("the head node",)  # queue: its custom AMI
    config = copy.deepcopy(CONFIG)
    del config["Scheduling"]["SlurmQueues"][0]["Image"]
    assert references(config).official_ami_users == ("the head node", "queue gpu")
    config["Image"]["CustomAmi"] = "ami-0123456789abcdef0"
    assert references(config).official_ami_users == ()
    image = render.render_text(
        (REPO / "pcluster_configs" / "images" / "p3dn-closed-driver.yaml").read_text(), VALUES
    )
    assert references(yaml.safe_load(image)).official_ami_users == ()  # starts from ParentImage


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
        head, compute = VALUES["head_subnet_id"], VALUES["compute_subnet_id"]
        subnets = {
            s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=[head, compute])["Subnets"]
        }
        assert subnets[head]["AvailabilityZone"] == "us-east-1a"
        # the head node's subnet is public, the compute one private: as the templates ask
        assert subnets[head]["MapPublicIpOnLaunch"] is True
        assert subnets[compute]["MapPublicIpOnLaunch"] is False
        keys = ec2.describe_key_pairs(KeyNames=["hpc-train"])["KeyPairs"]
        assert keys[0]["KeyType"] == "ed25519"
        images = ec2.describe_images(Owners=["amazon"])["Images"]
        [official] = [i for i in images if i["Architecture"] == "x86_64"]
        assert official["Name"].startswith("aws-parallelcluster-3.16.1-ubuntu-2204")
        # described as ParallelCluster's image build describes it (parallelcluster_tag.yaml)
        assert official["Description"].startswith("AWS ParallelCluster AMI for ubuntu2204, ")
        [custom] = ec2.describe_images(Owners=["self"])["Images"]
        assert custom["ImageId"] == VALUES["p3dn_ami_id"]
        assert "AWS ParallelCluster AMI" in custom["Description"]
        tags = {t["Key"]: t["Value"] for t in custom["Tags"]}
        assert tags["parallelcluster:os"] == "ubuntu2204"
        assert tags["parallelcluster:build_status"] == "available"
        policy = boto3.client("iam").get_policy(
            PolicyArn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
        )
        assert policy["Policy"]["PolicyName"] == "AmazonSSMManagedInstanceCore"
        script = boto3.client("s3").head_object(
            Bucket=VALUES["bucket"], Key="hpc-train/on-node-configured.sh"
        )
        assert script["ContentLength"] > 0
        assert account.subnets == [head, compute]
        assert account.public_subnets == [head]
        assert os.environ["AWS_ACCESS_KEY_ID"] != "AKIAREALLOOKINGKEY"  # fake credentials only


@aws
def test_fake_account_answers_what_moto_lacks_as_strictly_as_aws(fake_account) -> None:
    """Placement groups and capacity reservations: moto raises NotImplementedError; the fake
    account holds the ones the config names and refuses any other with AWS's error code."""
    import boto3
    from botocore.exceptions import ClientError

    config = copy.deepcopy(CONFIG)
    queue = config["Scheduling"]["SlurmQueues"][0]
    queue["Networking"]["PlacementGroup"] = {"Name": "my-pg"}
    queue["CapacityType"] = "CAPACITY_BLOCK"
    queue["ComputeResources"][0]["CapacityReservationTarget"] = {
        "CapacityReservationId": "cr-0123456789abcdef0"
    }
    with fake_account(config) as account:
        ec2 = boto3.client("ec2")
        [group] = ec2.describe_placement_groups(GroupNames=["my-pg"])["PlacementGroups"]
        assert (group["GroupName"], group["Strategy"]) == ("my-pg", "cluster")
        with pytest.raises(ClientError) as err:
            ec2.describe_placement_groups(GroupNames=["other"])
        assert err.value.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown"
        [cr] = ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0123456789abcdef0"])[
            "CapacityReservations"
        ]
        assert (cr["InstanceType"], cr["ReservationType"], cr["TotalInstanceCount"]) == (
            "p3dn.24xlarge",
            "capacity-block",
            2,
        )
        with pytest.raises(ClientError) as err:
            ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0aaaaaaaaaaaaaaaa"])
        assert err.value.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound"
        assert any("placement group my-pg" in line for line in account.not_checked)
        assert any("a Capacity Block for 2 x p3dn.24xlarge" in line for line in account.not_checked)


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
