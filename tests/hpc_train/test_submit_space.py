"""``submit`` (and ``--dry-run``) warns when the save dir's file system cannot hold what the run
keeps: (kept checkpoints + the save on notice + one in flight + checkpoint_best.pt) x the
checkpoint size (the preset's, or the last checkpoint's), or has too few inodes. The save dir is
on a tmpfs of its own (``small_fs``), standing for FSx for Lustre."""

from __future__ import annotations

from hpc_core import space
from hpc_train import submit
from hpc_train.planning import costs


def dry_run(save_dir, capsys, *options: str) -> str:
    argv = ["--preset", "tiny", "--gpus-per-node", "0", "--data", "/d", "--save-dir",
            str(save_dir), "--dry-run", *options]  # fmt: skip
    assert submit.main(argv) == 0
    return capsys.readouterr().err


def test_the_save_dir_holds_kept_plus_three_checkpoints():
    assert costs.save_dir_bytes(1000, kept=2) == 5000
    room = space.Space(space.Path("/lustre"), 4999, None, 10**6)
    said = costs.space_warning(room, 1000, kept=2)
    assert said == (
        "warning: the save dir's file system cannot hold this run's checkpoints: /lustre: "
        "5 kB free, 5 kB needed (2 kept + the save on notice + one in flight + "
        "checkpoint_best.pt, x 1 kB each)"
    )
    assert costs.space_warning(space.Space(room.path, 5000, None, 10**6), 1000, kept=2) is None


def test_a_dry_run_on_a_small_save_dir_warns_with_the_figures(small_fs, capsys):
    """The tiny preset's checkpoint is ~40 MB: 3 kept + 3 is ~241 MB, 1 kept + 3 ~161 MB; the
    file system has 200 MiB (empty: a tmpfs takes no memory for space not written)."""
    fs = small_fs("200m")
    tiny = costs.preset_checkpoint_bytes("tiny", gpu=False)
    err = dry_run(fs.root / "run", capsys)  # --keep-checkpoints 3, the default
    (line,) = [ln for ln in err.splitlines() if "cannot hold" in ln]
    assert f"{fs.root}: {space.size(fs.free())} free, {space.size(6 * tiny)} needed" in line
    assert (
        f"(3 kept + the save on notice + one in flight + checkpoint_best.pt, x {space.size(tiny)} each)"
        in line
    )
    assert "cannot hold" not in dry_run(fs.root / "run", capsys, "--keep-checkpoints", "1")


def test_the_last_checkpoints_size_counts_and_set_aside_files_are_named(small_fs, capsys):
    fs = small_fs("8m")
    run = fs.root / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"x" * 1_000_000)  # a run submitted again
    (run / "checkpoint_last.pt.bad-20261128T120000-3").write_bytes(b"x" * 1_500_000)
    err = dry_run(run, capsys)  # 1 MB x (3 kept + 3) = 6 MB > 8 MiB - 2.5 MB
    assert "6.0 MB needed" in err and "x 1.0 MB each" in err
    assert "checkpoint_last.pt.bad-20261128T120000-3 (1.5 MB)" in err


def test_too_few_inodes_warns_too(small_fs, capsys):
    fs = small_fs("300m", inodes=100)
    err = dry_run(fs.root / "run", capsys)
    assert "inodes free, 10,000 wanted" in err and "needed" not in err


def test_room_to_spare_says_nothing(small_fs, capsys):
    fs = small_fs("300m")
    assert "cannot hold" not in dry_run(fs.root / "run", capsys)
