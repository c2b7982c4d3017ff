"""bench-soak's arithmetic and scripts on inputs the test writes (the benchmark is not a test)."""

from __future__ import annotations

import json
import shlex
import subprocess
import threading

from benchmarks import soak
from hpc_core import slurm
from hpc_core.ledger import Event
from hpc_core.wait import process_state


def ev(kind: str, t: float, **data) -> Event:
    return Event(kind, t, "7", 0, data)


def upd(n: int) -> str:
    return "2026-11-24 08:00:00 | INFO | train_inner | " + json.dumps(
        {"loss": "9.1", "num_updates": str(n)}
    )


# updates 1..10 at 1 s each, a crash at 10.5, a resume from the checkpoint at 6, updates 7..9
LINES = [(float(n), upd(n)) for n in range(1, 11)] + [
    (20.0, "| INFO | fairseq.checkpoint_utils | Loaded checkpoint /x/checkpoint_last.pt "
           "(epoch 1 @ 6 updates)"),
    *[(20.0 + n, upd(6 + n)) for n in range(1, 4)],
]  # fmt: skip


def test_updates_clean_rate_resume_and_recomputed_by_hand():
    updates = soak.updates_of(LINES)
    assert [u for _, u in updates] == [*range(1, 11), 7, 8, 9]
    assert soak.clean_s_per_update(updates, until=10.5) == 1.0
    assert soak.clean_s_per_update(updates, until=1.5) is None  # one update: no stretch
    resumed = soak.resume_in_log(LINES, after=10.5)
    assert resumed == (21.0, 7)
    assert soak.recomputed_at(updates, resumed) == 4  # 7..10 trained twice
    assert soak.duplicates(updates) == 3  # by the budget's end: 7, 8, 9 so far
    assert soak.resume_in_log(LINES, after=25.0) is None


def test_ledger_first_update_after_and_training_nodes():
    events = [
        ev("started", 0, nodes=["n1", "n2"], spares=["n3"]),
        ev("first_update", 5),
        ev("restarted", 30, members=["n1", "n3"], left_out=["n2"]),
        ev("first_update", 40),
    ]
    assert soak.first_update_after(events, 10) == 40
    assert soak.first_update_after(events, 41) is None
    assert soak.training_nodes(events) == ["n1", "n3"]
    assert soak.training_nodes(events[:2]) == ["n1", "n2"]


def test_schedule_scaled_keeps_order_and_kinds():
    scaled = soak.scaled(soak.SCHEDULE, 0.5)
    assert [k for _, k in scaled] == [k for _, k in soak.SCHEDULE]
    assert [o for o, _ in scaled] == [o * 0.5 for o, _ in soak.SCHEDULE]


def test_bare_scripts_parse_and_keep_fairseq_args(tmp_path):
    line = ("torchrun --nnodes=2 -m hpc_train.worker.train /d --adam-betas '(0.9, 0.98)' "
            "--save-dir /s --log-interval 1 --hpc-levers fused-adamw")  # fmt: skip
    args = soak.fairseq_args(line)
    assert args == ["/d", "--adam-betas", "(0.9, 0.98)", "--save-dir", "/s", "--log-interval", "1"]
    rank = soak.bare_rank_sh(args)
    for text in (soak.bare_script(2, tmp_path / "o", tmp_path / "t.sh", "low"),
                 soak.bare_train_sh(2, tmp_path / "r.sh"), rank):  # fmt: skip
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "--requeue" in soak.bare_script(2, tmp_path / "o", tmp_path / "t.sh", "low")
    assert shlex.quote("(0.9, 0.98)") in rank and "fairseq-train" in rank


