import pytest

from hpc_train.worker import train


def test_distributed_args_come_from_torchrun_environment():
    args = train.distributed_args({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert args[args.index("--distributed-world-size") + 1] == "4"
    assert args[args.index("--distributed-rank") + 1] == "3"
    assert "env://" in args and "--distributed-no-spawn" in args


def test_outside_torchrun_no_distributed_args():
    assert train.distributed_args({}) == []


def test_the_save_dir_comes_from_the_launcher_else_the_last_save_dir_argument():
    from pathlib import Path

    from hpc_train.contract import WorkerEnv

    hand = WorkerEnv.from_env({})
    assert train.save_dir_of(hand, ["d", "--save-dir", "/a", "--save-dir", "/b"]) == Path("/b")
    with pytest.raises(ValueError, match="no save dir"):
        train.save_dir_of(hand, ["d"])  # no silent "checkpoints" default
    launched = WorkerEnv.from_env({"HPC_TRAIN_SAVE_DIR": "/run", "HPC_TRAIN_START": "4:0"})
    assert train.save_dir_of(launched, ["d", "--save-dir", "/other"]) == Path("/run")


def test_stop_marker_is_the_path_the_launcher_passed(tmp_path):
    from hpc_core.rundir import RunDir
    from hpc_train.contract import WorkerEnv

    run = RunDir(tmp_path)
    chosen = run.stop_marker("41", 2)
    assert train.stop_marker(WorkerEnv(stop_marker=chosen), run) == chosen
    assert train.stop_marker(WorkerEnv(), run) == run.stop_marker("local", 0)
