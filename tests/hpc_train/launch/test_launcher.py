import dataclasses
from pathlib import Path

import pytest

from hpc_train.contract import StartFiles
from hpc_train.job import command_lines
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training


def decided(tmp_path, spec: JobSpec, gpus: list[int]):
    """Task 0's decision for a start on len(gpus) nodes, the other nodes' reports written first;
    then what task 1 reads back (the same value, never recomputed)."""
    from hpc_core.rundir import RunDir
    from hpc_train.contract import NodeReport, write_node_report
    from hpc_train.launch import starts

    # the node check reads this machine's NVML, whose GPUs are no p3dn's (test_geometry has it)
    spec = dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm, node_check="off"))
    run = RunDir(tmp_path)
    for task, n in enumerate(gpus[1:], start=1):
        write_node_report(run, "5", 0, NodeReport(task, f"n{task + 1}", n))
    start = starts.Start("5", 0, len(gpus), "n1", 0, tuple(f"n{i + 1}" for i in range(len(gpus))))
    decision = starts.decide_start(run, start, spec, gpus[0], lambda _: None)
    other = starts.Start("5", 1, len(gpus), "n1", 0, start.hosts)
    assert starts.decide_start(run, other, spec, 0, lambda _: None) == decision  # task 1 obeys
    return decision, starts.batch_plan_of(spec, decision)


def test_gpu_nodes_run_one_rank_per_gpu_with_task_0s_batch_plan(tmp_path):
    spec = JobSpec(
        Training("roberta-base", tmp_path / "d", tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
    )
    decision, plan = decided(tmp_path, spec, [8, 8])
    assert decision.use_gpu and decision.ranks_per_node == 8 and decision.world_size == 16
    args = command_lines.fairseq_argv(spec, plan, decision.use_gpu)
    assert args[args.index("--update-freq") + 1] == "2"  # 2048 / (64 per V100 x 16)
    assert "16 ranks" in plan.describe()


def test_no_gpu_falls_back_to_one_cpu_rank_per_node_and_keeps_the_global_batch(tmp_path):
    spec = JobSpec(
        Training("roberta-base", tmp_path / "d", tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
    )
    decision, plan = decided(tmp_path, spec, [0, 0])
    assert not decision.use_gpu and decision.ranks_per_node == 1
    args = command_lines.fairseq_argv(spec, plan, decision.use_gpu)
    assert "--cpu" in args
    assert args[args.index("--update-freq") + 1] == "64"  # 2048 / (16 x 2)


def test_a_restart_on_fewer_nodes_raises_update_freq():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=1, nodes_max=4, gpus_per_node=0, global_batch=32),
    )
    freqs = [spec.batch_plan(n, gpu=False).update_freq for n in (1, 2, 4)]
    assert freqs == [4, 2, 1]


def test_process_exited_sees_a_zombie_without_reaping_it():
    import subprocess

    from hpc_core.wait import FAST, process_exited, process_state, wait_until

    proc = subprocess.Popen(["sleep", "0.2"])
    assert not process_exited(proc.pid) and process_state(proc.pid) not in {"Z", ""}
    wait_until(lambda: process_exited(proc.pid), "sleep's exit", 30, FAST)
    assert process_state(proc.pid) == "Z"  # exited, not yet reaped
    assert proc.wait() == 0  # still reapable by its owner


def test_restart_reason_comes_from_the_stop_marker(tmp_path):
    from hpc_core.rundir import RunDir
    from hpc_train.contract import StopMarker, write_stop
    from hpc_train.launch import starts

    run = RunDir(tmp_path)
    assert starts.previous_stop(StartFiles(run, "7", 0)) == "first start"
    assert "no save on notice" in starts.previous_stop(StartFiles(run, "7", 1))
    write_stop(run.stop_marker("7", 0), StopMarker(118, "SIGUSR2"))
    assert (
        starts.previous_stop(StartFiles(run, "7", 1)) == "saved on notice (SIGUSR2) at update 118"
    )


def test_other_tasks_follow_task_0s_resume_decision(tmp_path):
    from hpc_core.rundir import RunDir
    from hpc_train.launch import starts

    run = RunDir(tmp_path)
    spec = JobSpec(
        Training("tiny", tmp_path / "d", tmp_path),
        sizing=Sizing(nodes_min=1, nodes_max=1, gpus_per_node=0),
    )
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")  # bad, and no interval checkpoint
    decided = starts.decide_start(run, starts.Start("9", 0, 1, "n1", 0), spec, gpus=0, log=print)
    assert (decided.args, decided.at_update) == ([], 0)
    assert list(tmp_path.glob("checkpoint_last.pt.bad-*"))  # moved aside by task 0 only
    other = starts.decide_start(run, starts.Start("9", 1, 2, "n1", 0), spec, gpus=0, log=print)
    assert other == decided  # read, not decided again


@pytest.mark.fairseq
def test_a_run_already_at_max_update_is_not_trained_further(trained_save_dir, tmp_path):
    """fairseq resumed at max-update would train one update more; the launcher stops first."""
    import shutil

    from hpc_core.rundir import RunDir
    from hpc_train.launch import starts

    save = tmp_path / "run"
    shutil.copytree(trained_save_dir, save)
    start = starts.Start("5", 0, 1, "n1", 1)
    spec = JobSpec(
        Training("tiny", tmp_path / "d", save),
        sizing=Sizing(nodes_min=1, nodes_max=1, gpus_per_node=0),
    )
    assert starts.decide_start(RunDir(save), start, spec, gpus=0, log=print).at_update == 12
