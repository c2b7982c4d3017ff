from pathlib import Path

import pytest

from hpc_train.job.sizing import Sizing, parse_nodes
from hpc_train.job.spec import (
    JobSpec,
    Recovery,
    Saves,
    SpecError,
    Training,
    check_writable,
    parse_time,
    validate,
)


def make_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("dict.txt", "train.bin", "train.idx"):
        (root / name).write_bytes(b"x")
    return root


@pytest.mark.parametrize(("text", "expected"), [("2", (2, 2)), ("1-4", (1, 4)), (" 3 ", (3, 3))])
def test_parse_nodes(text, expected):
    assert parse_nodes(text) == expected


@pytest.mark.parametrize("text", ["0", "4-1", "two", "1-", "-2"])
def test_parse_nodes_rejects(text):
    with pytest.raises(SpecError, match="--nodes"):
        parse_nodes(text)


@pytest.mark.parametrize(
    ("text", "minutes"), [("90", 90), ("1:30:00", 90), ("2-00:00:00", 2880), ("1-12", 2160)]
)
def test_parse_time_slurm_formats(text, minutes):
    assert parse_time(text) == minutes


def test_validate_accepts_a_good_spec(tmp_path):
    spec = JobSpec(
        Training("roberta-base", make_corpus(tmp_path / "d"), tmp_path / "s"),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
    )
    assert validate(spec).update_freq == 2  # 2048 / (64 per V100 (hpc_train.job.devices) x 16)


def test_validate_uses_the_largest_world_of_an_elastic_range(tmp_path):
    spec = JobSpec(
        Training("tiny", make_corpus(tmp_path / "d"), tmp_path / "s"),
        sizing=Sizing(nodes_min=1, nodes_max=4, gpus_per_node=0, global_batch=16),
    )
    with pytest.raises(SpecError, match="smaller than one step"):
        validate(spec)  # 4 nodes x 8 sequences = 32 > 16


def test_spares_need_a_fixed_node_count_and_imply_in_job_restarts(tmp_path):
    data = make_corpus(tmp_path / "d")
    with pytest.raises(SpecError, match="--spares needs a fixed --nodes N"):
        validate(
            JobSpec(
                Training("tiny", data, tmp_path / "s"),
                sizing=Sizing(nodes_min=1, nodes_max=2, gpus_per_node=0),
                recovery=Recovery(spares=1),
            )
        )
    with pytest.raises(SpecError, match="--spares -1"):
        validate(
            JobSpec(
                Training("tiny", data, tmp_path / "s"),
                sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
                recovery=Recovery(spares=-1),
            )
        )
    spec = JobSpec(
        Training("tiny", data, tmp_path / "s"),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(spares=1),
    )
    validate(spec)
    assert spec.allocation_arg == "2-3" and spec.recovery.in_job_restarts
    assert not spec.recovery.restart_in_job
    # best effort: the spares are the nodes past N that Slurm gave, at most K
    assert [spec.spares_in(n) for n in (2, 3, 4)] == [0, 1, 1]
    assert (
        JobSpec(
            Training("tiny", data, tmp_path / "s"),
            sizing=Sizing(nodes_min=1, nodes_max=3, gpus_per_node=0),
        ).allocation_arg
        == "1-3"
    )
    assert (
        JobSpec(
            Training("tiny", data, tmp_path / "s"),
            sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        ).spares_in(3)
        == 0
    )
    assert not JobSpec(
        Training("tiny", data, tmp_path / "s"),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
    ).recovery.in_job_restarts


def test_validate_rejects_missing_and_raw_data(tmp_path):
    with pytest.raises(SpecError, match="no such directory"):
        validate(
            JobSpec(
                Training("tiny", tmp_path / "nope", tmp_path / "s"), sizing=Sizing(gpus_per_node=0)
            )
        )
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "wiki.train.raw").write_text("text\n")
    with pytest.raises(SpecError, match="not a binarized fairseq corpus"):
        validate(
            JobSpec(
                Training("tiny", tmp_path / "raw", tmp_path / "s"), sizing=Sizing(gpus_per_node=0)
            )
        )


def test_save_dir_under_a_file_is_not_writable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecError, match="not writable"):
        check_writable(tmp_path / "file" / "run")


def test_dry_run_validation_skips_paths(tmp_path):
    spec = JobSpec(
        Training("roberta-large", tmp_path / "D", tmp_path / "S"),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
    )
    assert validate(spec, check_paths=False).update_freq == 4  # 2048 / (32 per V100 x 16)


def test_save_interval_is_parsed_once_when_the_spec_is_built(tmp_path, monkeypatch):
    """Issue 31: the CLI parsed --save-interval and validate() parsed it again; now the spec
    parses it once as it is built, and validate() and the readers take the canonical value."""
    import argparse

    from hpc_train.job import options
    from hpc_train.job import spec as spec_mod

    parsed: list[str] = []
    real = spec_mod.parse_save_interval

    def counting(text: str) -> str:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(spec_mod, "parse_save_interval", counting)
    parser = argparse.ArgumentParser()
    options.add_options(parser)
    args = parser.parse_args(["--preset", "tiny", "--data", str(tmp_path), "--save-dir",
                              str(tmp_path / "s"), "--gpus-per-node", "0", "--save-interval", "AUTO"])  # fmt: skip
    spec = options.spec_from_options(args)
    assert parsed == ["AUTO"] and spec.saves.interval == "auto"
    validate(spec, check_paths=False)
    assert parsed == ["AUTO"]  # validate() does not parse it again
    with pytest.raises(SpecError, match="--save-interval 'often'"):
        JobSpec(
            Training("tiny", tmp_path, tmp_path), saves=Saves(interval="often")
        )  # by hand: still checked


def test_max_update_falls_back_to_the_presets_in_one_place(tmp_path):
    from hpc_train.job import presets

    tiny = presets.get("tiny")
    assert (
        JobSpec(Training("tiny", tmp_path, tmp_path)).updates
        == tiny.updates(None)
        == tiny.max_update
    )
    assert (
        JobSpec(Training("tiny", tmp_path, tmp_path, max_update=7)).updates == tiny.updates(7) == 7
    )


def test_the_dry_runs_plan_is_the_largest_worlds(tmp_path):
    spec = JobSpec(
        Training("tiny", tmp_path, tmp_path),
        sizing=Sizing(nodes_min=1, nodes_max=4, gpus_per_node=0, global_batch=64),
    )
    assert spec.sizing.largest_world(gpu=False) == 4
    assert validate(spec, check_paths=False) == spec.batch_plan(4, gpu=False)
    assert spec.batch_plan(1, gpu=False).update_freq == 4 * spec.batch_plan(4, False).update_freq


def test_the_nested_spec_pickles_and_stays_frozen(tmp_path):
    """submitit pickles the spec into the job and the launcher reads it back: every concern
    comes back equal, and none can be changed in place."""
    import dataclasses
    import pickle

    from hpc_train.job.limits import HangLimits, Watch

    spec = JobSpec(
        Training("tiny", tmp_path, tmp_path / "s"),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(spares=1, no_drain=True),
        saves=Saves(interval="25", local_dir=Path("/scratch")),
        watch=Watch(hang=HangLimits(factor=3.0)),
    )
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and back.watch.hang == HangLimits(factor=3.0)
    assert back.save_interval_updates == 25 and back.allocation_arg == "2-3"
    for value, name in ((back, "training"), (back.training, "preset"), (back.recovery, "spares"),
                        (back.watch.hang, "factor"), (back.speed, "pack")):  # fmt: skip
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, 1)
