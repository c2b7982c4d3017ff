import pytest

from hpc_core import instances
from hpc_train import environment


def test_p3dn_has_efa_but_never_device_rdma():
    env = instances.efa_nccl_env("p3dn.24xlarge")
    assert env["FI_PROVIDER"].value == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env  # p3dn has no RDMA read: setting it aborts


def test_p4d_and_p5_enable_gpudirect_rdma():
    for name in ("p4d.24xlarge", "p5.48xlarge"):
        assert instances.efa_nccl_env(name)["FI_EFA_USE_DEVICE_RDMA"].value == "1"


def test_never_sets_variables_current_guidance_forbids():
    for name in instances.INSTANCE_TYPES:
        env = instances.efa_nccl_env(name)
        assert "RDMAV_FORK_SAFE" not in env and "NCCL_PROTO" not in env


def test_cpu_ranks_pin_one_thread_and_every_setting_is_explained():
    assert instances.plain(instances.cpu_env()) == {"OMP_NUM_THREADS": "1"}
    for line in instances.shell_lines(instances.efa_nccl_env("p3dn.24xlarge")):
        assert line.startswith("export ") and "  # " in line


def test_table_knows_gpu_memory_and_the_default_type():
    assert instances.instance_type(instances.DEFAULT_INSTANCE_TYPE).gpu_model == "V100"
    assert instances.instance_type("p4d.24xlarge").gpu_memory_gib == 40
    assert instances.instance_type("p4de.24xlarge").gpu_memory_gib == 80


def test_cli_prints_exports_and_rejects_unknown_type(capsys):
    assert environment.main(["--instance-type", "p5.48xlarge"]) == 0
    assert "export FI_EFA_USE_DEVICE_RDMA=1" in capsys.readouterr().out
    assert environment.main(["--instance-type", "p9.huge"]) == 2
    assert "unknown instance type" in capsys.readouterr().err


# The version rules: aws-ofi-nccl's doc/efa-env-var.md ("Sample Presets"), one test per branch.
NEW = {"libfabric": "1.22.0amzn4.0", "aws-ofi-nccl": "1.13.2-aws"}


def test_new_software_sets_neither_provider_nor_device_rdma():
    for name in ("p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge"):
        env = instances.efa_nccl_env(name, versions=NEW)
        assert set(env) == {"FI_EFA_USE_HUGE_PAGE", "NCCL_DEBUG"}, name


def test_device_rdma_only_from_libfabric_1_18_and_aws_ofi_nccl_1_7_together():
    def rdma(fabric: str, plugin: str) -> bool:
        versions = {"libfabric": fabric, "aws-ofi-nccl": plugin}
        return "FI_EFA_USE_DEVICE_RDMA" in instances.efa_nccl_env("p4d.24xlarge", versions=versions)

    assert not rdma("1.18.0", "1.7.0")
    assert rdma("1.17.9", "1.7.0")  # old libfabric
    assert rdma("1.18.0", "1.6.1")  # old plugin
    env = instances.efa_nccl_env(
        "p4d.24xlarge", versions={"libfabric": "1.17.1", "aws-ofi-nccl": "1.6.0"}
    )
    assert env["FI_EFA_USE_DEVICE_RDMA"].value == "1"
    assert "libfabric 1.17.1, aws-ofi-nccl 1.6.0" in env["FI_EFA_USE_DEVICE_RDMA"].why
    # never on p3dn, whatever the versions: its EFA has no RDMA read
    for versions in (None, {"libfabric": "1.17.0", "aws-ofi-nccl": "1.5.0"}):
        assert "FI_EFA_USE_DEVICE_RDMA" not in instances.efa_nccl_env(
            "p3dn.24xlarge", versions=versions
        )


def test_provider_and_simple_protocol_only_for_aws_ofi_nccl_up_to_1_5():
    old = instances.efa_nccl_env(
        "p3dn.24xlarge", versions={"libfabric": "1.16.0", "aws-ofi-nccl": "1.5.3"}
    )
    assert old["FI_PROVIDER"].value == "efa" and old["NCCL_PROTO"].value == "simple"
    assert "aws-ofi-nccl 1.5.3 (<= 1.5)" in old["FI_PROVIDER"].why
    six = instances.efa_nccl_env("p3dn.24xlarge", versions={"aws-ofi-nccl": "1.6.0"})
    assert "FI_PROVIDER" not in six and "NCCL_PROTO" not in six


def test_unknown_versions_are_named_unknown_where_they_decide():
    env = instances.efa_nccl_env("p5.48xlarge")  # nothing recorded
    assert env["FI_PROVIDER"].why.startswith("aws-ofi-nccl version unknown: ")
    rdma = env["FI_EFA_USE_DEVICE_RDMA"].why
    assert "libfabric version unknown" in rdma and "aws-ofi-nccl version unknown" in rdma
    assert "NCCL_PROTO" not in env  # costs bandwidth on a newer plugin: never guessed
    half = instances.efa_nccl_env("p5.48xlarge", versions={"aws-ofi-nccl": "1.9.0"})
    assert "FI_PROVIDER" not in half
    assert "(libfabric version unknown; " in half["FI_EFA_USE_DEVICE_RDMA"].why  # only that one
    for versions in (None, NEW, {"aws-ofi-nccl": "1.4.0"}):
        for line in instances.shell_lines(instances.efa_nccl_env("p5.48xlarge", versions=versions)):
            assert line.startswith("export ") and "  # " in line and "\n" not in line


