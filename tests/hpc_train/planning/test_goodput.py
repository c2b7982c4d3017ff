"""Goodput (ETTR) from a ledger, against hand-computed figures."""

from __future__ import annotations

import pytest

from hpc_core.ledger import Event
from hpc_train.planning import goodput


def ev(kind: str, t: float, restart: int = 0, **data) -> Event:
    return Event(kind, t, "41", restart, data)


# submitted at 0; start #1 at 10 (queue 10), first update at 40 (start-up 30), a 5 s save,
# notice-stop at 100; requeued, start #2 at 130 (queue 30), first update at 150 (start-up 20),
# a 3 s save, finished at 250.
PREEMPTED = [
    ev("submitted", 0),
    ev("started", 10, previous="first start"),
    ev("first_update", 40, update=1),
    ev("checkpoint", 60, update=20, seconds=5.0),
    ev("notice", 98),
    ev("stopped", 100, cause="notice"),
    ev("requeued", 100),
    ev("started", 130, 1, resume_at=60, previous="saved on notice (SIGUSR2) at update 60"),
    ev("first_update", 150, 1, update=61),
    ev("checkpoint", 200, 1, update=100, seconds=3.0),
    ev("finished", 250, 1),
]


def test_a_preempted_run_by_hand():
    g = goodput.account(PREEMPTED, now=999)
    assert g.wall_s == 250
    assert g.queue_s == 10 + 30
    assert g.startup_s == 30 + 20
    assert g.checkpoint_s == 8
    # training: (100 - 40) + (250 - 150) = 160, less the 8 s of saves
    assert g.productive_s == 152 and g.restarts == 1
    assert g.ettr == pytest.approx(152 / 250)
    assert goodput.restarts(PREEMPTED) == [(60, "saved on notice (SIGUSR2) at update 60")]


def test_recomputed_updates_cost_their_time():
    g = goodput.account(PREEMPTED, now=999, recomputed_updates=10, seconds_per_update=1.5)
    assert g.recomputed_s == 15 and g.productive_s == 152 - 15


def test_a_running_run_counts_until_now():
    g = goodput.account(PREEMPTED[:3], now=100)
    assert (g.wall_s, g.queue_s, g.startup_s, g.productive_s) == (100, 10, 30, 60)
    assert goodput.segments(PREEMPTED[:3], now=100)[0].cause == "running"


def test_a_start_that_vanished_ends_at_its_last_event_and_the_gap_is_queue():
    """Node failure: no stop recorded; the next start is what the ledger knows."""
    events = [
        ev("submitted", 0),
        ev("started", 0),
        ev("first_update", 10, update=1),
        ev("checkpoint", 50, update=40, seconds=2.0),
        ev("started", 90, 1, resume_at=40),
        ev("first_update", 100, 1, update=41),
        ev("finished", 120, 1),
    ]
    segs = goodput.segments(events, now=999)
    assert [s.cause for s in segs] == ["unknown", "finished"]
    assert segs[0].ended == 50
    g = goodput.account(events, now=999)
    assert g.queue_s == 40 and g.productive_s == (50 - 10 - 2) + (120 - 100)


def test_no_start_yet_is_all_queue():
    g = goodput.account([ev("submitted", 0)], now=30)
    assert (g.wall_s, g.queue_s, g.productive_s, g.ettr) == (30, 30, 0, 0)


# A hang the test made: the last progress at 45 (update 25), the watchdog's 300 s allowance ran
# out at 345 and the run was requeued; start #2 resumed from the periodic checkpoint at update
# 20 (5 updates trained again) and finished; its agent then took 2 s to exit.
HUNG = [
    ev("submitted", 0),
    ev("started", 10, previous="first start"),
    ev("first_update", 20, update=1),
    ev("stopped", 345, cause="hang", reached=25, last_progress=45.0),
    ev("requeued", 345),
    ev("started", 360, 1, resume_at=20, previous="hang (...): last periodic checkpoint"),
    ev("first_update", 370, 1, update=21),
    ev("finished", 400, 1, reached=40, last_progress=398.0),
]


