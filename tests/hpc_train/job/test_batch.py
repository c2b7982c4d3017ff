import pytest

from hpc_train.job import batch


@pytest.mark.parametrize(
    ("global_batch", "per_device", "world", "freq"),
    [(2048, 8, 16, 16), (2048, 16, 16, 8), (2048, 16, 24, 6), (16, 8, 2, 1), (16, 8, 1, 2)],
)
def test_update_freq_is_ceil_of_global_over_world_step(global_batch, per_device, world, freq):
    plan = batch.keep_global_batch(global_batch, per_device, world)
    assert plan.update_freq == freq
    assert plan.effective >= global_batch
    assert plan.effective - global_batch < per_device * world  # never a whole extra step


def test_global_batch_stays_fixed_across_node_counts():
    effective = {n: batch.keep_global_batch(2048, 8, n * 8).effective for n in (1, 2, 4, 8, 16, 32)}
    assert set(effective.values()) == {2048}


def test_inexact_plan_says_what_it_chose():
    plan = batch.keep_global_batch(2048, 16, 24)
    assert plan.effective == 2304
    assert "asked 2048" in plan.describe() and "update_freq=6" in plan.describe()


def test_global_batch_smaller_than_one_step_is_refused():
    with pytest.raises(ValueError, match="smaller than one step"):
        batch.keep_global_batch(64, 8, 16)