def test_the_bare_jobs_port_is_the_toolkits_rule(tmp_path):
    """Beside the toolkit's jobs on the test clusters, the bare job's store must not take a
    port one of theirs may use: the same rule, in shell."""
    (export,) = [line for line in soak.bare_script(2, tmp_path / "o", tmp_path / "t.sh", "low")
                 .splitlines() if line.startswith("export PORT=")]  # fmt: skip
    for job in ("41", "1001024", "2002999"):
        said = subprocess.run(["bash", "-c", f"{export}; echo $PORT"], env={"SLURM_JOB_ID": job},
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert int(said) == slurm.rendezvous_port(job)


def test_training_again_needs_an_update_after_the_failure_and_a_recent_one():
    ups = [(10.0, 1), (11.0, 2), (12.0, 3)]
    assert soak.training_again(ups, None, now=12.5)
    assert not soak.training_again([], None, now=12.5)
    assert not soak.training_again(ups, None, now=15.0)  # nothing logged for 3 s: not training
    assert not soak.training_again(ups, 11.5, now=12.5)  # 3 came within 1 s of the failure
    assert soak.training_again([*ups, (13.0, 4)], 11.5, now=13.5)


def test_pick_target_spares_task_0_and_nodes_already_hit():
    assert soak.pick_target(["n1", "n2"], []) == "n2"
    assert soak.pick_target(["n1", "n2", "n3"], ["n3"]) == "n2"
    assert soak.pick_target(["n1", "n3"], ["n3"]) == "n3"  # none fresh but task 0's: hit again
    assert soak.pick_target(["n4"], []) == "n4"  # one node: task 0's is the only one


def test_replace_due_waits_its_time_and_leaves_allocated_nodes_alone():
    """The stand-in for clustermgtd: DOWN or DRAINED (idle) nodes after ``after_s``; a DRAINING
    node (still in a job's allocation) or a node back by itself is not replaced."""
    seen: dict[str, float] = {}
    states = {"n1": "alloc", "n2": "drain", "n3": "drng", "n4": "down*"}
    assert soak.replace_due(states, seen, 100.0, 60) == []
    assert seen == {"n2": 100.0, "n4": 100.0}
    assert soak.replace_due({**states, "n4": "idle"}, seen, 130.0, 60) == []
    assert "n4" not in seen  # back by itself: forgotten
    assert soak.replace_due({**states, "n4": "down*"}, seen, 160.0, 60) == ["n2"]
    assert soak.replace_due(states, seen, 220.0, 60) == ["n2", "n4"]
    assert soak.replace_due(states, {}, 0.0, 0.0) == ["n2", "n4"]  # the clean-up: at once


def test_each_failure_resumes_before_the_next_one():
    """A slow node that caused no restart must not be credited with the next failure's resume."""
    lines = [(float(n), upd(n)) for n in range(1, 11)] + [
        (30.0, "| INFO | fairseq.checkpoint_utils | Loaded checkpoint /x/checkpoint_last.pt "
               "(epoch 1 @ 9 updates)"),
        (31.0, upd(10)),
    ]  # fmt: skip
    window = [(t, s) for t, s in lines if t < 25.0]  # a slow node at 5, the next failure at 25
    assert soak.resume_in_log(window, 5.0) is None
    assert soak.resume_in_log(lines, 25.0) == (31.0, 10)
    events = [ev("first_update", 1), ev("first_update", 31)]
    assert soak.first_update_after(events, 5.0, 25.0) is None
    assert soak.first_update_after(events, 25.0) == 31


def test_failure_figures_pair_each_failure_with_the_next_and_none_is_no_error(tmp_path):
    """A short budget used up by a slow start injects nothing: no failures, not a crash (CI, at
    e11999a: ``zip() argument 2 is longer than argument 1``). Two failures: the first one's resume
    is looked for only before the second."""
    way = soak.Way("bare", "1", tmp_path / "log", tmp_path, toolkit=False)
    lines = [(float(n), upd(n)) for n in range(1, 6)] + [
        (12.0, "| INFO | fairseq.checkpoint_utils | Loaded checkpoint /x/checkpoint_last.pt "
               "(epoch 1 @ 4 updates)"),
        (13.0, upd(5)),
    ]  # fmt: skip
    updates = soak.updates_of(lines)
    assert soak._failure_figures(way, [], lines, updates, [], 20.0) == []
    done = [
        {"kind": "kill", "time": 5.5, "node": "n1"},
        {"kind": "hang", "time": 10.0, "node": "n2"},
    ]
    first, second = soak._failure_figures(way, done, lines, updates, [], 20.0)
    assert first["to_first_resumed_update_s"] is None  # its window ends at the second, at 10
    assert second["to_first_resumed_update_s"] == 3.0 and second["resumed_from_update"] == 4


def test_pooled_ideal_takes_a_way_whose_ranks_never_logged_as_no_steps(tmp_path):
    """A toolkit way whose start outlasted the budget has a ledger but no train.log yet: no
    steps of its own, not a crash; the other way's steady steps set the ideal."""
    logged = tmp_path / "logged"
    logged.mkdir()
    stamp = "2026-11-24 08:00:0{},{:03d} | INFO | train_inner | "
    times = [(0, 0), (0, 500), (1, 0), (1, 500)]  # seconds, milliseconds: 0.5 s apart
    lines = [stamp.format(s, ms) + json.dumps({"loss": "9", "num_updates": str(u)})
             for u, (s, ms) in enumerate(times, start=1)]  # fmt: skip
    (logged / "train.log").write_text("\n".join(lines) + "\n")
    begin = soak.logparse.line_time(lines[0]) or 0.0
    ways = {
        "slow": {"ledger": [{"time": begin}], "save_dir": str(tmp_path / "slow"), "failures": []},
        "in_job": {"ledger": [{"time": begin}], "save_dir": str(logged), "failures": []},
    }
    assert soak.pooled_ideal(ways, 60.0, 5.0) == 0.5
    assert ways["slow"]["steady_s_per_update"] is None


def test_the_bare_ways_ranks_are_found_and_throttled_on_their_node():
    """The bare job's ranks run ``fairseq-train`` (``hpc_train.chaos`` looks for the toolkit's):
    ``bare_ranks`` finds the rank of that job on that node, not torchrun nor another node's, and
    ``here(..., "slow")`` stops it part of the time and leaves it running (real processes)."""
    import os
    import sys
    import time

    def proc(node: str, *argv: str) -> subprocess.Popen:
        env = {**os.environ, "SLURM_JOB_ID": "5151", "SLURMD_NODENAME": node}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *argv],
                                env=env)  # fmt: skip

    rank = proc("n2", "/venv/bin/fairseq-train", "data")
    agent = proc("n2", "/venv/bin/torchrun", "--no-python", "fairseq-train")
    other = proc("n1", "/venv/bin/fairseq-train", "data")
    try:
        deadline = time.monotonic() + 10
        while not soak.bare_ranks("5151", "n2") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert soak.bare_ranks("5151", "n2") == [rank.pid]
        cycles = soak.here("5151", "n2", "slow", ["0.5", "0.5"])
        assert cycles > 5
        assert process_state(rank.pid) != "T"  # left running
        assert soak.here("5151", "n3", "slow", ["0.5", "0.5"]) == 0  # no rank there
    finally:
        for p in (rank, agent, other):
            p.kill()
            p.wait()


