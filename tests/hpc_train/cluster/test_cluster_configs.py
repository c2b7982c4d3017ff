"""pcluster_configs/: the shipped templates say what the issue asks, and the variants differ from
the headline config only where they claim to. Pure YAML checks; validate tests run ParallelCluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_train.cluster import render

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "pcluster_configs"
VALUES = yaml.safe_load((CONFIGS / "examples" / "values.yaml").read_text())


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load(render.render_text((CONFIGS / name).read_text(), VALUES))


def flatten(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(node, list):
        out = {}
        for index, value in enumerate(node):
            out.update(flatten(value, f"{path}[{index}]"))
        return out
    return {path: node}


def test_headline_config_has_what_the_issue_asks() -> None:
    c = load("p3dn.yaml")
    bucket = VALUES["bucket"]
    assert c["HeadNode"]["InstanceType"] == "c5n.2xlarge"
    [queue] = c["Scheduling"]["SlurmQueues"]
    [cr] = queue["ComputeResources"]
    assert (cr["InstanceType"], cr["MinCount"], cr["MaxCount"]) == ("p3dn.24xlarge", 0, 2)
    assert cr["Efa"] == {"Enabled": True}  # p3dn: no GPUDirect RDMA
    assert cr["DisableSimultaneousMultithreading"] is True
    assert queue["Networking"]["PlacementGroup"]["Enabled"] is True
    assert queue["HealthChecks"]["Gpu"]["Enabled"] is True
    assert queue["CapacityType"] == "ONDEMAND"
    assert c["Scheduling"]["SlurmSettings"]["ScaledownIdletime"] > 0
    [lustre] = [s for s in c["SharedStorage"] if s["StorageType"] == "FsxLustre"]
    assert lustre["MountDir"] == "/lustre"
    [dra] = lustre["FsxLustreSettings"]["DataRepositoryAssociations"]
    assert dra["DataRepositoryPath"] == f"s3://{bucket}"
    for node in (c["HeadNode"], queue):
        action = node["CustomActions"]["OnNodeConfigured"]
        assert action["Script"] == f"s3://{bucket}/hpc-train/on-node-configured.sh"
        assert action["Args"][:4] == [
            "--source",
            f"s3://{bucket}/hpc-train/hpc-train-src.tar.gz",
            "--sha256",
            VALUES["source_sha256"],
        ]
        # least privilege: one bucket, one prefix, read only
        assert node["Iam"]["S3Access"] == [
            {"BucketName": bucket, "KeyName": "hpc-train/*", "EnableWriteAccess": False}
        ]
    assert queue["CustomActions"]["OnNodeConfigured"]["Args"][4:] == [
        "--instance-type",
        "p3dn.24xlarge",
    ]


CR = "Scheduling.SlurmQueues[0].ComputeResources[0]"
ARGS = "Scheduling.SlurmQueues[0].CustomActions.OnNodeConfigured.Args[5]"
EXPECTED_DIFFERENCES = {
    "p3dn-spot.yaml": {
        "Scheduling.SlurmQueues[0].CapacityType": "SPOT",
        "Scheduling.SlurmQueues[0].AllocationStrategy": "capacity-optimized",
    },
    "p4d.yaml": {
        f"{CR}.Name": "p4d",
        f"{CR}.InstanceType": "p4d.24xlarge",
        f"{CR}.Efa.GdrSupport": True,
        ARGS: "p4d.24xlarge",
    },
    "p5.yaml": {
        f"{CR}.Name": "p5",
        f"{CR}.InstanceType": "p5.48xlarge",
        f"{CR}.Efa.GdrSupport": True,
        ARGS: "p5.48xlarge",
    },
}


@pytest.mark.parametrize("variant", sorted(EXPECTED_DIFFERENCES))
def test_variant_differs_from_headline_only_where_it_says(variant: str) -> None:
    base, other = flatten(load("p3dn.yaml")), flatten(load(variant))
    changed = {k: other.get(k) for k in set(base) | set(other) if base.get(k) != other.get(k)}
    assert changed == EXPECTED_DIFFERENCES[variant]


def test_example_values_are_all_valid() -> None:
    assert render.check_values(VALUES) == {p.name: VALUES[p.key] for p in render.PLACEHOLDERS}
