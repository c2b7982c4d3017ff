from hpc_train import environment


def test_p3dn_has_efa_but_never_device_rdma():
    env = environment.efa_nccl_env("p3dn.24xlarge")
    assert env["FI_PROVIDER"].value == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env  # p3dn has no RDMA read: setting it aborts


def test_p4d_and_p5_enable_gpudirect_rdma():
    for name in ("p4d.24xlarge", "p5.48xlarge"):
        assert environment.efa_nccl_env(name)["FI_EFA_USE_DEVICE_RDMA"].value == "1"


def test_never_sets_variables_current_guidance_forbids():
    for name in environment.INSTANCE_TYPES:
        env = environment.efa_nccl_env(name)
        assert "RDMAV_FORK_SAFE" not in env and "NCCL_PROTO" not in env


def test_cpu_fallback_pins_one_thread_and_every_setting_is_explained():
    env = environment.rank_env("p3dn.24xlarge", has_gpu=False)
    assert environment.plain(env) == {"OMP_NUM_THREADS": "1"}
    for line in environment.shell_lines(environment.efa_nccl_env("p3dn.24xlarge")):
        assert line.startswith("export ") and "  # " in line


def test_cli_prints_exports_and_rejects_unknown_type(capsys):
    assert environment.main(["--instance-type", "p5.48xlarge"]) == 0
    assert "export FI_EFA_USE_DEVICE_RDMA=1" in capsys.readouterr().out
    assert environment.main(["--instance-type", "p9.huge"]) == 2
    assert "unknown instance type" in capsys.readouterr().err
