"""Rank 0's ledger events, with fairseq's update and save steps replaced by recorders (the real
hooks wrap the real fairseq functions; the fakes stand in for a training loop and a disk)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.contract import parse_start
from hpc_train.worker import ledger_hooks, preemption


class Trainer:
    device = "cpu"
    data_parallel_rank = 0

    def __init__(self) -> None:
        self.updates = 0

    def get_num_updates(self) -> int:
        return self.updates


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """worker_events and the save on notice installed over fake fairseq steps; a save writes
    checkpoint_last.pt, and a save made while ``signal_during_save`` is set receives USR2."""
    import fairseq_cli.train as fairseq_train
    from fairseq import checkpoint_utils

    run = RunDir(tmp_path)
    world = SimpleNamespace(signal_during_save=False, saves=[])

    def save(cfg: Any, trainer: Trainer, *args: Any) -> None:
        run.checkpoint_last.write_bytes(b"x" * 10)
        world.saves.append(trainer.updates)
        if world.signal_during_save:
            preemption._on_signal(preemption.NOTICE_SIGNAL, None)

    def step(*args: Any) -> tuple[list[None], bool]:
        checkpoint_utils.save_checkpoint(None, args[1], None, None)  # a periodic save each update
        return [None], False

    monkeypatch.setattr(checkpoint_utils, "save_checkpoint", save)
    monkeypatch.setattr(fairseq_train, "validate_and_save", step)
    monkeypatch.setitem(preemption._notice, "at", None)
    monkeypatch.setitem(preemption._notice, "why", None)
    assert ledger_hooks.install(run, ("7", 2), rank=0)
    preemption.install_save_on_notice(run.state / "stop")
    world.run, world.step = run, fairseq_train.validate_and_save
    return world


def update(world: Any, trainer: Trainer) -> bool:
    trainer.updates += 1
    cfg = SimpleNamespace(checkpoint=None)
    return world.step(cfg, trainer, None, None, [], False)[1]


def test_a_notice_landing_in_a_periodic_save_does_not_make_it_the_save_on_notice(hooked):
    trainer = Trainer()
    update(hooked, trainer)
    hooked.signal_during_save = True
    assert not update(hooked, trainer)  # update 2's periodic save; USR2 arrives during it
    hooked.signal_during_save = False
    assert update(hooked, trainer)  # update 3 sees the notice: saves and stops
    events = ledger.read(hooked.run.ledger)
    saves = [(e.get("update"), e.get("notice")) for e in events if e.kind == "checkpoint"]
    assert saves == [(1, False), (2, False), (3, True)]
    assert all(e.job == "7" and e.restart == 2 for e in events)
    assert [e.get("update") for e in events if e.kind == "first_update"] == [1]
    assert hooked.saves == [1, 2, 3] and not preemption.saving_on_notice()


def test_other_ranks_and_plain_fairseq_runs_record_nothing(tmp_path):
    run = RunDir(tmp_path)
    assert not ledger_hooks.install(run, ("7", 0), rank=1)
    assert not ledger_hooks.install(run, None, rank=0)
    assert parse_start("12:3") == ("12", 3)
    assert parse_start("12:x") is None
