"""validate: ParallelCluster's real schema and validators on our configs, AWS faked by moto.

AWS is faked (moto, plus botocore-level answers for what moto lacks) because these tests must run
without credentials or network; the fake account is made no kinder than AWS (fake_aws.py), so the
refusals below are ParallelCluster's own. Every shipped template, rendered with the example values,
must come out clean (p3dn with the one suppression ParallelCluster's message asks for);
deliberately broken copies must fail with ParallelCluster's own message at the right YAML path.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip(
    "pcluster.schemas.cluster_schema",
    reason="needs the aws extra (aws-parallelcluster + moto): pip install -e '.[aws]'",
)
pytestmark = pytest.mark.aws

from hpc_train.cluster import render, validate  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "pcluster_configs"
VALUES = yaml.safe_load((CONFIGS / "examples" / "values.yaml").read_text())
TEMPLATES = sorted(CONFIGS.glob("*.yaml"))
CR = "Scheduling.SlurmQueues[0].ComputeResources[0]"
AMI_CHECK = "InstanceTypeBaseAMICompatibleValidator"
OPENRM_REFUSAL = "The instance type 'p3dn.24xlarge' is not supported by NVIDIA OpenRM drivers"
# What each template is created with, as docs/on-aws.md says (--suppress-validators type:NAME).
SUPPRESS = {"p3dn.yaml": {AMI_CHECK}, "p3dn-spot.yaml": {AMI_CHECK}}
# ParallelCluster's warnings a template keeps on purpose (its header comment says why).
KEPT_WARNINGS = {"p5-odcr.yaml": {"EfaPlacementGroupValidator"}}


def rendered(name: str) -> str:
    return render.render_text((CONFIGS / name).read_text(), VALUES)


def check(data: dict[str, Any], suppress: set[str] | None = None) -> validate.Report:
    text = yaml.safe_dump(data, sort_keys=False)
    return validate.validate_config(text, yaml.safe_load(text), suppress=suppress or set())


@pytest.fixture(scope="module")
def headline() -> dict[str, Any]:
    return yaml.safe_load(rendered("p3dn.yaml"))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_every_template_renders_and_validates_clean(template: Path) -> None:
    text = rendered(template.name)
    suppress = SUPPRESS.get(template.name, set())
    report = validate.validate_config(text, yaml.safe_load(text), suppress=suppress)
    assert report.validators_run > 80  # the validators really ran, not just the schema
    kept = KEPT_WARNINGS.get(template.name, set())
    assert [str(f) for f in report.findings if f.level != "INFO" and f.validator not in kept] == []
    assert {f.validator for f in report.findings if f.level == "WARNING"} == kept
    assert report.refused == []  # no network attempt got as far as the guard
    assert set(report.suppressed) == suppress
    # what only the real account can say is listed by name, never passed silently
    assert any(VALUES["head_subnet_id"] in line for line in report.not_checked)
    assert any("key pair hpc-train" in line for line in report.not_checked)
    assert set(report.skipped) == {
        "HeadNodeLaunchTemplateValidator",
        "ComputeResourceLaunchTemplateValidator",
    }


def test_p3dn_on_the_official_ami_is_refused_with_pclusters_reason(
    headline: dict[str, Any],
) -> None:
    """Today's p3dn.yaml (queue on the official AMI): ParallelCluster refuses it; so must we."""
    data = copy.deepcopy(headline)
    del data["Scheduling"]["SlurmQueues"][0]["Image"]
    [error] = [f for f in check(data).errors if f.validator == AMI_CHECK]
    assert OPENRM_REFUSAL in error.message
    assert "building a custom AMI with closed source NVIDIA drivers" in error.message
    assert "suppress this validator" in error.message
    assert error.path == f"{CR}.InstanceType"


