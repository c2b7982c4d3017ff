"""pcluster_configs/images/p3dn-closed-driver.yaml: the `pcluster build-image` config of the p3dn AMI.

Loaded through ParallelCluster's own ImageBuilderSchema, and its node attributes computed by
ParallelCluster's own ImageBuilderExtraChefAttributes: what the cookbook receives at build time.
No AWS call is made (a region is set because pcluster reads one).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hpc_train.cluster import render

REPO = Path(__file__).resolve().parents[3]
IMAGE = REPO / "pcluster_configs" / "images" / "p3dn-closed-driver.yaml"
VALUES = yaml.safe_load((REPO / "pcluster_configs" / "examples" / "values.yaml").read_text())


def test_image_template_uses_only_region_and_parent_ami() -> None:
    assert render.placeholders_in(IMAGE.read_text()) == ["REGION", "PARENT_AMI_ID"]


# What the 3.16 cookbook's NVIDIA recipes read from the node attributes, and in what form
# (aws-parallelcluster-cookbook PR #3207, cookbooks/aws-parallelcluster-platform/, read at commit
# 2db84479; docs/on-aws.md, "The p3dn image", cites each line):
#   resources/nvidia_driver/partial/_nvidia_driver_common.rb:18,87-89  driver_version, kernel_open
#   resources/nvidia_repo/partial/_nvidia_repo_common.rb:25-26         driver_version, cuda.version
#   resources/nvidia_repo/partial/_nvidia_repo_debian.rb               cuda.driver_version_suffix
#   attributes/platform.rb:27-44                                       enabled and the defaults
DRIVER = r"[1-9]\d{2}\.\d{1,3}\.\d{2}"  # 580.173.02: verbatim in a file and a package name
RECIPE_READS = {
    "enabled": r"yes",
    "kernel_open": r"false|no",  # _nvidia_driver_common.rb:88: ['false', 'no', false] -> closed
    "driver_version": DRIVER,
    "cuda.version": r"\d+\.\d+\.\d+",  # cuda_version_dash: "13.0.2" -> "13-0"
    "cuda.driver_version_suffix": DRIVER,
}


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(leaves(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def recipe_files(nvidia: dict, platform: str = "ubuntu2204", arch: str = "amd64") -> list[str]:
    """The two debs the recipe downloads (_nvidia_repo_common.rb:98-129, _nvidia_repo_debian.rb)."""
    driver, cuda = nvidia["driver_version"], nvidia["cuda"]
    dash = "-".join(cuda["version"].split(".")[:2])
    return [
        f"nvidia_driver/nvidia-driver-local-repo-{platform}-{driver}_1.0-1_{arch}.deb",
        f"cuda/cuda-repo-{platform}-{dash}-local_{cuda['version']}"
        f"-{cuda['driver_version_suffix']}-1_{arch}.deb",
    ]


def cookbook_nvidia(monkeypatch: pytest.MonkeyPatch) -> tuple[object, dict]:
    """The config as pcluster loads it, and cluster.nvidia as pcluster hands it to the cookbook."""
    pytest.importorskip("pcluster.schemas.imagebuilder_schema", reason="needs the aws extra")
    from pcluster.config.imagebuilder_config import ImageBuilderExtraChefAttributes
    from pcluster.schemas.imagebuilder_schema import ImageBuilderSchema

    monkeypatch.setenv("AWS_DEFAULT_REGION", VALUES["region"])
    config = ImageBuilderSchema().load(
        yaml.safe_load(render.render_text(IMAGE.read_text(), VALUES))
    )
    chef = json.loads(ImageBuilderExtraChefAttributes(config).dump_json())
    return config, chef["cluster"]["nvidia"]


@pytest.mark.aws
def test_pcluster_loads_it_and_the_cookbook_gets_the_closed_volta_driver(monkeypatch) -> None:
    config, nvidia = cookbook_nvidia(monkeypatch)
    assert config.build.parent_image == VALUES["parent_ami_id"]  # type: ignore[attr-defined]
    assert config.build.installation.nvidia_software.enabled is True  # type: ignore[attr-defined]
    assert nvidia["kernel_open"] in ("false", "no")  # `cuda-drivers`, not `nvidia-open`
    branch = int(nvidia["driver_version"].split(".")[0])
    assert branch <= 580  # R580 is NVIDIA's last driver branch for Volta
    # a CUDA 13 local repo needs an R580 driver or newer (its driver_version_suffix says which)
    cuda_major = int(nvidia["cuda"]["version"].split(".")[0])
    suffix_branch = int(nvidia["cuda"]["driver_version_suffix"].split(".")[0])
    assert cuda_major < 13 or branch >= 580
    assert suffix_branch <= branch  # the toolkit's repo never asks for a newer driver than pinned
    # the fake account describes the custom AMI with the driver this config pins
    from hpc_train.cluster.fake_aws import CUSTOM_NVIDIA

    assert nvidia["driver_version"] == CUSTOM_NVIDIA


@pytest.mark.aws
def test_every_nvidia_attribute_we_set_is_one_the_316_recipe_reads_in_its_format(
    monkeypatch,
) -> None:
    """No `.run`-era attribute (driver_url, cuda_url), no typo the cookbook would ignore."""
    _, nvidia = cookbook_nvidia(monkeypatch)
    ours = leaves(
        json.loads(
            yaml.safe_load(IMAGE.read_text())["DevSettings"]["Cookbook"]["ExtraChefAttributes"]
        )["cluster"]["nvidia"]
    )
    assert set(ours) <= set(RECIPE_READS), set(ours) - set(RECIPE_READS)
    got = leaves(nvidia)
    for name, pattern in RECIPE_READS.items():
        assert name in got, f"cluster.nvidia.{name} not set: the 3.16 default (R595) has no Volta"
        assert re.fullmatch(pattern, str(got[name])), (name, got[name], pattern)


@pytest.mark.aws
def test_the_docs_check_the_files_the_recipe_downloads(monkeypatch) -> None:
    """docs/on-aws.md's `curl -sI` lines name exactly the debs the recipe fetches for this config."""
    _, nvidia = cookbook_nvidia(monkeypatch)
    doc = (REPO / "docs" / "on-aws.md").read_text()
    checked = re.findall(r"curl -sI \"\$BASE/([^\"]+)\"", doc)
    assert checked == recipe_files(nvidia)
    assert ".run" not in " ".join(checked)


