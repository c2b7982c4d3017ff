"""The data position across a width change (``hpc_train.worker.data_position``), checked against
fairseq's own ``EpochBatchIterator`` (no training: milliseconds): worlds that consume part of
an epoch, save, and resume at another width train each sample of the epoch exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from fairseq.data import iterators

from hpc_train.worker import data_position
from hpc_train.worker.data_position import EpochPlan, EpochResume, convert

SAMPLES, BATCH = 48, 2


class Ids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


def collate(items: list[int]) -> dict[str, Any]:
    return {"id": torch.tensor(items, dtype=torch.long)} if items else {}


def world(num_shards: int, batch: int = BATCH) -> list[iterators.EpochBatchIterator]:
    batches = [list(range(i, min(i + batch, SAMPLES))) for i in range(0, SAMPLES, batch)]
    return [
        iterators.EpochBatchIterator(
            Ids(), collate, batches, seed=1, num_shards=num_shards, shard_id=s
        )
        for s in range(num_shards)
    ]


def consume(itrs: list[iterators.EpochBatchIterator], steps: int | None) -> list[int]:
    """Every shard takes ``steps`` batches (None: to the epoch's end), in lockstep as the ranks
    do; the sample ids they trained."""
    seen: list[int] = []
    epochs = [itr.next_epoch_itr(shuffle=True) for itr in itrs]
    while steps is None or steps > 0:
        assert len({epoch.has_next() for epoch in epochs}) == 1  # the ranks stay in step
        if not epochs[0].has_next():
            break
        for epoch in epochs:
            seen += next(epoch).get("id", torch.tensor([])).tolist()
        steps = None if steps is None else steps - 1
    return seen


def resumed(state: dict[str, Any], num_shards: int) -> list[iterators.EpochBatchIterator]:
    itrs = world(num_shards)
    for itr in itrs:
        itr.load_state_dict(dict(state))
    return itrs


@pytest.fixture
def converting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conversion installed on fairseq's class, for this test only."""
    cls = iterators.EpochBatchIterator
    monkeypatch.setattr(cls, "state_dict", cls.state_dict)
    monkeypatch.setattr(cls, "load_state_dict", cls.load_state_dict)
    data_position.install_conversion()


def test_fairseqs_own_offset_repeats_or_skips_samples_at_another_width():
    """Why: 3 ranks x 4 batches, resumed on 2 ranks, 8 samples twice (issue 20's numbers)."""
    three = world(3)
    seen = consume(three, 4)
    seen += consume(resumed(three[0].state_dict(), 2), None)
    assert sum(1 for n in Counter(seen).values() if n == 2) == 8


@pytest.mark.parametrize("widths", [(3, 2), (2, 3), (2, 1, 3), (1, 6, 2), (3, 3), (2, 3, 1, 2)])
def test_each_sample_once_in_the_epoch_across_width_changes(converting, widths):
    """Each world consumes one update (the global batch kept: 6 batches, update_freq 6 / width),
    saves, and the next resumes; the last runs to the epoch's end."""
    itrs = world(widths[0])
    seen: list[int] = []
    for now, after in zip(widths, (*widths[1:], None), strict=True):
        seen += consume(itrs, 6 // now if after is not None else None)
        if after is not None:
            itrs = resumed(itrs[0].state_dict(), after)
    assert Counter(seen) == Counter(range(SAMPLES))


@pytest.mark.parametrize(
    "stages", [((3, 3), (2, None)), ((2, 5), (3, None)), ((3, 1), (2, 2), (1, 3), (3, None))]
)
def test_a_position_that_does_not_divide_the_new_width_is_exact_too(converting, stages):
    """Worlds that stop after any number of steps (a global batch kept only up to rounding):
    the shards whose next batch was trained take an empty one, and all stay in step."""
    itrs = world(stages[0][0])
    seen: list[int] = []
    for (_, steps), (after, _) in zip(stages, (*stages[1:], (0, None)), strict=True):
        seen += consume(itrs, steps)
        if after:
            itrs = resumed(itrs[0].state_dict(), after)
    assert Counter(seen) == Counter(range(SAMPLES))


def test_the_same_width_keeps_fairseqs_state_and_offset(converting):
    two = world(2)
    consume(two, 3)
    state = two[0].state_dict()
    assert state["iterations_in_epoch"] == 3 and state[data_position.KEY]["num_shards"] == 2
    again = resumed(state, 2)
    assert [itr.iterations_in_epoch for itr in again] == [3, 3]


def test_the_conversion_alone_against_fairseqs_dealing():
    """``convert`` without the patch: fairseq's plain iterator given the converted offset."""
    three = world(3)
    seen = consume(three, 4)
    saved = data_position.plan_of(three[0])
    two = world(2)
    resume = convert(saved, 4, data_position.plan_of(two[0]))
    assert resume == EpochResume(6, True, resume.why) and "12 batches" in resume.why
    seen += consume(resumed({"epoch": 1, "iterations_in_epoch": resume.offset}, 2), None)
    assert sorted(seen) == list(range(SAMPLES))


def test_what_cannot_be_exact_is_said_by_name():
    plan = EpochPlan(num_shards=2, epoch_batches=24, fingerprint=7)
    same = convert(plan, 5, plan)
    assert same == EpochResume(5, True, same.why)
    # 10 batches consumed over 3 shards: each skips 3, shard 0's next (batch 9) was trained
    odd = convert(plan, 5, EpochPlan(3, 24, 7))
    assert (odd.offset, odd.exact, odd.blank_below) == (3, True, 1) and "empty batch" in odd.why
    # another batch per device: another plan; the same fraction of the epoch, not exact
    other = convert(plan, 6, EpochPlan(3, 12, 9))
    assert (other.offset, other.exact) == (2, False) and "batch plan changed" in other.why
    grouped = convert(EpochPlan(2, 24, 7, grouped=True), 6, EpochPlan(3, 24, 7, grouped=True))
    assert not grouped.exact and "grouped shuffling" in grouped.why
    assert EpochPlan.from_state(None) is None and EpochPlan.from_state({"x": 1}) is None


def test_the_plan_fingerprint_sees_the_batch_size():
    (a,), (b,) = world(1, 2), world(1, 3)
    assert data_position.plan_of(a).fingerprint != data_position.plan_of(b).fingerprint
    assert data_position.plan_of(a) == data_position.plan_of(world(1, 2)[0])
