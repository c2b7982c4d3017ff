"""Configs of our own writing that exercise what ParallelCluster's example and integration-test
configs exercise (EFA, a placement group by name, ODCR, Capacity Block, GPU health checks, FSx with
data repository associations, spot strategies, login nodes): each gets ParallelCluster's verdict
through our validate, or a named "not checkable offline".

AWS is faked (moto plus botocore-level answers for placement groups and capacity reservations,
hpc_train/cluster/fake_aws.py) so that these run without credentials; the fake account is no kinder
than AWS, so a verdict here is ParallelCluster's own on the config.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "pcluster.schemas.cluster_schema",
    reason="needs the aws extra (aws-parallelcluster + moto): pip install -e '.[aws]'",
)
pytestmark = pytest.mark.aws

from hpc_train.cluster import validate  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"

# fixture -> (validators with an ERROR, validators with a WARNING, validators that must have run)
VERDICTS: dict[str, tuple[set[str], set[str], set[str]]] = {
    "efa-placement-group-by-name.yaml": (
        set(),
        set(),
        {
            "EfaValidator",
            "PlacementGroupNamingValidator",
            "MultiNetworkInterfacesInstancesValidator",
        },
    ),
    "odcr-queue-level.yaml": (
        set(),
        {"EfaPlacementGroupValidator"},  # "Placement group is disabled ... expected when using a
        # capacity reservation with its own placement group"
        {"CapacityReservationValidator", "PlacementGroupCapacityReservationValidator"},
    ),
    "capacity-block.yaml": (
        set(),
        set(),
        {"CapacityReservationValidator", "CapacityTypeValidator", "ComputeResourceSizeValidator"},
    ),
    "gpu-health-checks.yaml": (
        set(),
        {"EfaValidator"},  # pcluster advises EFA for g4dn.12xlarge and g5.12xlarge
        {"InstanceTypeAcceleratorManufacturerValidator"},
    ),
    "fsx-data-repository-associations.yaml": (
        set(),
        set(),
        {"FsxDraValidator", "FsxS3Validator", "FsxStorageCapacityValidator"},
    ),
    "spot-strategies.yaml": (
        set(),
        set(),
        {"InstancesAllocationStrategyValidator", "CapacityTypeValidator"},
    ),
    "login-nodes.yaml": (set(), set(), {"InstanceTypeValidator"}),
    "efa-in-public-subnet.yaml": ({"MultiNetworkInterfacesInstancesValidator"}, set(), set()),
    "capacity-reservation-group.yaml": (
        set(),
        {"EfaPlacementGroupValidator"},
        {"CapacityReservationValidator", "EfaSecurityGroupValidator", "EfaOsArchitectureValidator"},
    ),
}
NOT_CHECKABLE = {"existing-fsx-by-id.yaml": "existing file system fs-0123456789abcdef0"}


def test_every_fixture_has_a_verdict() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.yaml")) == sorted({*VERDICTS, *NOT_CHECKABLE})


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_fixture_gets_pclusters_verdict(name: str) -> None:
    errors, warnings, ran = VERDICTS[name]
    text = (FIXTURES / name).read_text()
    report = validate.validate_config(text, yaml.safe_load(text))
    assert report.validators_run > 50, "the validators ran, not just the schema"
    assert {f.validator for f in report.errors} == errors, [str(f) for f in report.errors]
    assert {f.validator for f in report.findings if f.level == "WARNING"} == warnings
    assert ran <= report.ran, ran - report.ran
    assert report.not_checked  # what only the real account can say is listed


def test_the_public_subnet_refusal_names_the_subnet() -> None:
    text = (FIXTURES / "efa-in-public-subnet.yaml").read_text()
    [error] = validate.validate_config(text, yaml.safe_load(text)).errors
    assert "['subnet-0123456789abcdef0'] auto-assign public IPs" in error.message
    assert error.path == "Scheduling.SlurmQueues[0]"


@pytest.mark.parametrize("name", sorted(NOT_CHECKABLE))
def test_not_checkable_offline_is_said_by_name(name: str) -> None:
    text = (FIXTURES / name).read_text()
    with pytest.raises(validate.NotCheckableOffline, match=NOT_CHECKABLE[name]):
        validate.validate_config(text, yaml.safe_load(text))
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.cluster", "validate", str(FIXTURES / name)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "is not checkable offline: existing file system fs-0123456789abcdef0" in proc.stderr


# validator -> the call the fake account cannot answer for it (moto's gap, or a kind of resource
# it holds none of): said "not checked offline", never the config's error
GAPS = {
    "CapacityReservationResourceGroupValidator": "resource-groups GetGroupConfiguration",
    "PlacementGroupCapacityReservationValidator": "resource-groups ListGroupResources: moto does not implement it",
    "RoleValidator": "iam GetRole: the fake account holds no IAM roles",
    "SecurityGroupsValidator": "ec2 DescribeSecurityGroups: the fake account holds no security groups",
}


def test_a_call_the_fake_account_cannot_answer_is_not_checked_never_an_error() -> None:
    """ParallelCluster's p4d EFA example (a capacity reservation group by ARN) got 2 errors, one
    "Not yet implemented": moto's text as the config's verdict. Each such validator is named."""
    text = (FIXTURES / "capacity-reservation-group.yaml").read_text()
    report = validate.validate_config(text, yaml.safe_load(text))
    assert report.errors == []
    assert not [f for f in report.findings if f.validator in GAPS]
    for name, call in GAPS.items():
        assert any(
            line.startswith(f"{name} at ") and call in line for line in report.not_checked
        ), name
    assert not any("Not yet implemented" in str(f) for f in report.findings)