def test_steady_steps_leave_out_restarts_stalls_and_a_slow_nodes_window():
    """The pooled ideal's samples: u then u + 1 within a second, from the lines' own stamps."""
    stamp = "2026-11-26 10:06:{:02d},{:03d} | INFO | train_inner | "
    lines = [stamp.format(s, ms) + json.dumps({"loss": "9", "num_updates": str(u)})
             for s, ms, u in [(1, 0, 1), (1, 100, 2), (1, 300, 3), (5, 0, 4), (5, 100, 2),
                              (5, 200, 3), (5, 300, 4), (6, 0, 5)]]  # fmt: skip
    unstamped = "| INFO | train_inner | " + json.dumps({"loss": "9", "num_updates": "9"})
    ups = soak.logged_updates([unstamped, *lines])
    assert [u for _, u in ups] == [1, 2, 3, 4, 2, 3, 4, 5]
    steps = soak.steady_steps(ups, [])
    # 1->2, 2->3, then 3->4 took 3.7 s (a stall), 4->2 is a resume; 2->3, 3->4, 4->5 (0.7 s)
    assert [round(x, 3) for x in steps] == [0.1, 0.2, 0.1, 0.1, 0.7]
    t0 = ups[0][0]
    slow = [(t0 + 4.0, t0 + 4.25)]  # the throttle: the steps that began inside it are left out
    assert [round(x, 3) for x in soak.steady_steps(ups, slow)] == [0.1, 0.2, 0.7]


