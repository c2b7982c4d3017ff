"""render: value checks, placeholder filling, atomic writes and the `render` CLI (no AWS involved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpc_train.cluster import __main__ as cli
from hpc_train.cluster import render

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "pcluster_configs"
EXAMPLE_VALUES = CONFIGS / "examples" / "values.yaml"
TEMPLATES = sorted(CONFIGS.glob("*.yaml"))
GOOD = yaml.safe_load(EXAMPLE_VALUES.read_text())


COMMON = {
    "REGION",
    "OS",
    "HEAD_SUBNET_ID",
    "COMPUTE_SUBNET_ID",
    "ALLOWED_IPS",
    "KEY_NAME",
    "BUCKET",
    "SOURCE_SHA256",
    "UPDATE_SHA16",
    "UPDATE_SHA256",
}
EXTRA = {
    "p3dn.yaml": {"P3DN_AMI_ID"},
    "p3dn-spot.yaml": {"P3DN_AMI_ID"},
    "p4d.yaml": set(),
    "p5.yaml": set(),
    "p5-odcr.yaml": {"CAPACITY_RESERVATION_ID"},
    "p5-capacity-block.yaml": {"CAPACITY_RESERVATION_ID"},
}


def test_the_templates_use_only_known_placeholders() -> None:
    assert sorted(t.name for t in TEMPLATES) == sorted(EXTRA)
    for template in TEMPLATES:
        used = render.placeholders_in(template.read_text())
        assert set(used) == COMMON | EXTRA[template.name], template.name
        assert set(used) <= set(render.BY_NAME) | set(render.DERIVED)


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (render.check_region, "us-east-1"),
        (render.check_region, "ap-southeast-2"),
        (render.check_region, "us-gov-west-1"),
        (render.check_os, "ubuntu2404"),
        (render.check_subnet_id, "subnet-0123456789abcdef0"),
        (render.check_subnet_id, "subnet-12345678"),
        (render.check_key_name, "hpc-train_key.2"),
        (render.check_bucket, "my-hpc-train-bucket"),
        (render.check_bucket, "a.b-c"),
        (render.check_sha256, "ab" * 32),
        (render.check_allowed_ips, "203.0.113.7/32"),
        (render.check_allowed_ips, "10.0.0.0/8"),  # the widest allowed
        (render.check_allowed_ips, "198.51.100.0/24"),
        (render.check_ami_id, "ami-0123456789abcdef0"),
        (render.check_capacity_reservation_id, "cr-0123456789abcdef0"),
    ],
)
def test_good_values_pass(check, value: str) -> None:
    assert check(value) is None


@pytest.mark.parametrize(
    ("check", "value", "reason"),
    [
        (render.check_region, "us-east", "not an AWS region"),
        (render.check_region, "US-EAST-1", "not an AWS region"),
        (render.check_region, "moon-base-1", "not an AWS region"),
        (render.check_os, "alinux2", "not an OS ParallelCluster 3.16 supports"),
        (render.check_subnet_id, "sub-0123456789abcdef0", "subnet-"),
        (render.check_subnet_id, "subnet-0123456789ABCDEF0", "lower-case hex"),
        (render.check_subnet_id, "subnet-123", "8 or 17"),
        (render.check_key_name, "", "empty"),
        (render.check_key_name, "my key", "letters, digits"),
        (render.check_bucket, "My-Bucket", "lower case"),
        (render.check_bucket, "s3://my-bucket", "without s3://"),
        (render.check_bucket, "ab", "3 to 63"),
        (render.check_bucket, "a" * 64, "3 to 63"),
        (render.check_bucket, "my_bucket", "lower-case letters, digits"),
        (render.check_bucket, "-bucket", "starting and ending"),
        (render.check_bucket, "my..bucket", "'..'"),
        (render.check_bucket, "192.168.5.4", "IP address"),
        (render.check_bucket, "xn--bucket", "reserved"),
        (render.check_bucket, "bucket-s3alias", "reserved"),
        (render.check_sha256, "abc", "64 lower-case hex"),
        (render.check_allowed_ips, "0.0.0.0/0", "whole internet"),
        (render.check_allowed_ips, "::/0", "whole internet"),
        (render.check_allowed_ips, "203.0.113.7", "CIDR block"),
        (render.check_allowed_ips, "203.0.113.7/24", "CIDR block"),
        (render.check_allowed_ips, "2001:db8::/32", "IPv4"),
        # half the internet, a quarter, ...: wider than any one network's block (/8, IPv6 /32)
        (
            render.check_allowed_ips,
            "0.0.0.0/1",
            "a large part of the internet (a /1, wider than /8",
        ),
        (render.check_allowed_ips, "128.0.0.0/1", "a /1, wider than /8"),
        (render.check_allowed_ips, "64.0.0.0/2", "a /2, wider than /8"),
        (render.check_allowed_ips, "11.0.0.0/7", "CIDR block"),  # host bits set
        (render.check_allowed_ips, "8.0.0.0/7", "a /7, wider than /8"),
        (render.check_allowed_ips, "::/1", "a /1, wider than /32"),
        (render.check_allowed_ips, "2001:db8::/31", "a /31, wider than /32"),
        (render.check_ami_id, "ami-XYZ", "ami-"),
        (render.check_capacity_reservation_id, "cr-1", "cr-"),
    ],
)
def test_bad_values_say_why(check, value: str, reason: str) -> None:
    problem = check(value)
    assert problem is not None and reason in problem


def test_render_fills_every_placeholder_outside_comments() -> None:
    template = (CONFIGS / "p3dn.yaml").read_text()
    text = render.render_text(template, GOOD)
    data = yaml.safe_load(text)
    assert data["Region"] == "us-east-1"
    assert data["HeadNode"]["Networking"]["SubnetId"] == GOOD["head_subnet_id"]
    assert data["HeadNode"]["Ssh"]["AllowedIps"] == GOOD["allowed_ips"]
    assert data["HeadNode"]["Ssh"]["KeyName"] == "hpc-train"
    queue = data["Scheduling"]["SlurmQueues"][0]
    assert queue["CustomActions"]["OnNodeConfigured"]["Script"] == (
        "s3://my-hpc-train-bucket/hpc-train/on-node-configured.sh"
    )
    assert GOOD["source_sha256"] in data["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"]
    updated = data["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"]
    # at creation OnNodeUpdated names the same tarball, by its sha-named copy
    sha16 = GOOD["source_sha256"][:16]
    assert updated[3] == f"s3://my-hpc-train-bucket/hpc-train/hpc-train-src-{sha16}.tar.gz"
    assert updated[5] == GOOD["source_sha256"]
    code_lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("${" in line for line in code_lines)
    # the header comment still documents the placeholders
    assert "${NAME} placeholders" in text


def test_placeholders_in_comments_are_neither_required_nor_filled() -> None:
    template = "# ${NOT_A_VALUE} stays\nRegion: ${REGION}\n"
    assert render.placeholders_in(template) == ["REGION"]
    assert render.render_text(template, {"region": "eu-west-1"}) == (
        "# ${NOT_A_VALUE} stays\nRegion: eu-west-1\n"
    )


def test_only_the_placeholders_a_template_uses_are_required() -> None:
    assert render.render_text("Region: ${REGION}\n", {"region": "eu-west-1"}) == (
        "Region: eu-west-1\n"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**GOOD, "head_subnet_id": "sub-1"}, "head_subnet_id 'sub-1': must be 'subnet-'"),
        ({**GOOD, "subnet_id": "subnet-12345678"}, "'subnet_id' is gone: give head_subnet_id"),
        ({**GOOD, "allowed_ips": "0.0.0.0/0"}, "allowed_ips '0.0.0.0/0': opens ssh to the whole"),
        (
            {k: v for k, v in GOOD.items() if k != "allowed_ips"},
            "allowed_ips: missing (give --allowed-ips",
        ),
        ({**GOOD, "update_sha256": "abc"}, "update_sha256 'abc': must be 64"),
        ({**GOOD, "bucket": "My-Bucket"}, "bucket 'My-Bucket': bucket names are lower case"),
        ({**GOOD, "region": "mars-1"}, "region 'mars-1': not an AWS region"),
        ({**GOOD, "key_name": ""}, "key_name '': empty"),
        ({k: v for k, v in GOOD.items() if k != "bucket"}, "bucket: missing (give --bucket"),
        ({**GOOD, "subnetid": "subnet-12345678"}, "unknown value 'subnetid'"),
        ({**GOOD, "source_sha256": 12345}, "source_sha256: must be a string, got int"),
    ],
)
def test_check_values_names_the_culprit(values: dict, message: str) -> None:
    with pytest.raises(render.RenderError) as err:
        render.render_text((CONFIGS / "p3dn.yaml").read_text(), values)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_placeholder_in_template_is_an_error() -> None:
    with pytest.raises(render.RenderError, match=r"unknown placeholder \$\{SUBNET\}"):
        render.render_text("SubnetId: ${SUBNET}\n", GOOD)


def test_result_must_be_yaml() -> None:
    with pytest.raises(render.RenderError, match="not valid YAML"):
        render.render_text("Region: [${REGION}\n", GOOD)


def test_cli_render_writes_config_from_values_and_flags(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cluster.yaml"
    argv = ["render", str(CONFIGS / "p4d.yaml"), "--values", str(EXAMPLE_VALUES), "-o", str(out)]
    assert cli.main([*argv, "--region", "eu-west-1"]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["Region"] == "eu-west-1"  # the flag wins over the values file
    assert data["Image"]["Os"] == GOOD["os"]
    assert f"wrote {out}" in capsys.readouterr().out


def test_cli_render_with_flags_only(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in GOOD.items()]
    assert cli.main(["render", str(CONFIGS / "p5.yaml"), "-o", str(out), *flags]) == 0
    assert yaml.safe_load(out.read_text())["HeadNode"]["Ssh"]["KeyName"] == GOOD["key_name"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--compute-subnet-id", "subnet-XYZ"],
            "error: compute_subnet_id 'subnet-XYZ': must be 'subnet-'",
        ),
        (["--allowed-ips", "0.0.0.0/0"], "error: allowed_ips '0.0.0.0/0': opens ssh"),
        (["--allowed-ips", "0.0.0.0/1"], "error: allowed_ips '0.0.0.0/1': opens ssh to a large"),
        (["--bucket", "Upper"], "error: bucket 'Upper': bucket names are lower case"),
        (["--region", "useast1"], "error: region 'useast1': not an AWS region"),
        (["--key-name", ""], "error: key_name '': empty"),
        (["--os", "windows"], "error: os 'windows': not an OS ParallelCluster"),
    ],
)
def test_cli_render_bad_value_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    out = tmp_path / "cluster.yaml"
    argv = ["render", str(CONFIGS / "p3dn.yaml"), "--values", str(EXAMPLE_VALUES), "-o", str(out)]
    assert cli.main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("values_text", "message"),
    [
        ("region: [\n", "is not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("subnet: subnet-12345678\n", "unknown value 'subnet'"),
    ],
)
def test_cli_render_bad_values_file(tmp_path: Path, capsys, values_text: str, message: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(values_text)
    argv = ["render", str(CONFIGS / "p3dn.yaml"), "--values", str(values), "-o", "x.yaml"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_render_missing_template_exit_2(tmp_path: Path, capsys) -> None:
    assert cli.main(["render", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "o.yaml")]) == 2
    assert "cannot read template" in capsys.readouterr().err


def _help(*args: str) -> str:
    cmd = [sys.executable, "-m", "hpc_train.cluster", *args, "--help"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True).stdout


def test_cli_help_explains_placeholders_and_exit_codes() -> None:
    text = " ".join(_help("render").split())  # argparse wraps at the terminal's width
    for word in ("${HEAD_SUBNET_ID}", "--values", "--compute-subnet-id", "exit 2", "rename"):
        assert word in text
    assert "moto" in _help("validate") and "exit" in _help("validate")
    top = _help()
    assert "render" in top and "validate" in top