@pytest.mark.aws
def test_the_image_config_passes_pclusters_build_image_validators() -> None:
    """AWS faked (moto): the parent image exists as a plain OS AMI, listed as not checked offline."""
    pytest.importorskip("pcluster.schemas.imagebuilder_schema", reason="needs the aws extra")
    from hpc_train.cluster import validate

    text = render.render_text(IMAGE.read_text(), VALUES)
    report = validate.validate_config(text, yaml.safe_load(text))
    assert report.validators_run >= 5
    assert "InstanceTypeBaseAMICompatibleValidator" in report.ran  # build instance vs parent AMI
    assert [str(f) for f in report.findings if f.level != "INFO"] == []
    assert any(VALUES["parent_ami_id"] in line for line in report.not_checked)


@pytest.mark.aws
def test_an_image_config_with_a_bad_key_is_refused_by_pclusters_schema() -> None:
    pytest.importorskip("pcluster.schemas.imagebuilder_schema", reason="needs the aws extra")
    from hpc_train.cluster import validate

    data = yaml.safe_load(render.render_text(IMAGE.read_text(), VALUES))
    data["Build"]["Installation"]["NvidiaDriver"] = {"Enabled": True}
    text = yaml.safe_dump(data, sort_keys=False)
    report = validate.validate_config(text, yaml.safe_load(text))
    assert [(f.validator, f.path) for f in report.errors] == [
        ("ImageBuilderSchema", "Build.Installation.NvidiaDriver")
    ]
