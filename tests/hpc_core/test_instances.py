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