def test_p3dn_on_the_custom_ami_needs_the_suppression_pcluster_names(
    headline: dict[str, Any],
) -> None:
    """A build-image AMI is described "AWS ParallelCluster AMI ..." too: refused until suppressed."""
    [error] = check(headline).errors
    assert (error.validator, error.path) == (AMI_CHECK, f"{CR}.InstanceType")
    assert OPENRM_REFUSAL in error.message
    report = check(headline, suppress={AMI_CHECK})
    assert report.errors == []
    assert report.suppressed == [AMI_CHECK]
    assert "OsCustomAmiValidator" in report.ran  # the custom AMI itself was checked
    assert any(VALUES["p3dn_ami_id"] in line for line in report.not_checked)


def test_a_custom_ami_of_another_os_is_refused(headline: dict[str, Any]) -> None:
    data = copy.deepcopy(headline)
    data["Image"]["Os"] = "alinux2023"
    text = yaml.safe_dump(data, sort_keys=False)
    # the fake account builds the AMI for the config's OS; tell it otherwise
    from hpc_train.cluster import fake_aws

    real = fake_aws._fake_custom_amis

    def other_os(refs: Any) -> list[dict[str, Any]]:
        return [
            {**a, "tags": {**a["tags"], "parallelcluster:os": "ubuntu2204"}} for a in real(refs)
        ]

    fake_aws._fake_custom_amis = other_os
    try:
        report = validate.validate_config(text, yaml.safe_load(text), suppress={AMI_CHECK})
    finally:
        fake_aws._fake_custom_amis = real
    assert any(
        f.validator == "AmiOsCompatibleValidator" and "not compatible with cluster OS" in f.message
        for f in report.errors
    ), [str(f) for f in report.findings]


def test_an_efa_queue_in_the_public_head_subnet_is_refused(headline: dict[str, Any]) -> None:
    """The old templates' single subnet: AWS cannot give an EFA node a public IP."""
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmQueues"][0]["Networking"]["SubnetIds"] = [VALUES["head_subnet_id"]]
    errors = [
        f
        for f in check(data, {AMI_CHECK}).errors
        if f.validator == "MultiNetworkInterfacesInstancesValidator"
    ]
    assert errors, "an EFA queue in a subnet that assigns public IPs must be refused"
    assert "auto-assign public IPs" in errors[0].message
    assert VALUES["head_subnet_id"] in errors[0].message


@pytest.mark.parametrize("name", ["p5-odcr.yaml", "p5-capacity-block.yaml"])
def test_capacity_reservations_are_checkable(name: str) -> None:
    """moto has no DescribeCapacityReservations: the fake account answers it, so pcluster's
    reservation validators run instead of the config failing for moto's gap."""
    report = check(yaml.safe_load(rendered(name)))
    assert {"CapacityReservationValidator", "CapacityReservationSizeValidator"} <= report.ran
    assert report.errors == []
    assert any(VALUES["capacity_reservation_id"] in line for line in report.not_checked)


def test_a_capacity_block_with_dynamic_nodes_is_refused() -> None:
    data = yaml.safe_load(rendered("p5-capacity-block.yaml"))
    data["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MinCount"] = 0
    messages = [
        f.message for f in check(data).errors if f.validator == "ComputeResourceSizeValidator"
    ]
    assert "Min count must be a value > 0 when using Capacity Block reservation." in messages


def test_a_capacity_reservation_bigger_than_asked_is_refused() -> None:
    data = yaml.safe_load(rendered("p5-odcr.yaml"))
    queue = data["Scheduling"]["SlurmQueues"][0]
    second = copy.deepcopy(queue["ComputeResources"][0])
    second["Name"] = "p5b"
    queue["ComputeResources"].append(second)  # two resources on one reservation sized for one
    from hpc_train.cluster import fake_aws

    refs = fake_aws.references(data)
    assert [r[3] for r in refs.capacity_reservations] == [2]  # sized from the first MaxCount
    errors = [f for f in check(data).errors if f.validator == "CapacityReservationSizeValidator"]
    assert errors, [str(f) for f in check(data).findings]


def test_a_named_placement_group_is_checked(headline: dict[str, Any]) -> None:
    """moto has no placement groups: the fake account holds the one the config names."""
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmQueues"][0]["Networking"]["PlacementGroup"] = {"Name": "hpc-train-pg"}
    report = check(data, {AMI_CHECK})
    assert "PlacementGroupNamingValidator" in report.ran
    assert report.errors == [], [str(f) for f in report.errors]
    assert any("placement group hpc-train-pg" in line for line in report.not_checked)