def test_a_hangs_allowance_is_never_productive_and_the_recomputed_updates_come_from_the_ledger():
    g = goodput.account(HUNG, now=999)
    truth_training = (45 - 20) + (398 - 370)  # what the ranks really trained: 53 s
    assert g.no_progress_s == pytest.approx(300 + 2)  # the allowance and the slow exit
    assert g.recomputed_updates == 25 - 20
    per_update = truth_training / (25 + (40 - 20))
    assert g.recomputed_s == pytest.approx(5 * per_update)
    assert g.productive_s == pytest.approx(truth_training - 5 * per_update)
    assert sum(g.parts.values()) == pytest.approx(g.wall_s)
    assert "no progress 302 s" in g.describe() and "(5 updates)" in g.describe()


def test_an_agent_stuck_after_training_costs_its_time():
    """Training ended at 100 (the last heartbeat), the job held its nodes until 1000."""
    events = [
        ev("submitted", 0),
        ev("started", 0),
        ev("first_update", 10, update=1),
        ev("finished", 1000, reached=90, last_progress=100.0),
    ]
    g = goodput.account(events, now=1000)
    assert g.productive_s == 90 and g.no_progress_s == 900
    assert g.ettr == pytest.approx(0.09)
    assert sum(g.parts.values()) == pytest.approx(g.wall_s)


def test_an_in_job_restart_is_its_own_cause_not_queue():
    """Submitted at 0, start at 10, first update at 20, a crash stops it at 60 (reached update
    40 at 55, last checkpoint at update 30); task 0 restarts in the allocation: round 1 starts
    at 64 (4 s of hand-over), first update at 70, finished at 100. Nothing was queued for."""
    events = [
        ev("submitted", 0),
        ev("started", 10, previous="first start"),
        ev("first_update", 20, update=1),
        ev("stopped", 60, cause="crash", reached=40, last_progress=55),
        ev("restarted", 60, members=["n1"], left_out=["n2"]),
        ev("started", 64, resume_at=30, previous="in-job restart after crash: n2: killed"),
        ev("first_update", 70, update=31),
        ev("finished", 100, reached=70, last_progress=100),
    ]
    g = goodput.account(events, now=999)
    assert g.wall_s == 100 and g.in_job_restart_s == 4
    assert g.queue_s == 10  # submission -> first start only
    assert g.startup_s == 10 + 6 and g.no_progress_s == 5 and g.recomputed_updates == 10
    assert sum(g.parts.values()) == pytest.approx(g.wall_s)
    assert "in-job restarts 4 s" in g.describe()


def test_a_storage_hold_is_counted_as_storage_not_queue_or_no_progress():
    """Submitted at 0, start at 10, first update at 20, the save dir fills: the last progress
    at 80 (update 60, checkpoint at 50), task 0 holds the job at 100; released, the next start
    at 400, first update at 410, finished at 500. Storage: 100 - 80 (detection) + 400 - 100
    (held) = 320 s; the queue only the 10 s before the first start."""
    events = [
        ev("submitted", 0),
        ev("started", 10, previous="first start"),
        ev("first_update", 20, update=1),
        ev("stopped", 100, cause="storage", reached=60, last_progress=80),
        ev("requeued", 100, by="task 0, held: scontrol release 41"),
        ev("started", 400, 1, resume_at=50, previous="storage: ..."),
        ev("first_update", 410, 1, update=51),
        ev("finished", 500, 1, reached=100, last_progress=500),
    ]
    g = goodput.account(events, now=999)
    assert g.wall_s == 500 and g.storage_s == 320 and g.queue_s == 10
    assert g.no_progress_s == 0 and g.startup_s == 10 + 10
    assert sum(g.parts.values()) == pytest.approx(g.wall_s)
    assert "storage 320 s" in g.describe()
