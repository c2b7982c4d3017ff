from hpc_train.worker import train


def test_distributed_args_come_from_torchrun_environment():
    args = train.distributed_args({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert args[args.index("--distributed-world-size") + 1] == "4"
    assert args[args.index("--distributed-rank") + 1] == "3"
    assert "env://" in args and "--distributed-no-spawn" in args


def test_outside_torchrun_no_distributed_args():
    assert train.distributed_args({}) == []


def test_train_log_goes_to_the_last_save_dir():
    from pathlib import Path

    assert train.save_dir_of(["d", "--save-dir", "/a", "--lr", "1", "--save-dir", "/b"]) == Path(
        "/b"
    )
    assert train.save_dir_of(["d"]) == Path("checkpoints")


def test_stop_marker_is_the_path_the_launcher_passed(tmp_path):
    from hpc_core.rundir import STOP_MARKER_ENV, RunDir

    run = RunDir(tmp_path)
    chosen = run.stop_marker("41", 2)
    assert train.stop_marker(run, {STOP_MARKER_ENV: str(chosen)}) == chosen
    assert train.stop_marker(run, {"SLURM_JOB_ID": "41"}) == run.stop_marker("local", 0)
