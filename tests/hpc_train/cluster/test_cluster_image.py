"""pcluster_configs/images/p3dn-closed-driver.yaml: the `pcluster build-image` config of the p3dn AMI.

Loaded through ParallelCluster's own ImageBuilderSchema, and its node attributes computed by
ParallelCluster's own ImageBuilderExtraChefAttributes: what the cookbook receives at build time.
No AWS call is made (a region is set because pcluster reads one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpc_train.cluster import render

REPO = Path(__file__).resolve().parents[3]
IMAGE = REPO / "pcluster_configs" / "images" / "p3dn-closed-driver.yaml"
VALUES = yaml.safe_load((REPO / "pcluster_configs" / "examples" / "values.yaml").read_text())


def test_image_template_uses_only_region_and_parent_ami() -> None:
    assert render.placeholders_in(IMAGE.read_text()) == ["REGION", "PARENT_AMI_ID"]


@pytest.mark.aws
def test_pcluster_loads_it_and_the_cookbook_gets_the_closed_volta_driver(monkeypatch) -> None:
    pytest.importorskip("pcluster.schemas.imagebuilder_schema", reason="needs the aws extra")
    from pcluster.config.imagebuilder_config import ImageBuilderExtraChefAttributes
    from pcluster.schemas.imagebuilder_schema import ImageBuilderSchema

    monkeypatch.setenv("AWS_DEFAULT_REGION", VALUES["region"])
    config = ImageBuilderSchema().load(
        yaml.safe_load(render.render_text(IMAGE.read_text(), VALUES))
    )
    assert config.build.parent_image == VALUES["parent_ami_id"]
    assert config.build.installation.nvidia_software.enabled is True
    nvidia = json.loads(ImageBuilderExtraChefAttributes(config).dump_json())["cluster"]["nvidia"]
    # cookbook _nvidia_driver_common.rb: kernel_open false -> `nvidia.run -m=kernel` (closed module)
    assert nvidia["kernel_open"] == "false"
    assert nvidia["enabled"] == "yes"
    branch = int(nvidia["driver_version"].split(".")[0])
    assert branch <= 580  # R580 is NVIDIA's last driver branch for Volta
    # the fake account describes the custom AMI with the driver this config pins
    from hpc_train.cluster.fake_aws import CUSTOM_NVIDIA

    assert nvidia["driver_version"] == CUSTOM_NVIDIA
    # CUDA is not pinned (docs/on-aws.md says why: the 3.16.1 cookbook's default and the artifact
    # bucket's installers are unconfirmed); a pin, if ever added, must be a CUDA 12 (sm_70, R570)
    cuda = nvidia.get("cuda", {}).get("version")
    assert cuda is None or cuda.startswith("12.")


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