def test_gdr_support_gets_a_warning_naming_it(headline: dict[str, Any]) -> None:
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["Efa"]["GdrSupport"] = True
    [warning] = [f for f in check(data, {AMI_CHECK}).findings if f.level == "WARNING"]
    assert warning.path == f"{CR}.Efa.GdrSupport"
    assert "GdrSupport has had no effect since ParallelCluster 3.0.2" in warning.message
    assert warning.line is not None


def test_suppressions_take_pclusters_syntax() -> None:
    assert validate.parse_suppressions([f"type:{AMI_CHECK}", "ALL"]) == {AMI_CHECK, "ALL"}
    for bad, why in [
        (AMI_CHECK, "use ALL or type:NAME"),
        ("type:", "use ALL or type:NAME"),
        ("type:NoSuchValidator", "has no validator NoSuchValidator"),
    ]:
        with pytest.raises(validate.BadSuppression, match=why):
            validate.parse_suppressions([bad])


def _storage_index(data: dict[str, Any], storage_type: str) -> int:
    return next(i for i, s in enumerate(data["SharedStorage"]) if s["StorageType"] == storage_type)


def _set_min_count(d: dict[str, Any]) -> None:
    d["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MinCount"] = 3


def _upper_queue(d: dict[str, Any]) -> None:
    d["Scheduling"]["SlurmQueues"][0]["Name"] = "GPU"


