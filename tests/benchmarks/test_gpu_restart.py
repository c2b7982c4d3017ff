"""The in-job restart benchmark's log reading, arithmetic and command lines (pure: no torchrun,
no GPU, no timing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_restart as bench
from hpc_core.slurm import rendezvous_port
from hpc_train.runs import logparse

DAY = "2026-11-26"


def inner(update: int, stamp: str, loss: float = 9.5) -> str:
    body = {"epoch": 1, "update": 0.1, "loss": str(loss), "num_updates": str(update), "wps": "99"}
    return f"{DAY} {stamp} | INFO | train_inner | {json.dumps(body)}"


def loaded(update: int, stamp: str) -> str:
    return (
        f"{DAY} {stamp} | INFO | fairseq.trainer | Loaded checkpoint /s/checkpoint_last.pt "
        f"(epoch 1 @ {update} updates)"
    )


def at(stamp: str) -> float:
    t = logparse.line_time(f"{DAY} {stamp}")
    assert t is not None
    return t


RESTARTED = [
    f"{DAY} 10:00:00,100 | INFO | fairseq_cli.train | {{'common': {{'log_interval': 1}}}}",
    loaded(40, "10:00:05,000"),
    inner(41, "10:00:05,500"),
    inner(41, "10:00:05,600"),  # another rank's copy: the first one counts
    inner(42, "10:00:05,800"),
    f"{DAY} 10:00:06,000 | INFO | hpc_train.worker.async_save | snapshot for "
    "/s/checkpoint_1_80.pt in 1.13 s; writing in the background",
    f"{DAY} 10:00:07,000 | INFO | hpc_train.worker.async_save | wrote /s/checkpoint_1_80.pt "
    "in the background in 2.50 s",
    inner(43, "10:00:08,100"),
    inner(44, "10:00:08,400"),
    inner(45, "10:00:08,700"),
    '2026-11-26 10:00:08,900 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "num_upd',  # cut
]


def test_a_start_s_log_gives_its_resume_point_updates_and_saves() -> None:
    log = bench.parse_start(RESTARTED)
    assert log.loaded == (40, at("10:00:05,000"))
    assert [u for u, _ in log.updates] == [41, 42, 43, 44, 45]
    assert log.updates[0] == (41, at("10:00:05,500"))  # the first copy of an update
    assert log.resumed_at == 40 and log.reached == 45
    assert log.first_update() == (41, at("10:00:05,500"))
    assert log.first_at_least(44) == (44, at("10:00:08,400"))
    assert log.first_at_least(46) is None
    assert log.snapshot_s == [1.13] and log.write_s == [2.5]


def test_a_cold_start_resumes_at_zero_and_a_start_without_updates_reached_its_resume() -> None:
    cold = bench.parse_start([inner(1, "09:00:00,250"), inner(2, "09:00:00,500")])
    assert cold.loaded is None and cold.resumed_at == 0 and cold.reached == 2
    assert cold.first_update() == (1, at("09:00:00,250"))
    only_loaded = bench.parse_start([loaded(80, "09:00:00,000")])
    assert only_loaded.reached == 80 and only_loaded.first_update() is None


def test_seconds_per_update_leave_out_the_warm_up_and_gaps() -> None:
    updates = [(1, 0.0), (2, 5.0), (3, 5.5), (4, 6.0), (5, 6.25), (7, 9.0), (8, 9.5)]
    # the first 3 left out; 5 -> 7 is not one update apart
    assert bench.step_seconds(updates, skip=3) == [0.25, 0.5]
    assert bench.step_seconds(updates[:3], skip=3) == []


def test_restart_figures_measure_from_the_kill_and_the_decision() -> None:
    log = bench.parse_start(RESTARTED)
    killed, began = at("09:59:59,000"), at("09:59:59,800")
    r = bench.restart_figures(killed, began, 0.05, log, reached_before=44)
    assert r["resumed_at"] == 40 and r["reached_before_kill"] == 44
    assert r["updates_recomputed"] == 4
    assert r["choose_resume_s"] == 0.05
    assert r["restart_to_loaded_s"] == pytest.approx(5.2)
    assert r["loaded_to_first_update_s"] == pytest.approx(0.5)
    assert r["restart_to_first_update_s"] == pytest.approx(5.7)
    assert r["kill_to_first_update_s"] == pytest.approx(6.5)
    assert r["kill_to_caught_up_s"] == pytest.approx(9.4)  # update 44 again


def test_restart_figures_say_none_for_what_did_not_happen() -> None:
    log = bench.parse_start([loaded(40, "10:00:05,000")])  # loaded, then nothing
    r = bench.restart_figures(at("10:00:00,000"), at("10:00:00,000"), 0.0, log, 44)
    assert r["restart_to_loaded_s"] == pytest.approx(5.0)
    assert r["kill_to_first_update_s"] is None and r["kill_to_caught_up_s"] is None
    none = bench.restart_figures(0.0, 0.0, 0.0, bench.parse_start([]), 44)
    assert none["resumed_at"] is None and none["updates_recomputed"] is None


def test_the_time_lost_splits_into_the_recompute_and_the_rest() -> None:
    crashes: list[dict[str, Any]] = [
        {"restart": {"kill_to_first_update_s": 20.0, "kill_to_caught_up_s": 26.0,
                     "updates_recomputed": 20}},
        {"restart": {"kill_to_first_update_s": 15.0, "kill_to_caught_up_s": None,
                     "updates_recomputed": 10}},
        {},  # the restart never happened
    ]  # fmt: skip
    f = bench.figures(crashes, seconds_per_update=0.3)
    assert f["restart_1"] == {
        "kill_to_first_update_s": 20.0, "lost_s": 26.0, "recompute_s": 6.0, "fixed_s": 20.0
    }  # fmt: skip
    assert f["restart_2"]["recompute_s"] == 3.0 and f["restart_2"]["fixed_s"] is None
    assert f["restart_3"] == {
        "kill_to_first_update_s": None, "lost_s": None, "recompute_s": None, "fixed_s": None
    }  # fmt: skip
    assert bench.figures(crashes[:1], None)["restart_1"]["recompute_s"] is None


def arg(argv: list[str], flag: str) -> str:
    """The last value of ``flag`` (argparse's: the one fairseq uses)."""
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


def test_the_cpu_sequence_runs_the_toolkit_s_command_on_one_cpu_rank(tmp_path: Path) -> None:
    b = bench.Bench(bench.PLANS["cpu"], tmp_path / "data", tmp_path, use_gpu=False)
    argv = b.start_argv(0, ())
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "hpc_train.worker.train" in argv
    assert "--cpu" in argv and arg(argv, "--distributed-backend") == "gloo"
    assert arg(argv, "--save-interval-updates") == str(bench.PLANS["cpu"].save_every)
    assert arg(argv, "--log-interval") == "1"  # every update: the first one is timed
    assert arg(argv, "--save-dir") == str(b.save) and b.save.is_absolute()
    assert b.env["SLURM_JOB_ID"] == b.tag and b.env["OMP_NUM_THREADS"] == "1"
    settings = b.settings()
    assert settings["batch_per_device"] * settings["update_freq"] == settings["global_batch"]


def test_each_restart_gets_the_next_round_s_rendezvous_and_the_resume_args(
    tmp_path: Path,
) -> None:
    b = bench.Bench(bench.PLANS["cpu"], tmp_path, tmp_path, use_gpu=False)
    ports = {a.split(":")[-1] for r in range(3) for a in b.start_argv(r, ()) if "endpoint" in a}
    assert ports == {str(rendezvous_port("4242", r)) for r in range(3)}
    assert len(ports) == 3
    resumed = b.start_argv(1, ("--continue-once", "/s/checkpoint_1_40.pt"))
    assert resumed[-2:] == ["--continue-once", "/s/checkpoint_1_40.pt"]


def test_the_gpu_sequence_is_the_p5_toolkit_run_and_stays_inside_one_epoch(
    tmp_path: Path,
) -> None:
    plan = bench.PLANS["cuda"]
    b = bench.Bench(plan, tmp_path, tmp_path, use_gpu=True)
    argv = b.start_argv(0, ())
    assert "--bf16" in argv and arg(argv, "--optimizer") == "fused_adamw"
    assert arg(argv, "--batch-size") == "256" and arg(argv, "--update-freq") == "1"
    # the demo corpus: 224 blocks of 512 tokens per copy of its train split (docs/gpu.md:
    # 22,401 for 100 copies); an epoch's end would validate and save in the middle
    assert plan.lengths.max_update * plan.lengths.global_batch < 224 * plan.repeat
    # two saves and the updates after each fit under max_update, with room for the write's lag
    assert 2 * plan.save_every + plan.kill_after + 30 < plan.lengths.max_update
