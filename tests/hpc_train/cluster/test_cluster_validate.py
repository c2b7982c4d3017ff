"""validate: ParallelCluster's real schema and validators on our configs, AWS faked by moto.

Every shipped template, rendered with the example values, must come out clean; deliberately broken
copies must fail with ParallelCluster's own message at the right YAML path.
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


def rendered(name: str) -> str:
    return render.render_text((CONFIGS / name).read_text(), VALUES)


def check(data: dict[str, Any]) -> validate.Report:
    text = yaml.safe_dump(data, sort_keys=False)
    return validate.validate_config(text, yaml.safe_load(text))


@pytest.fixture(scope="module")
def headline() -> dict[str, Any]:
    return yaml.safe_load(rendered("p3dn.yaml"))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_every_template_renders_and_validates_clean(template: Path) -> None:
    text = rendered(template.name)
    report = validate.validate_config(text, yaml.safe_load(text))
    assert report.validators_run > 80  # the validators really ran, not just the schema
    assert [str(f) for f in report.findings if f.level != "INFO"] == []
    assert report.refused == []  # no network attempt got as far as the guard
    assert set(report.skipped) == {
        "HeadNodeLaunchTemplateValidator",
        "ComputeResourceLaunchTemplateValidator",
    }


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
    proc = _cli(str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AWS is faked by moto inside this command" in proc.stdout
    assert "skipped HeadNodeLaunchTemplateValidator" in proc.stdout
    assert "result: ok (error: 0, warning: 0" in proc.stdout


def test_cli_errors_exit_1_and_unreadable_exit_2(tmp_path: Path, headline: dict[str, Any]) -> None:
    bad = copy.deepcopy(headline)
    _set_min_count(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(bad, sort_keys=False))
    proc = _cli(str(broken))
    assert proc.returncode == 1
    assert f"ERROR   {CR}.{{MinCount, MaxCount}} (line" in proc.stdout
    assert "[ComputeResourceSizeValidator]" in proc.stdout
    assert "result: FAILED (error: 1" in proc.stdout

    proc = _cli(str(broken), str(tmp_path / "missing.yaml"))
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