def _efa_on(instance_type: str):
    def change(d: dict[str, Any]) -> None:
        d["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["InstanceType"] = instance_type

    return change


def _fsx(d: dict[str, Any]) -> dict[str, Any]:
    return d["SharedStorage"][_storage_index(d, "FsxLustre")]["FsxLustreSettings"]


def _bad_capacity(d: dict[str, Any]) -> None:
    _fsx(d)["StorageCapacity"] = 1000


def _import_path_and_dra(d: dict[str, Any]) -> None:
    _fsx(d)["ImportPath"] = f"s3://{VALUES['bucket']}/data"


BROKEN = {
    "min-count-above-max-count": (
        _set_min_count,
        "ComputeResourceSizeValidator",
        "Max count must be greater than or equal to min count",
        f"{CR}.{{MinCount, MaxCount}}",
    ),
    "upper-case-queue-name": (
        _upper_queue,
        "NameValidator",
        "Invalid name 'GPU'",
        "Scheduling.SlurmQueues[0].Name",
    ),
    "efa-on-c5.xlarge": (
        _efa_on("c5.xlarge"),
        "EfaValidator",
        "Instance type 'c5.xlarge' does not support EFA",
        f"{CR}.{{InstanceType, Efa.Enabled}}",
    ),
    "efa-on-t3.medium": (
        _efa_on("t3.medium"),
        "EfaValidator",
        "Instance type 't3.medium' does not support EFA",
        f"{CR}.{{InstanceType, Efa.Enabled}}",
    ),
    "fsx-capacity-1000": (
        _bad_capacity,
        "FsxStorageCapacityValidator",
        "Capacity for FSx PERSISTENT_2 file systems is 1,200 GB or increments of 2,400 GB",
        "FsxLustreSettings.{StorageCapacity,",
    ),
    "import-path-with-dra": (
        _import_path_and_dra,
        "FsxDraValidator",
        "import and export path can not be used",
        "FsxLustreSettings.{DataRepositoryAssociations[0], ImportPath}",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_broken_config_fails_with_pclusters_message_at_its_path(
    headline: dict[str, Any], case: str
) -> None:
    change, validator, message, path = BROKEN[case]
    data = copy.deepcopy(headline)
    change(data)
    report = check(data)
    errors = [f for f in report.errors if f.validator == validator]
    assert errors, [str(f) for f in report.findings]
    assert message in errors[0].message
    assert path in errors[0].path
    assert errors[0].line is not None


def test_the_fsx_error_points_into_the_lustre_entry(headline: dict[str, Any]) -> None:
    data = copy.deepcopy(headline)
    _bad_capacity(data)
    finding = next(f for f in check(data).errors if f.validator == "FsxStorageCapacityValidator")
    index = _storage_index(data, "FsxLustre")
    assert finding.path.startswith(f"SharedStorage[{index}].FsxLustreSettings.")


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            lambda d: d["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0].update(MaxCout=2),
            f"{CR}.MaxCout",
            "Unknown field.",
        ),
        (
            lambda d: d["Scheduling"]["SlurmQueues"][0].update(CapacityType="CHEAP"),
            "Scheduling.SlurmQueues[0].CapacityType",
            "Must be one of",
        ),
        (lambda d: d["HeadNode"].pop("InstanceType"), "HeadNode.InstanceType", "required"),
    ],
    ids=["unknown-key", "bad-enum", "missing-required"],
)
def test_schema_errors_carry_their_path(headline: dict[str, Any], change, path, message) -> None:
    data = copy.deepcopy(headline)
    change(data)
    report = check(data)
    assert report.validators_run == 0  # the schema stopped it before any validator
    assert [(f.validator, f.path) for f in report.errors] == [("ClusterSchema", path)]
    assert message in report.errors[0].message


def test_our_os_list_is_parallelclusters() -> None:
    from pcluster.constants import SUPPORTED_OSES

    assert set(render.SUPPORTED_OSES) == set(SUPPORTED_OSES)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("Region: [\n", "is not valid YAML"),
        ("- a\n", "top level must be a mapping"),
        ("Region: ${REGION}\n", "is a template (${REGION} unfilled): render it first"),
    ],
)
def test_unreadable_input(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(validate.UnreadableConfig) as err:
        validate.read_config(path)
    assert message in str(err.value)


def test_a_private_head_subnet_can_be_stated_and_is_listed_as_assumed(
    headline: dict[str, Any],
) -> None:
    """One subnet for the head node and the EFA queue is refused by default (the head's subnet is
    assumed to assign public IPs); --private-subnet states otherwise, and the report says so."""
    from hpc_train.cluster.fake_aws import AccountFacts, BadFact

    data = copy.deepcopy(headline)
    subnet = VALUES["head_subnet_id"]
    data["Scheduling"]["SlurmQueues"][0]["Networking"]["SubnetIds"] = [subnet]
    text = yaml.safe_dump(data, sort_keys=False)
    private = AccountFacts(private_subnets=frozenset({subnet}))
    report = validate.validate_config(text, data, suppress={AMI_CHECK}, facts=private)
    assert report.errors == []
    assert report.assumed == [f"subnet {subnet} does not assign public IPs (--private-subnet)"]
    assert not any(f"subnet {subnet} assigns" in line for line in report.not_checked)
    with pytest.raises(BadFact, match="subnet subnet-0000 is not named in the config"):
        validate.validate_config(
            text, data, facts=AccountFacts(private_subnets=frozenset({"subnet-0000"}))
        )


def test_a_custom_slurm_line_that_drops_parallelclusters_own_is_warned(
    headline: dict[str, Any],
) -> None:
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] = [
        {"SchedulerParameters": "requeue_delay=10"}
    ]
    report = check(data, {AMI_CHECK})
    [warning] = [f for f in report.findings if f.validator == "hpc-train"]
    assert warning.level == "WARNING"
    assert warning.path == "Scheduling.SlurmSettings.CustomSlurmSettings[0].SchedulerParameters"
    assert "drops nohold_on_prolog_fail" in warning.message
    assert report.slurm_kept == []


