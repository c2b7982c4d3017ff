"""yaml_paths: turning (resource, validator arguments) into YAML paths. Pure: no pcluster needed."""

from __future__ import annotations

import yaml

from hpc_train.cluster import yaml_paths as yp

TEXT = """\
Region: us-east-1
Scheduling:
  SlurmQueues:
    - Name: gpu
      Networking:
        PlacementGroup:
          Enabled: true
      ComputeResources:
        - Name: p3dn
          InstanceType: p3dn.24xlarge
          MinCount: 3
          MaxCount: 2
          Efa:
            Enabled: true
SharedStorage:
  - Name: lustre
    StorageType: FsxLustre
    FsxLustreSettings:
      StorageCapacity: 1000
      DeploymentType: PERSISTENT_2
"""
DOC = yaml.safe_load(TEXT)
CR = ("Scheduling", "SlurmQueues", 0, "ComputeResources", 0)


def test_format_and_pascal() -> None:
    assert (
        yp.format_path(("Scheduling", "SlurmQueues", 0, "Name")) == "Scheduling.SlurmQueues[0].Name"
    )
    assert yp.format_path(()) == "(top level)"
    assert yp.pascal("min_count") == "MinCount"
    assert yp.pascal("s3_access") == "S3Access"


def test_resolve_follows_flattened_settings_and_stops_at_missing_keys() -> None:
    assert yp.resolve(DOC, ("SharedStorage", 0, "StorageCapacity")) == (
        "SharedStorage",
        0,
        "FsxLustreSettings",
        "StorageCapacity",
    )
    assert yp.resolve(DOC, (*CR, "ComputeSettings", "LocalStorage")) == CR
    assert yp.resolve(DOC, ("SharedStorage", 5)) == ("SharedStorage",)


def test_locate_narrows_to_the_keys_holding_the_arguments() -> None:
    where, fields = yp.locate(DOC, CR, {"min_count": 3, "max_count": 2}, {})
    assert where == CR
    assert fields == (("MinCount",), ("MaxCount",))
    assert yp.describe(where, fields).endswith("ComputeResources[0].{MinCount, MaxCount}")


def test_locate_single_key_and_nested_argument_names() -> None:
    queue = ("Scheduling", "SlurmQueues", 0)
    assert yp.locate(DOC, queue, {"name": "gpu"}, {}) == ((*queue, "Name"), ())
    where, fields = yp.locate(
        DOC, queue, {"instance_type": "p3dn.24xlarge", "efa_enabled": True, "gdr_support": None}, {}
    )
    assert where == CR
    assert fields == (("InstanceType",), ("Efa", "Enabled"))


def test_locate_does_not_confuse_true_with_one_or_other_keys() -> None:
    # placement_group_enabled=True must match PlacementGroup.Enabled, not Efa.Enabled.
    where, fields = yp.locate(DOC, (), {"placement_group_enabled": True}, {})
    assert where == ("Scheduling", "SlurmQueues", 0, "Networking", "PlacementGroup", "Enabled")
    assert fields == ()
    assert yp.locate(DOC, CR, {"min_count": True}, {}) == (CR, ())


def test_locate_drops_a_name_that_only_identifies_the_resource() -> None:
    storage = ("SharedStorage", 0)
    where, fields = yp.locate(DOC, storage, {"storage_capacity": 1000, "name": "lustre"}, {})
    assert where == (*storage, "FsxLustreSettings", "StorageCapacity")
    assert fields == ()


def test_locate_uses_resource_arguments_by_identity() -> None:
    marker = object()
    paths = {id(marker): ("SharedStorage", 0, "FsxLustreSettings")}
    where, _ = yp.locate(DOC, (), {"settings": marker}, paths)
    assert where == ("SharedStorage", 0, "FsxLustreSettings")


def test_locate_falls_back_to_the_owner() -> None:
    assert yp.locate(DOC, CR, {"something": "unrelated"}, {}) == (CR, ())


def test_line_of_points_at_the_key() -> None:
    assert yp.line_of(TEXT, (*CR, "MinCount")) == 11
    assert yp.line_of(TEXT, ("SharedStorage", 0, "FsxLustreSettings", "StorageCapacity")) == 19
    assert yp.line_of(TEXT, (*CR, "Missing")) == 9  # the nearest existing node
    assert yp.line_of("a: [", ("a",)) is None
