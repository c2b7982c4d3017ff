from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_train.job import command_lines
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


def test_torchrun_uses_c10d_on_the_first_node_with_the_job_id():
    argv = command_lines.torchrun_argv("torchrun", 2, 8, "gpu-dy-p3dn-1", "4242", ["--x"])
    assert "--nnodes=2" in argv and "--nproc_per_node=8" in argv
    assert "--rdzv_backend=c10d" in argv and "--rdzv_id=4242" in argv
    assert f"--rdzv_endpoint=gpu-dy-p3dn-1:{slurm.rendezvous_port(4242)}" in argv
    assert argv[-3:] == ["-m", command_lines.TRAIN_MODULE, "--x"]


def test_an_in_job_restart_round_has_its_own_rendezvous_id_and_port():
    argv = command_lines.torchrun_argv("torchrun", 2, 8, "n1", "4242", ["--x"], round_=2)
    assert "--rdzv_id=4242.2" in argv
    assert f"--rdzv_endpoint=n1:{slurm.rendezvous_port(4242, 2)}" in argv


def test_gpu_args_use_fp16_nccl_and_the_computed_update_freq():
    spec = JobSpec(
        Training("roberta-large", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
    )  # p3dn: V100, fp16
    argv, plan = command_lines.fairseq_args(spec, world_size=16, gpu=True)
    assert argv[0] == "/d"
    assert "--fp16" in argv and arg(argv, "--distributed-backend") == "nccl"
    assert arg(argv, "--update-freq") == "4" == str(plan.update_freq)  # 2048 / (32 x 16)
    assert arg(argv, "--arch") == "roberta_large"
    assert arg(argv, "--total-num-update") == arg(argv, "--max-update") == "125000"


def test_cpu_args_fall_back_to_gloo_and_legacy_ddp():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s"), max_update=20),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
    )
    argv, _ = command_lines.fairseq_args(spec, world_size=2, gpu=False)
    assert "--cpu" in argv and "--fp16" not in argv
    assert arg(argv, "--distributed-backend") == "gloo"
    assert arg(argv, "--ddp-backend") == "legacy_ddp"
    assert arg(argv, "--max-update") == "20"
    assert arg(argv, "--warmup-updates") == "10"


def test_extra_args_come_last_so_they_override():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s"), extra_args=("--lr", "0.1")),
        sizing=Sizing(gpus_per_node=0),
    )
    argv, _ = command_lines.fairseq_args(spec, 1, gpu=False)
    assert argv[-2:] == ["--lr", "0.1"]


def test_too_small_global_batch_for_this_world_raises():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s")), sizing=Sizing(gpus_per_node=0, global_batch=8)
    )
    with pytest.raises(ValueError):
        command_lines.fairseq_args(spec, world_size=4, gpu=False)
