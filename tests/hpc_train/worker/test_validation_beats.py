"""The beats inside validate-and-save: a validation batch and a save each beat, on fairseq's own
names (fairseq's validation, step and save are fakes here, timed by a fake clock; the wiring is
fairseq's real module attributes, which its training loop looks up at call time)."""

from __future__ import annotations

import pytest

from hpc_train.contract import CHECKPOINT, TRAIN, VALIDATE, read_beats
from hpc_train.job.limits import HangLimits
from hpc_train.watch import hangs
from hpc_train.worker import validation_beats
from hpc_train.worker.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fairseq_fakes(monkeypatch):
    """fairseq's validate, Trainer.valid_step and save_checkpoint replaced by recorders (restored
    after the test, with the wrappers install puts over them)."""
    import fairseq_cli.train as fairseq_train
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    seen: list[str] = []
    monkeypatch.setattr(Trainer, "valid_step", lambda self, sample: seen.append(f"batch {sample}"))
    monkeypatch.setattr(fairseq_train, "validate", lambda *a: seen.append("validate") or [1.0])
    monkeypatch.setattr(checkpoint_utils, "save_checkpoint", lambda *a: seen.append("save"))
    return fairseq_train, checkpoint_utils, Trainer, seen


def test_validation_batches_and_a_save_each_beat_with_their_own_phase(tmp_path, fairseq_fakes):
    fairseq_train, checkpoint_utils, Trainer, seen = fairseq_fakes
    clock = Clock()
    hb = Heartbeat(tmp_path, rank=0, clock=clock)
    assert validation_beats.install(hb)
    hb.completed(50)  # the update at a save point: phase checkpoint
    clock.now += 1
    fairseq_train.validate(None, None, None, None, ["valid"])
    assert read_beats(tmp_path)[0].phase == VALIDATE and read_beats(tmp_path)[0].time == 1001
    for batch in range(3):
        clock.now += 2
        Trainer.valid_step(object(), batch)
        (beat,) = read_beats(tmp_path)
        assert (beat.phase, beat.time, beat.update) == (VALIDATE, clock.now, 50)
    clock.now += 1
    checkpoint_utils.save_checkpoint(None, None, None, 1.0)
    (beat,) = read_beats(tmp_path)
    assert (beat.phase, beat.time) == (CHECKPOINT, clock.now)  # the save's allowance from here
    assert seen == ["validate", "batch 0", "batch 1", "batch 2", "save"]  # the originals ran
    hb.training()
    assert read_beats(tmp_path)[0].phase == TRAIN
    assert list(hb.recent) == []  # validation's and the save's time is no update's


def test_a_rank_stuck_in_validation_gets_the_training_allowance_not_the_save_one(
    tmp_path, fairseq_fakes
):
    """The soak's hang (2026-11-26): a rank stopped during validation, its peer blocked in the
    stats all-reduce. Before: both beats said ``checkpoint`` since the update (61 s to catch it
    with a 60 s save allowance); now the peer's last validation beat is judged by T."""
    _, _, Trainer, _ = fairseq_fakes
    limits = HangLimits(factor=10, floor_s=10, save_s=60, startup_s=180)
    clock = Clock()
    hb = Heartbeat(tmp_path, rank=0, clock=clock)
    validation_beats.install(hb)
    hb.completed(7850)
    Trainer.valid_step(object(), 0)
    (beat,) = read_beats(tmp_path)
    assert hangs.allowance(beat, limits) == 10
    assert hangs.assess([beat], 1, started=0.0, now=clock.now + 9, limits=limits) is None
    hang = hangs.assess([beat], 1, started=0.0, now=clock.now + 11, limits=limits)
    assert hang is not None and "(validate; allowed 10 s)" in hang.why
    hb.saving()  # a save, by contrast, keeps the save allowance
    assert hangs.allowance(read_beats(tmp_path)[0], limits) == 60


def test_without_a_heartbeat_nothing_is_wrapped(fairseq_fakes):
    fairseq_train, checkpoint_utils, Trainer, _ = fairseq_fakes
    before = (fairseq_train.validate, checkpoint_utils.save_checkpoint, Trainer.valid_step)
    assert not validation_beats.install(None)
    assert (fairseq_train.validate, checkpoint_utils.save_checkpoint, Trainer.valid_step) == before
