"""pcluster_configs/: the shipped templates say what the issue asks, and the variants differ from
the headline config only where they claim to. Pure YAML checks; validate tests run ParallelCluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_train.cluster import render

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "pcluster_configs"
VALUES = yaml.safe_load((CONFIGS / "examples" / "values.yaml").read_text())
TEMPLATES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


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
    assert cr["Efa"] == {"Enabled": True}
    assert cr["DisableSimultaneousMultithreading"] is True
    assert queue["Networking"]["PlacementGroup"]["Enabled"] is True
    # the V100's GPU check is the launcher's, not DCGM's in the prolog (the test below says why)
    assert queue["HealthChecks"]["Gpu"]["Enabled"] is False
    assert queue["CapacityType"] == "ONDEMAND"
    assert c["Scheduling"]["SlurmSettings"]["ScaledownIdletime"] > 0
    [lustre] = [s for s in c["SharedStorage"] if s["StorageType"] == "FsxLustre"]
    assert lustre["MountDir"] == "/lustre"
    [dra] = lustre["FsxLustreSettings"]["DataRepositoryAssociations"]
    assert dra["DataRepositoryPath"] == f"s3://{bucket}"
    for node in (c["HeadNode"], queue):
        assert node["CustomActions"]["OnNodeConfigured"]["Script"] == (
            f"s3://{bucket}/hpc-train/on-node-configured.sh"
        )
        # least privilege: one bucket, one prefix, read only
        assert node["Iam"]["S3Access"] == [
            {"BucketName": bucket, "KeyName": "hpc-train/*", "EnableWriteAccess": False}
        ]


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_requeue_is_held_10_s_on_slurm_25_11_not_parallelclusters_70(name: str) -> None:
    """Every shipped cluster sets SchedulerParameters=requeue_delay=10: on ParallelCluster 3.16
    (Slurm 25.11, its slurm.conf AuthInfo=cred_expire=70) a requeue is held 10 s, on an older
    Slurm still 70 s; without the setting 70 s (``hpc_core.slurm.requeue_hold_of`` decides)."""
    from hpc_train.cluster import requeue_hold

    config = load(name)
    assert requeue_hold.of_config(config) == 10
    assert requeue_hold.of_config(config, slurm_version="24.11") == 70
    del config["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"]
    assert requeue_hold.of_config(config) == 70


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_gpu_queue_checks_its_nodes_once_dcgm_in_the_prolog_or_the_launcher(name: str) -> None:
    """ParallelCluster's GPU check (`dcgmi diag -r 2` in every job's prolog) is on where it is
    fit and off on the V100 (p3dn): the cookbook checks a V100 (its is_dcgm_supported skips
    only K520s and MIG), NVIDIA/DCGM#254 reports that level's PCIe test failing on V100 with
    driver 580 and DCGM 4.4's CUDA 12 packages, NVIDIA points Volta away from its CUDA 13 ones,
    and the p3dn image must run R580: a prolog that fails at every job would drain and replace
    every node (docs/on-aws.md, "The GPU check before training"). Where it is off, a job of that
    instance type checks its nodes itself by default (submit --node-check auto), and only there.
    """
    from hpc_core.instances import instance_type
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training

    for queue in load(name)["Scheduling"]["SlurmQueues"]:
        for cr in queue["ComputeResources"]:
            itype = instance_type(cr["InstanceType"])
            dcgm = queue["HealthChecks"]["Gpu"]["Enabled"]
            assert dcgm is itype.dcgm_prolog
            spec = JobSpec(
                Training("tiny", Path("/d"), Path("/s")), Sizing(instance_type=itype.name)
            )
            assert spec.checks_nodes is not dcgm
    assert instance_type("p3dn.24xlarge").dcgm_prolog is False


def test_a_changed_requeue_hold_is_said_to_take_a_new_slurmctld() -> None:
    """Slurm 25.11 keeps the delay it read first for the life of the slurmctld process
    (job_mgr.c _requeue_delay()): an update that changes it says what makes it apply."""
    from hpc_train.cluster import requeue_hold

    old, new = load("p3dn.yaml"), load("p3dn.yaml")
    assert requeue_hold.update_notes(old, new) == []
    new["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"][0]["SchedulerParameters"] = (
        "nohold_on_prolog_fail,requeue_delay=30"
    )
    [note] = requeue_hold.update_notes(old, new)
    assert note.startswith("requeue hold 10 s -> 30 s ")
    assert "once per process" in note and "sudo systemctl restart slurmctld" in note
    del new["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"]  # back to cred_expire=70
    assert requeue_hold.update_notes(old, new)[0].startswith("requeue hold 10 s -> 70 s ")


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_config_keeps_what_parallelcluster_writes_into_slurm_conf(name: str) -> None:
    """ParallelCluster writes SchedulerParameters=nohold_on_prolog_fail itself; the configs' own
    SchedulerParameters line, included after it, repeats it, so a job whose prolog (the GPU health
    check) fails is requeued, not held."""
    from hpc_train.cluster import requeue_hold, slurm_conf

    config = load(name)
    assert list(slurm_conf.dropped(config)) == []
    assert not requeue_hold.held_on_prolog_fail(config)
    assert any(
        k.startswith("SchedulerParameters=nohold_on_prolog_fail") for k in slurm_conf.kept(config)
    )


def test_a_custom_line_that_drops_parallelclusters_option_is_named() -> None:
    """The old line (requeue_delay=10 alone) dropped nohold_on_prolog_fail: named, with its source;
    a queue's MaxTime replaces ParallelCluster's MaxTime=INFINITE on the partition line."""
    from hpc_train.cluster import requeue_hold, slurm_conf

    config = load("p3dn.yaml")
    settings = config["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"]
    settings[:] = [{"SchedulerParameters": "requeue_delay=10"}, {"SlurmdTimeout": 600}]
    config["Scheduling"]["SlurmQueues"][0]["CustomSlurmSettings"] = {"MaxTime": "1-00:00:00"}
    found = {(d.written.keyword, d.lost): d for d in slurm_conf.dropped(config)}
    assert set(found) == {
        ("SchedulerParameters", ("nohold_on_prolog_fail",)),
        ("SlurmdTimeout", ("180",)),
        ("MaxTime", ("INFINITE",)),
    }
    message = found[("SchedulerParameters", ("nohold_on_prolog_fail",))].message
    assert "slurm.conf.erb:47" in message
    assert "nohold_on_prolog_fail,requeue_delay=10" in message
    assert requeue_hold.held_on_prolog_fail(config)
    assert requeue_hold.of_config(config) == 10  # the hold itself is unchanged


@pytest.mark.parametrize(
    ("memory", "custom", "source", "said"),
    [
        (None, {"ClusterName": "hpc"}, "slurm.conf.erb:12", "ClusterName=<the cluster's name>"),
        (None, {"SelectTypeParameters": "CR_Core_Memory"}, "slurm_parallelcluster.conf:14",
         "SelectTypeParameters=CR_CPU ("),
        (True, {"SelectTypeParameters": "CR_CPU"}, "slurm_parallelcluster.conf:12",
         "SelectTypeParameters=CR_CPU_Memory ("),
    ],
)  # fmt: skip
def test_a_custom_cluster_name_or_select_type_parameters_replaces_parallelclusters_own(
    memory: bool | None, custom: dict[str, str], source: str, said: str
) -> None:
    """ParallelCluster writes ClusterName (slurm.conf.erb) and SelectTypeParameters (from
    EnableMemoryBasedScheduling, slurm_parallelcluster.conf, included before the custom settings):
    a custom line of either replaces it, named with its source; the same value is kept."""
    from hpc_train.cluster import slurm_conf

    config = load("p3dn.yaml")
    slurm = config["Scheduling"]["SlurmSettings"]
    if memory is not None:
        slurm["EnableMemoryBasedScheduling"] = memory
    slurm["CustomSlurmSettings"].append(custom)
    [dropped] = slurm_conf.dropped(config)
    assert said in dropped.message and source in dropped.message
    assert dropped.where[-1] == next(iter(custom))
    if "SelectTypeParameters" in custom:
        ours = said.split("=")[1].rstrip(" (")
        slurm["CustomSlurmSettings"][-1] = {"SelectTypeParameters": ours}
        assert list(slurm_conf.dropped(config)) == []
        assert f"SelectTypeParameters={ours} (aws-parallelcluster-cookbook" in " ".join(
            slurm_conf.kept(config)
        )


def test_parallelclusters_settings_are_not_on_its_deny_list() -> None:
    """What slurm_conf records is what a config may set (pcluster refuses the deny-listed ones
    itself); its cred_expire is the one hpc_core.slurm knows."""
    pytest.importorskip("pcluster.validators.slurm_settings_validator")
    from pcluster.validators.slurm_settings_validator import SLURM_SETTINGS_DENY_LIST

    from hpc_core import slurm
    from hpc_train.cluster import slurm_conf

    denied = set(SLURM_SETTINGS_DENY_LIST["SlurmConf"]["Global"])
    assert not {w.keyword.lower() for w in slurm_conf.cluster_writes({})} & denied
    partition = set(SLURM_SETTINGS_DENY_LIST["Queue"]["Global"])
    assert not {w.keyword.lower() for w in slurm_conf.PARTITION_WRITES} & partition
    shown = f"AuthInfo = {slurm_conf.effective('AuthInfo', {})}"
    assert slurm.cred_expire_of(shown) == slurm.PCLUSTER_CRED_EXPIRE_S


def test_node_type_and_code_reach_the_nodes_as_part_b_expects() -> None:
    """The interface with the bootstrap (issue 17): node type in Args, source on the head only."""
    c = load("p3dn.yaml")
    bucket, sha = VALUES["bucket"], VALUES["source_sha256"]
    head = c["HeadNode"]["CustomActions"]
    assert head["OnNodeConfigured"]["Args"] == [
        "--node-type",
        "HeadNode",
        "--source",
        f"s3://{bucket}/hpc-train/hpc-train-src.tar.gz",
        "--sha256",
        sha,
    ]
    assert head["OnNodeUpdated"] == {
        "Script": f"s3://{bucket}/hpc-train/on-node-updated.sh",
        "Args": [
            "--node-type",
            "HeadNode",
            "--source",
            f"s3://{bucket}/hpc-train/hpc-train-src-{sha[:16]}.tar.gz",
            "--sha256",
            sha,
        ],
    }
    [queue] = c["Scheduling"]["SlurmQueues"]
    assert queue["CustomActions"]["OnNodeConfigured"]["Args"] == [
        "--node-type",
        "ComputeFleet",
        "--instance-type",
        "p3dn.24xlarge",
    ]


@pytest.mark.parametrize("name", TEMPLATES)
def test_ssh_is_not_open_to_the_world_and_ssm_is_granted(name: str) -> None:
    c = load(name)
    assert c["HeadNode"]["Ssh"]["AllowedIps"] == VALUES["allowed_ips"] != "0.0.0.0/0"
    # docs/on-aws.md promises Session Manager to the head node: the role must allow it
    assert {"Policy": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"} in c["HeadNode"][
        "Iam"
    ]["AdditionalIamPolicies"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_head_and_compute_subnets_are_separate(name: str) -> None:
    c = load(name)
    assert c["HeadNode"]["Networking"]["SubnetId"] == VALUES["head_subnet_id"]
    for queue in c["Scheduling"]["SlurmQueues"]:
        assert queue["Networking"]["SubnetIds"] == [VALUES["compute_subnet_id"]]
    assert VALUES["head_subnet_id"] != VALUES["compute_subnet_id"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_fsx_survives_the_cluster_and_rm_never_deletes_the_s3_copy(name: str) -> None:
    c = load(name)
    [lustre] = [s for s in c["SharedStorage"] if s["StorageType"] == "FsxLustre"]
    settings = lustre["FsxLustreSettings"]
    assert settings["DeletionPolicy"] == "Retain"
    for dra in settings["DataRepositoryAssociations"]:
        assert "DELETED" not in dra["AutoExportPolicy"]
        assert set(dra["AutoExportPolicy"]) == {"NEW", "CHANGED"}


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_setting_without_effect(name: str) -> None:
    assert not [k for k in flatten(load(name)) if "GdrSupport" in k]


def test_p3dn_queues_run_the_custom_ami_and_p4d_p5_the_official_one() -> None:
    for name in TEMPLATES:
        [queue] = load(name)["Scheduling"]["SlurmQueues"]
        if queue["ComputeResources"][0]["InstanceType"].startswith("p3dn"):
            assert queue["Image"] == {"CustomAmi": VALUES["p3dn_ami_id"]}, name
        else:
            assert "Image" not in queue, name
    assert "CustomAmi" not in load("p3dn.yaml")["Image"]  # head node: official AMI


CR = "Scheduling.SlurmQueues[0].ComputeResources[0]"
Q = "Scheduling.SlurmQueues[0]"
ARGS = f"{Q}.CustomActions.OnNodeConfigured.Args[3]"
DCGM = f"{Q}.HealthChecks.Gpu.Enabled"  # off on p3dn only (the test above says why)
P5 = {
    f"{CR}.Name": "p5",
    f"{CR}.InstanceType": "p5.48xlarge",
    ARGS: "p5.48xlarge",
    f"{Q}.Image.CustomAmi": None,
    DCGM: True,
}
EXPECTED_DIFFERENCES = {
    "p3dn-spot.yaml": {
        f"{Q}.CapacityType": "SPOT",
        f"{Q}.AllocationStrategy": "price-capacity-optimized",
    },
    "p4d.yaml": {
        f"{CR}.Name": "p4d",
        f"{CR}.InstanceType": "p4d.24xlarge",
        ARGS: "p4d.24xlarge",
        f"{Q}.Image.CustomAmi": None,
        DCGM: True,
    },
    "p5.yaml": P5,
    "p5-odcr.yaml": {
        **P5,
        f"{CR}.CapacityReservationTarget.CapacityReservationId": VALUES["capacity_reservation_id"],
        f"{Q}.Networking.PlacementGroup.Enabled": False,
    },
    "p5-capacity-block.yaml": {
        **P5,
        f"{Q}.CapacityType": "CAPACITY_BLOCK",
        f"{CR}.MinCount": 2,
        f"{CR}.CapacityReservationTarget.CapacityReservationId": VALUES["capacity_reservation_id"],
        f"{Q}.Networking.PlacementGroup.Enabled": False,
    },
}


@pytest.mark.parametrize("variant", sorted(EXPECTED_DIFFERENCES))
def test_variant_differs_from_headline_only_where_it_says(variant: str) -> None:
    base, other = flatten(load("p3dn.yaml")), flatten(load(variant))
    changed = {k: other.get(k) for k in set(base) | set(other) if base.get(k) != other.get(k)}
    assert changed == EXPECTED_DIFFERENCES[variant]


def test_example_values_are_all_valid() -> None:
    checked = render.check_values(VALUES)
    assert {n: v for n, v in checked.items() if n in render.BY_NAME} == {
        p.name: VALUES.get(p.key, VALUES["source_sha256"]) for p in render.PLACEHOLDERS
    }
    assert checked["UPDATE_SHA16"] == VALUES["source_sha256"][:16]


# A file name in a template's comments or values: a repo path, or one beside the template.
_FILE_NAME = re.compile(r"(?<![\w/.$}-])[\w./-]+\.(?:ya?ml|md|sh|py)\b")
SHIPPED = sorted(CONFIGS.rglob("*.yaml"))  # templates, the image config, the example values


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_file_a_template_names_exists(path: Path) -> None:
    """A comment pointing at a file that is not there (p3dn-existing-fsx.yaml) misleads."""
    text = path.read_text()
    names = set(_FILE_NAME.findall(text))
    assert names, "the pattern should find at least docs/on-aws.md"
    missing = [
        name
        for name in sorted(names)
        if not any((base / name).is_file() for base in (REPO, CONFIGS, path.parent))
    ]
    assert missing == []
    # The scripts named in S3 are the repo's bootstrap scripts, uploaded as docs/on-aws.md says.
    for script in re.findall(r"s3://\$\{BUCKET\}/hpc-train/([\w.-]+\.sh)", text):
        assert (REPO / "bootstrap" / script).is_file(), script


def test_the_file_name_pattern_sees_a_missing_file() -> None:
    found = _FILE_NAME.findall("# by id (p3dn-existing-fsx.yaml) or see docs/on-aws.md.")
    assert found == ["p3dn-existing-fsx.yaml", "docs/on-aws.md"]
    assert not (CONFIGS / "p3dn-existing-fsx.yaml").exists()


def test_the_docs_say_how_to_mount_the_kept_file_system() -> None:
    """The templates point at docs/on-aws.md section 12 for mounting the kept FSx by id."""
    docs = (REPO / "docs" / "on-aws.md").read_text()
    section = docs.split("\n## 12.", 1)[1].split("\n## ", 1)[0]
    assert "FileSystemId: fs-" in section and "create-data-repository-association" in section
    for name in TEMPLATES:
        assert "by FileSystemId or delete it yourself (docs/on-aws.md, section 12)" in (
            (CONFIGS / name).read_text()
        )