def test_the_result_says_the_requeue_hold_it_ran_under_beside_parallelclusters(monkeypatch):
    """A soak on the tests' cluster (10 s hold, a scheduling pass every 2 s) must not pass for
    one on ParallelCluster (70 s, or 10 s with the shipped configs; Slurm's scheduling defaults).
    (The machine's description, which asks Slurm for its version, is a constant here.)"""
    import argparse

    monkeypatch.setattr(soak, "machine", lambda: {"cpus": 2})
    args = argparse.Namespace(budget_s=1200, scale=1.0, hold_s=10, taken_s=30,
                              max_update=100000, slow_factor=0.5, slow_s=150, replace_s=60,
                              requeue_hold_s=10.0,
                              scheduler_parameters="bf_interval=2,sched_interval=2")  # fmt: skip
    result = soak.summarize({}, args, 0.0, (0.0, 0.0, 0.0))
    assert result["settings"]["requeue_hold_s"] == 10.0
    rows = {r[0]: r[1:] for r in soak.summary_rows(result)}
    assert rows["a requeue's hold (s)"] == (
        "10",
        "ParallelCluster 70; shipped configs 10 (Slurm 25.11)",
    )
    assert rows["SchedulerParameters"][0] == "bf_interval=2,sched_interval=2"
    assert soak.slurm.PCLUSTER_CRED_EXPIRE_S == 70


def test_the_stand_in_for_clustermgtd_says_why_it_cannot_replace_a_node(monkeypatch, capsys):
    """Seen in a soak (2026-11-26): `cluster.sh up` refused (another requeue hold), the error was
    swallowed and no node came back all run. Now each distinct failure is said once. (Slurm's
    node states and the restart are fakes here: the test is about the thread's reporting.)"""
    import subprocess as sp

    polls = threading.Semaphore(0)

    def drained() -> dict[str, str]:
        polls.release()
        return {"n2": "drain"}

    monkeypatch.setattr(soak, "REPLACE_POLL_S", 0.01)
    monkeypatch.setattr(soak, "node_states", drained)

    def refused(node):
        raise sp.SubprocessError("cluster.sh up: error: the cluster is up with another hold")

    monkeypatch.setattr(soak, "bring_back", refused)
    with soak.Replacer(0.0) as replacer:
        for _ in range(20):  # 20 polls that each found n2 drained and failed to bring it back
            assert polls.acquire(timeout=30)
    out = capsys.readouterr().out
    assert out.count("the stand-in for clustermgtd failed: cluster.sh up: error: the cluster") == 1
    assert replacer.replaced == []


def test_requeue_waits_go_from_each_requeue_to_the_next_start_less_the_hold():
    """Where a requeue's time goes: requeued at 100, started at 135 with a 10 s hold: 25 s
    beyond it (a scheduling pass, the launch); an in-job restart is no requeue; a requeue with
    no start after it (the budget ended) is not counted."""
    rows = [
        {"kind": "started", "time": 0.0},
        {"kind": "stopped", "time": 99.9, "cause": "notice"},
        {"kind": "requeued", "time": 100.0},
        {"kind": "started", "time": 135.0},
        {"kind": "stopped", "time": 200.0, "cause": "crash"},
        {"kind": "restarted", "time": 200.1},
        {"kind": "started", "time": 203.0},
        {"kind": "stopped", "time": 300.0, "cause": "hang"},
        {"kind": "requeued", "time": 300.5},
        {"kind": "started", "time": 320.5},
        {"kind": "stopped", "time": 400.0, "cause": "notice"},
        {"kind": "requeued", "time": 400.0},
    ]
    waits = soak.requeue_waits(rows, 10.0)
    assert waits == [
        {"after": "notice", "waited_s": 35.0, "beyond_hold_s": 25.0},
        {"after": "hang", "waited_s": 20.0, "beyond_hold_s": 10.0},
    ]
    assert soak.mean_wait(waits) == 27.5 and soak.mean_wait([]) is None
    assert soak.requeue_waits(rows, None)[0]["beyond_hold_s"] is None
