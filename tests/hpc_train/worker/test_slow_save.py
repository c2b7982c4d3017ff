"""``chaos JOB slow-save --seconds S`` (the rehearsal of a slow FSx): the file the CLI writes in
the run's state dir, and the background writer sleeping S seconds before each write while the
save counts as in flight (real AsyncSaver, real files; no fairseq)."""

from __future__ import annotations

import time

import pytest
import torch

from hpc_core.rundir import RunDir
from hpc_train import chaos, contract
from hpc_train.worker import async_save


def test_the_cli_asks_every_write_of_the_run_to_sleep_and_zero_stops_it(tmp_path, capsys):
    run = RunDir(tmp_path)
    run.state.mkdir(parents=True)  # a run dir (what `chaos` resolves a save dir argument to)
    assert contract.slow_save_s(run) == 0.0 and not run.chaos_slow_save.exists()
    assert chaos.main([str(tmp_path), "slow-save", "--seconds", "6"]) == 0
    assert contract.slow_save_s(run) == 6.0
    assert "checkpoint writes sleep 6 s first" in capsys.readouterr().out
    assert chaos.main([str(tmp_path), "slow-save", "--seconds", "0"]) == 0
    assert not run.chaos_slow_save.exists() and contract.slow_save_s(run) == 0.0


@pytest.mark.parametrize("bad", ["-1", "soon", "7200"])
def test_bad_seconds_are_one_line_and_exit_2(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exit_:
        chaos.main([str(tmp_path), "slow-save", "--seconds", bad])
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_garbled_request_is_no_sleep(tmp_path):
    run = RunDir(tmp_path)
    run.state.mkdir(parents=True)
    run.chaos_slow_save.write_text("{not json")
    assert contract.slow_save_s(run) == 0.0


def test_a_slow_write_is_in_flight_for_its_seconds_and_the_old_file_stays_whole(tmp_path):
    run = RunDir(tmp_path)
    saver = async_save.AsyncSaver(run=run)
    target = tmp_path / "checkpoint_last.pt"
    saver.save({"n": torch.tensor(1)}, str(target))
    saver.flush()
    assert saver.last is not None and saver.last.write_s < 0.5  # nothing asked: no sleep
    contract.ask_slow_saves(run, 0.8)
    began = time.monotonic()
    saver.save({"n": torch.tensor(2)}, str(target))
    time.sleep(0.3)
    assert saver.busy() and saver.writing(target)  # in flight, not yet durable
    assert torch.load(target, weights_only=True)["n"] == 1  # the previous save, whole
    saver.flush()
    assert time.monotonic() - began >= 0.8
    assert saver.last.write_s >= 0.8  # counted as write time, as a slow file system's would be
    assert torch.load(target, weights_only=True)["n"] == 2


def test_a_saver_that_does_not_know_its_run_never_sleeps(tmp_path):
    contract.ask_slow_saves(RunDir(tmp_path), 5)
    saver = async_save.AsyncSaver()
    saver.save({"n": torch.tensor(1)}, str(tmp_path / "checkpoint_last.pt"))
    saver.flush()
    assert saver.last is not None and saver.last.write_s < 2


def test_a_tiered_write_counts_the_sleep_in_its_write_seconds(tmp_path):
    run = RunDir(tmp_path / "run")
    contract.ask_slow_saves(run, 0.4)
    saver = async_save.AsyncSaver(local_dir=tmp_path / "local", run=run)
    saver.save({"n": torch.tensor(1)}, str(run.root / "checkpoint_1_10.pt"))
    saver.flush()
    assert saver.last is not None and saver.last.copy_s is not None
    assert saver.last.write_s >= 0.4