def test_versions_file_is_name_equals_version_lines():
    text = "# found by nccl-profile.sh\n\nlibfabric=1.22.0amzn4.0\naws-ofi-nccl = 1.13.2-aws\n"
    assert instances.read_versions(text) == {
        "libfabric": "1.22.0amzn4.0",
        "aws-ofi-nccl": "1.13.2-aws",
    }
    assert instances.parse_version("1.22.0amzn4.0") == (1, 22, 0)
    assert instances.parse_version("1.7") == (1, 7, 0)
    assert instances.parse_version("unknown") is None
    for bad in ("libfabric 1.22.0\n", "libfabric=\n", "=1.2.3\n", "libfabric=latest\n"):
        with pytest.raises(ValueError, match="line 1"):
            instances.read_versions(bad)


def test_cli_reads_a_versions_file(tmp_path, capsys):
    versions = tmp_path / "efa-versions"
    versions.write_text("libfabric=1.22.0\naws-ofi-nccl=1.13.2\n")
    assert environment.main(["--instance-type", "p5.48xlarge", "--versions", str(versions)]) == 0
    out = capsys.readouterr().out
    assert "FI_EFA_USE_DEVICE_RDMA" not in out and "FI_PROVIDER" not in out
    assert "export FI_EFA_USE_HUGE_PAGE=0" in out
    versions.write_text("libfabric: 1.22.0\n")
    assert environment.main(["--instance-type", "p5.48xlarge", "--versions", str(versions)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not name=X.Y.Z" in err
    missing = tmp_path / "absent"
    assert environment.main(["--instance-type", "p5.48xlarge", "--versions", str(missing)]) == 2
    assert "No such file" in capsys.readouterr().err


# Jobs follow the node's recorded versions (issue 17): the submit host cannot know them.
NEW_VERSIONS = (
    "# found by bootstrap/nccl-profile.sh\nlibfabric=1.22.0amzn4.0\naws-ofi-nccl=1.13.2-aws\n"
)
EFA_NAMES = (
    "FI_PROVIDER",
    "NCCL_PROTO",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_USE_HUGE_PAGE",
    "NCCL_DEBUG",
)


def test_node_versions_reads_the_recorded_file(tmp_path, monkeypatch):
    versions = tmp_path / "efa-versions"
    monkeypatch.setenv(instances.NODE_VERSIONS_ENV, str(versions))
    assert instances.node_versions() is None  # no file: unknown, the caller says so
    versions.write_text(NEW_VERSIONS)
    assert instances.node_versions() == {"libfabric": "1.22.0amzn4.0", "aws-ofi-nccl": "1.13.2-aws"}
    versions.write_text("libfabric: 1.22\n")
    with pytest.raises(ValueError, match=f"{versions}: line 1"):
        instances.node_versions()


def test_the_node_paths_are_the_bootstraps_defaults():
    """nccl-profile.sh writes where jobs read: one pair of paths, checked against the script."""
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "bootstrap" / "nccl-profile.sh").read_text()
    assert f'versions="${{BOOTSTRAP_VERSIONS_FILE:-{instances.NODE_VERSIONS_FILE}}}"' in script
    profile_dir, _, name = instances.NODE_PROFILE.rpartition("/")
    assert f'profile="${{BOOTSTRAP_PROFILE_DIR:-{profile_dir}}}/{name}"' in script


def _job_env(lines, profile) -> dict:
    """Run job-script lines in bash (the submit host's EFA variables cleared) and read them back."""
    import os
    import subprocess

    script = "\n".join([*lines, *(f'echo "{k}=${{{k}-<unset>}}"' for k in EFA_NAMES)])
    env = {k: v for k, v in os.environ.items() if k not in EFA_NAMES}
    env[instances.NODE_PROFILE_ENV] = str(profile)
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, check=True
    )
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


@pytest.mark.parametrize("name", ["p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge"])
def test_the_job_takes_the_nodes_profile_not_the_unknown_set(tmp_path, capsys, name):
    """The profile the bootstrap writes (hpc_train.environment --versions) is what the job gets:
    with aws-ofi-nccl 1.13 and libfabric 1.22 no FI_PROVIDER and no FI_EFA_USE_DEVICE_RDMA."""
    versions, profile = tmp_path / "efa-versions", tmp_path / "hpc-train-nccl.sh"
    versions.write_text(NEW_VERSIONS)
    assert environment.main(["--instance-type", name, "--versions", str(versions)]) == 0
    profile.write_text(capsys.readouterr().out)  # as nccl-profile.sh writes it
    got = _job_env(instances.node_env_lines(name), profile)
    node = instances.plain(
        instances.efa_nccl_env(name, versions=instances.read_versions(NEW_VERSIONS))
    )
    assert got == {k: node.get(k, "<unset>") for k in EFA_NAMES}
    assert got["FI_PROVIDER"] == "<unset>" and got["FI_EFA_USE_DEVICE_RDMA"] == "<unset>"


@pytest.mark.parametrize("name", ["p3dn.24xlarge", "p4d.24xlarge"])
def test_without_a_node_profile_the_job_says_the_versions_are_unknown(tmp_path, name):
    lines = instances.node_env_lines(name)
    got = _job_env(lines, tmp_path / "absent")
    unknown = instances.plain(instances.efa_nccl_env(name))
    assert got == {k: unknown.get(k, "<unset>") for k in EFA_NAMES}
    assert got["FI_PROVIDER"] == "efa"
    assert any("aws-ofi-nccl version unknown" in line for line in lines)