def test_a_new_cred_expire_is_no_loss_and_slurmctld_parameters_is_refused_by_pcluster(
    headline: dict[str, Any],
) -> None:
    """Key by key: ``AuthInfo: cred_expire=10`` loses nothing of ParallelCluster's
    ``cred_expire=70`` (said as the value in force); a custom SlurmctldParameters is refused by
    ParallelCluster's own validator (its deny list), and hpc-train says so without advice."""
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] += [
        {"AuthInfo": "cred_expire=10"},
        {"SlurmctldParameters": "idle_on_node_suspend"},
    ]
    report = check(data, {AMI_CHECK})
    ours = [f for f in report.findings if f.validator == "hpc-train"]
    assert [(f.level, f.path.rpartition(".")[2]) for f in ours] == [("INFO", "SlurmctldParameters")]
    assert "deny list" in ours[0].message and "Repeat it" not in ours[0].message
    assert any(
        f.level == "ERROR" and "SlurmctldParameters" in f.message
        for f in report.findings
        if f.validator != "hpc-train"
    ), [str(f) for f in report.findings]
    assert [line.partition(" in place of")[0] for line in report.slurm_replaced] == [
        "AuthInfo: cred_expire=10"
    ]


def test_a_custom_cluster_name_and_select_type_parameters_are_warned(
    headline: dict[str, Any],
) -> None:
    """The two settings ParallelCluster writes outside slurm.conf.erb's SchedulerParameters line
    that a custom setting can replace: its ClusterName, and slurm_parallelcluster.conf's
    SelectTypeParameters."""
    data = copy.deepcopy(headline)
    data["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] = [
        {"SchedulerParameters": "nohold_on_prolog_fail,requeue_delay=10"},
        {"ClusterName": "hpc"},
        {"SelectTypeParameters": "CR_Core_Memory"},
    ]
    report = check(data, {AMI_CHECK})
    warnings = {f.path: f for f in report.findings if f.validator == "hpc-train"}
    where = "Scheduling.SlurmSettings.CustomSlurmSettings"
    assert set(warnings) == {f"{where}[1].ClusterName", f"{where}[2].SelectTypeParameters"}
    assert all(w.level == "WARNING" for w in warnings.values())
    name = warnings[f"{where}[1].ClusterName"].message
    assert (
        "ClusterName=<the cluster's name> (aws-parallelcluster-cookbook v3.11.1 slurm.conf.erb:12)"
        in name
    )
    select = warnings[f"{where}[2].SelectTypeParameters"].message
    assert (
        "SelectTypeParameters=CR_CPU (aws-parallelcluster-cookbook v3.11.1 slurm_parallelcluster.conf:14)"
        in select
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.cluster", "validate", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_cli_clean_file_exits_0_and_says_aws_is_faked(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    out.write_text(rendered("p3dn.yaml"))
    proc = _cli(str(out), "--suppress-validators", f"type:{AMI_CHECK}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AWS is faked by moto inside this command" in proc.stdout
    assert "pcluster create-cluster (build-image for an image config) --dryrun true" in proc.stdout
    assert "skipped HeadNodeLaunchTemplateValidator" in proc.stdout
    assert f"suppressed {AMI_CHECK} (--suppress-validators)" in proc.stdout
    assert f"not checked offline: AMI {VALUES['p3dn_ami_id']} exists" in proc.stdout
    assert "not checked offline: s3://my-hpc-train-bucket/hpc-train/on-node-configured.sh" in (
        proc.stdout
    )
    assert "result: ok (error: 0, warning: 0" in proc.stdout


def test_cli_p3dn_without_the_suppression_exits_1_with_pclusters_reason(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    out.write_text(rendered("p3dn.yaml"))
    proc = _cli(str(out))
    assert proc.returncode == 1
    assert OPENRM_REFUSAL in proc.stdout and f"[{AMI_CHECK}]" in proc.stdout


@pytest.mark.parametrize("expr", ["InstanceTypeBaseAMICompatibleValidator", "type:Nope"])
def test_cli_bad_suppression_is_one_line_exit_2(tmp_path: Path, expr: str) -> None:
    proc = _cli(str(tmp_path / "x.yaml"), "--suppress-validators", expr)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --suppress-validators") and proc.stderr.count("\n") == 1


def test_cli_errors_exit_1_and_unreadable_exit_2(tmp_path: Path, headline: dict[str, Any]) -> None:
    bad = copy.deepcopy(headline)
    _set_min_count(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(bad, sort_keys=False))
    suppress = ["--suppress-validators", f"type:{AMI_CHECK}"]
    proc = _cli(str(broken), *suppress)
    assert proc.returncode == 1
    assert f"ERROR   {CR}.{{MinCount, MaxCount}} (line" in proc.stdout
    assert "[ComputeResourceSizeValidator]" in proc.stdout
    assert "result: FAILED (error: 1" in proc.stdout

    proc = _cli(str(broken), str(tmp_path / "missing.yaml"), *suppress)
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr and "missing.yaml" in proc.stderr
    assert "result: FAILED" in proc.stdout  # the readable file was still checked


def test_cli_without_the_aws_extra_says_how_to_install(tmp_path: Path) -> None:
    # Hide pcluster from the child process: what a user without `.[aws]` sees.
    code = (
        "import sys; sys.modules['pcluster'] = None\n"
        "from hpc_train.cluster.__main__ import main\n"
        f"sys.exit(main(['validate', {str(tmp_path / 'x.yaml')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "pip install -e '.[aws]'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_cli_a_crash_inside_pcluster_is_one_line_exit_2(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from hpc_train.cluster import __main__ as cli

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("moto does not implement\nthis call")

    monkeypatch.setattr(validate, "validate_config", crash)
    path = tmp_path / "cluster.yaml"
    path.write_text(rendered("p3dn.yaml"))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: {path} could not be checked: RuntimeError: moto does not implement this call\n"
    )


OFFICIAL_USERS = {
    "p3dn.yaml": "the head node",  # its queue boots the custom closed-driver AMI
    "p3dn-spot.yaml": "the head node",
    "p4d.yaml": "the head node, queue gpu",
    "p5.yaml": "the head node, queue gpu",
}


@pytest.mark.parametrize("name", sorted(OFFICIAL_USERS))
def test_the_official_ami_is_listed_as_not_checked(name: str) -> None:
    """The fake account holds ParallelCluster's official AMI: say so, and who boots it."""
    from pcluster.utils import get_installed_version

    text = rendered(name)
    report = validate.validate_config(
        text, yaml.safe_load(text), suppress=SUPPRESS.get(name, set())
    )
    expected = (
        f"that ParallelCluster's official AMI for {VALUES['os']} "
        f"(aws-parallelcluster-{get_installed_version()}-*) exists in {VALUES['region']} "
        f"(used by {OFFICIAL_USERS[name]})"
    )
    assert expected in report.not_checked


def test_no_official_ami_line_when_every_node_has_a_custom_ami(headline: dict[str, Any]) -> None:
    data = copy.deepcopy(headline)
    data["Image"]["CustomAmi"] = VALUES["p3dn_ami_id"]
    report = check(data, suppress={AMI_CHECK})
    assert not [line for line in report.not_checked if "official AMI" in line]


def test_cli_an_unknown_instance_type_is_one_line_exit_2_and_nothing_after(tmp_path: Path) -> None:
    """pcluster stops before awaiting its async validators: their coroutines are closed, and its
    own log of the failed call is not printed, so the one-line error is all of stderr."""
    path = tmp_path / "cluster.yaml"
    path.write_text(rendered("p3dn.yaml").replace("p3dn.24xlarge", "p3dn.99xlarge"))
    proc = _cli(str(path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {path} could not be checked: ")
    assert "p3dn.99xlarge" in proc.stderr


def test_cli_states_a_private_subnet_and_refuses_one_the_config_lacks(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(rendered("p4d.yaml"))
    subnet = VALUES["compute_subnet_id"]
    proc = _cli(str(path), "--private-subnet", subnet)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"assumed: subnet {subnet} does not assign public IPs (--private-subnet)" in proc.stdout
    assert "slurm.conf keeps ParallelCluster's own SchedulerParameters=nohold_on_prolog_fail" in (
        proc.stdout
    )
    proc = _cli(str(path), "--private-subnet", "subnet-0000")
    assert proc.returncode == 2
    assert proc.stderr == f"error: {path}: subnet subnet-0000 is not named in the config\n"
