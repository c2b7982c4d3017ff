"""The scale benchmark's own arithmetic (``benchmarks.scale``), on files written by the test with
times it chose: no cluster (the real run is ``test_smoke.py``'s bench-scale smoke)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from benchmarks import scale
from benchmarks import scale_probe as probe
from hpc_core.rundir import RunDir, incident_report
from hpc_train.contract import StartFiles


def test_a_hangs_teardown_is_the_last_report_to_the_last_exit_record(tmp_path):
    """Three nodes report the hang at 10.0, 10.4 and 10.2 s; their exit records land at 11.0,
    13.5 and 12.0 s (one spare, task 3, runs no torchrun: no record). The teardown is 13.5 -
    10.4 = 3.1 s; with a record missing it is not said."""
    files = StartFiles(RunDir(tmp_path), "41.1", 0)
    files.incident.mkdir(parents=True)
    for node, at in (("n1", 1000.0), ("n2", 1000.4), ("n3", 1000.2)):
        incident_report(files.incident, node).write_text(json.dumps({"node": node, "time": at}))
    job = SimpleNamespace(nodes=4)
    for task, at in ((0, 1001.0), (1, 1003.5)):
        path = files.node_exit(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        os.utime(path, (at, at))
    assert scale.teardown(job, files) is None  # n3's record not in yet
    files.node_exit(2).write_text("{}")
    os.utime(files.node_exit(2), (1002.0, 1002.0))
    assert scale.teardown(job, files) == 3.1


def steady_of(task0_mb: float, last_mb: float, ops: dict, per_update: int, seconds: float) -> dict:
    memory = {"task0": {"node_mb": task0_mb}, "last": {"node_mb": last_mb}}
    return {"rounds": {"steady": {
        "memory": memory,
        "file_ops_per_update": {"last": {k: v / per_update for k, v in ops.items()} | {"updates": per_update}},
        "file_ops_per_second": {"last": {k: v / seconds for k, v in ops.items()} | {"seconds": seconds}},
    }}}  # fmt: skip


def test_task_0s_extra_memory_is_counted_once_and_file_ops_per_update_and_per_second():
    """Task 0's launcher holds the checkpoint readers' imports: 100 nodes of 200 MB and one
    task 0 of 500 MB fit where 200 x 101 + 300 does (not 101 x 500); the steady window's 12
    reads and 8 stats in 4 s over 10 updates are 2 an update and 5 a second."""
    result = {"hollow": {"2": steady_of(500, 200, {"read": 12, "stat": 8}, 10, 4.0)}}
    extra = scale.task0_extra_mb(result)
    assert abs(scale.node_mb(result) - 200 * scale.MARGIN) < 1e-9
    assert abs(extra - 300 * scale.MARGIN) < 1e-9
    fits, said = scale.fitting([2, 64], scale.node_mb(result), 101 * 220 + 331, extra)
    assert said["most_nodes"] == 100 and fits == [2, 64] and said["task0_extra_mb"] == 330
    size = result["hollow"]["2"]
    assert scale.file_ops(size, "last") == 2.0 and scale.file_ops(size, "last", "second") == 5.0


def test_a_requeues_launchers_coming_up_are_the_first_launcher_to_the_last_nodes_report(tmp_path):
    """The next start's node reports (written as each launcher begins) at times the test chose:
    launchers up = the last report - the first launcher's start, taken out of the toolkit share
    and said beside it; a report missing: not measured, nothing taken out."""
    run = RunDir(tmp_path)
    files = StartFiles(run, "7", 1, 0)
    for task, at in ((0, 1000.4), (1, 1003.0), (2, 1001.5)):
        path = run.node_report("7", 1, task)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        os.utime(path, (at, at))
    assert scale.launchers_up(files, 3, 1000.0) == 3.0
    assert (
        scale.launchers_up(files, 4, 1000.0) is None and scale.launchers_up(files, 3, None) is None
    )
    out = {"toolkit_s": 5.5}
    scale.said_apart(out, "launchers_up", 3.0)
    assert out == {"toolkit_s": 2.5, "launchers_up_s": 3.0, "toolkit_with_launchers_up_s": 5.5}
    kept = {"toolkit_s": 5.5}
    scale.said_apart(kept, "teardown", None)
    assert kept == {"toolkit_s": 5.5, "teardown_s": None}


def test_a_nodes_file_operations_are_split_by_what_paces_them(tmp_path):
    """strace lines the test wrote: a rank's heartbeat written (a temporary, a rename), the
    notice file it looks for and a checkpoint are paced by updates; the hang monitor's read of a
    heartbeat and its look for a declaration, a launcher's beat, by the clock; a path outside
    the save dir is not counted. 4 update-paced in 2 updates, 3 polls in 1.5 s."""
    root = tmp_path / "save"
    hb = f"{root}/.hpc-train/heartbeats/7-0/s1"
    lines = [
        f'11 openat(AT_FDCWD, "{hb}/.rank-0.json.11.tmp", O_WRONLY|O_CREAT|O_EXCL, 0644) = 3',
        f'11 rename("{hb}/.rank-0.json.11.tmp", "{hb}/rank-0.json") = 0',
        f'11 newfstatat(AT_FDCWD, "{root}/.hpc-train/notice-7-0.json", 0x7ff, 0) = -1 ENOENT',
        f'11 openat(AT_FDCWD, "{root}/checkpoint_last.pt", O_RDONLY|O_CLOEXEC) = 4',
        f'12 openat(AT_FDCWD, "{hb}/rank-0.json", O_RDONLY|O_CLOEXEC) = 5',
        f'12 openat(AT_FDCWD, "{root}/.hpc-train/incidents/7-0/hang.json", O_RDONLY) = -1 ENOENT',
        f'13 openat(AT_FDCWD, "{root}/.hpc-train/launchers/.7-0-task0.json.13.tmp", O_WRONLY|O_CREAT, 0644) = 6',
        '12 openat(AT_FDCWD, "/usr/lib/python3.11/json/__init__.py", O_RDONLY) = 7',
    ]  # fmt: skip
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(lines) + "\n")
    counts = probe.count_by_pace(probe.traced_ops(trace, root))
    assert counts == {"update": 4, "clock": 3}
    assert scale.by_pace(counts, 2, 1.5) == {"per_update": 2.0, "polls_per_second": 2.0}
    assert scale.by_pace(counts, 0, 1.5)["per_update"] is None


def test_a_notices_ranks_saving_is_said_apart_once():
    """A notice at 0, the save recorded at 0.45 s, the requeue at 0.65 s: the toolkit's share is
    the save -> the requeue (0.2 s), the ranks' 0.45 s said beside it; a second pass (the
    ``--reanalyze`` of a result that has it) takes nothing more out."""
    notice = {"saved_s": 0.45, "toolkit_s": 0.65}
    scale.ranks_save_apart(notice)
    scale.ranks_save_apart(notice)
    assert notice == {"saved_s": 0.45, "toolkit_s": 0.2, "ranks_save_s": 0.45,
                      "toolkit_with_ranks_save_s": 0.65}  # fmt: skip


def test_a_crashs_agents_going_down_and_its_torchruns_starting_are_said_apart_once(tmp_path):
    """Exit records at times the test chose: task 0's at 100.0 (it saw the crash), n2's at
    100.1, n3's at 100.18, n4's at 101.0, after task 0 stopped at 100.2: the agents going down
    while task 0 waited are 0.18 s; n4's came after its decision (at 100.22: 0.78 s the next
    round waited for n4's agent, said apart too; none when the decision came after it); the
    torchruns started 13.81 -> 14.05 s after the fault: 0.24 s. Out of the toolkit's 0.51 s,
    once."""
    run = RunDir(tmp_path)
    files = StartFiles(run, "7", 0, 0)
    for task, at in ((0, 100.0), (1, 100.1), (2, 100.18), (3, 101.0)):
        path = files.node_exit(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        os.utime(path, (at, at))
    assert scale.agents_down(files, 4, 100.0, 100.2) == 0.18
    assert scale.agents_down(files, 4, 100.0, 100.2, 100.22) == 0.18 + 0.78
    assert scale.agents_down(files, 4, 100.0, 100.2, 101.5) == 0.18
    assert scale.agents_down(files, 4, 100.0, 100.05) == 0.0  # none after task 0's, by then
    assert scale.agents_down(files, 4, None, 100.2) is None
    at = {"seen": 13.53, "stopped": 13.73, "decided": 14.5, "first_torchrun": 14.6,
          "last_torchrun": 14.84}  # fmt: skip
    requeue = {"toolkit_s": 0.51, "at": at}  # its old agents go down during Slurm's hold
    for _ in range(2):  # the run's, then a --reanalyze of its result
        scale.shutdown_and_startup_apart(requeue, files, 4, 100.0 - 13.53, round_=False)
    assert (requeue["agents_down_s"], requeue["torchruns_up_s"], requeue["toolkit_s"]) == (
        0.18, 0.24, 0.09)  # fmt: skip
    at = {**at, "decided": 13.75}  # the round waits 0.78 s for n4's agent after it decided
    # said apart before as it was derived then (0.18 s): put back, then derived anew
    kill_round = {"toolkit_s": 1.11, "at": at, "agents_down_s": 0.18,
                  "toolkit_with_agents_down_s": 1.29}  # fmt: skip
    scale.shutdown_and_startup_apart(kill_round, files, 4, 100.0 - 13.53, round_=True)
    assert (kill_round["agents_down_s"], kill_round["toolkit_s"]) == (0.96, 0.09)
    assert kill_round["toolkit_with_agents_down_s"] == 1.29


def test_a_process_first_seen_as_its_parents_fork_is_looked_at_again(monkeypatch):
    """The scanner may first see a rank between torchrun's fork and its exec (torchrun's command
    line): it looks at the command line again at its next scans, however old the process is by
    then (a scan starved of the cores while 16 nodes started came after ``YOUNG_S``: the rank
    stayed an agent, and the benchmark found none to kill). A real process of this machine,
    its command line a rank's."""
    import subprocess
    import sys
    import time

    module = next(iter(probe.WORKER_MODULES))
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", module],
                            env={**os.environ, probe.JOB_ID: "7"})  # fmt: skip
    try:
        monkeypatch.setattr(probe, "YOUNG_S", 0.0)  # old at once: only the looks count
        scanner = probe.Scanner(jobs={"7"})
        scanner.procs[rank.pid] = probe.Proc(rank.pid, "7", "n1", "agent", time.time() - 100)
        scanner.scan()
        assert probe.kind_of(probe.cmdline_of(rank.pid)) == "rank"
        assert scanner.live("7", "rank") and not scanner.live("7", "agent")
    finally:
        rank.kill()
        rank.wait()


def test_a_decision_is_read_from_task_0s_last_weighed_line_by_its_ledger_time(tmp_path):
    """The benchmark splits a decision by task 0's own account (``recovery.Weighed``, a line of
    its log): the last ``weighed:`` line stamped by the time the decision is in the ledger, not
    a later round's; None where the log has none by then."""
    from hpc_train.launch.recovery import Weighed

    run = RunDir(tmp_path)
    log = run.task_log("41", 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    kill = Weighed("InJobRound", 0.27, read_s=0.02, questions=1, slurm_s=0.21, slowest="step n2",
                   slowest_s=0.2)  # fmt: skip
    hang = Weighed("InJobRound", 0.05, read_s=0.01, questions=1, slurm_s=0.03)
    log.write_text(
        "[2026-11-30T01:00:09Z] hpc-train n1: job 41: torchrun exited with 1\n"
        f"[2026-11-30T01:00:10Z] hpc-train n1: {kill.line()}\n"
        f"[2026-11-30T01:02:10Z] hpc-train n1: {hang.line()}\n"
    )
    decided = 1796000410.4  # 2026-11-30T01:00:10.4Z
    assert scale.weighing(run, "41", decided) == {**kill.__dict__}
    assert scale.weighing(run, "41", decided + 120) == {**hang.__dict__}
    assert scale.weighing(run, "41", decided - 2) is None


def test_each_kill_is_read_from_its_own_decision_and_the_median_kill_is_the_sizes_figure(tmp_path):
    """Three kills -> in-job rounds and a hang in one rounds job, one requeue: each decision is
    found in the ledger after its own fault (``decision_after``) and read from the ``weighed:``
    line task 0 logged by then, its CPU beside (``decision_cpu_s``); the size's kill figure is
    the kill with the median toolkit share (0.9 of 0.2, 0.9, 3.1), each share listed; a
    reanalysis picks the same again; a kill with no decision in the ledger yet is not read."""
    from hpc_core import ledger
    from hpc_core.ledger import Kind
    from hpc_train.launch.recovery import Weighed

    base = 1796000400.0  # 2026-11-30T01:00:00Z
    lines = {}
    for name, kind, decided in (("rounds", Kind.RESTARTED, (10, 70, 130, 200)),
                                ("requeue", Kind.REQUEUED, (15,))):  # fmt: skip
        run = RunDir(scale.save_dir(tmp_path, name, True, 2))
        for n, at in enumerate(decided):
            ledger.record(run.ledger, kind, "41", 0, when=base + at + 0.5,
                          **({"round": n + 1} if kind == Kind.RESTARTED else {}))  # fmt: skip
        log = run.task_log("41", 0)
        log.parent.mkdir(parents=True, exist_ok=True)
        lines[name] = [
            Weighed(kind.name, 0.1 + n, cpu_s=0.01 * (n + 1)) for n in range(len(decided))
        ]
        log.write_text("".join(
            f"[2026-11-30T01:{at // 60:02d}:{at % 60:02d}Z] hpc-train n1: {w.line()}\n"
            for at, w in zip(decided, lines[name], strict=True)))  # fmt: skip
    kills = [{"fault_at": base + at, "toolkit_s": share, "at": {"decided": 0.5}}
             for at, share in ((9, 0.2), (69, 3.1), (129, 0.9))]  # fmt: skip
    size = {"rounds": {"job": "41", "kill_rounds": kills,
                       "hang": {"fault_at": base + 160, "at": {}}},
            "requeue": {"job": "41", "kill_requeue": {"fault_at": base + 14}}}  # fmt: skip
    scale.weighings(size, tmp_path, True, 2)
    assert [k["weighed"]["total_s"] for k in kills] == [0.1, 1.1, 2.1]
    assert [k["decision_cpu_s"] for k in kills] == [0.01, 0.02, 0.03]
    assert size["rounds"]["hang"]["decision_cpu_s"] == 0.04
    assert size["requeue"]["kill_requeue"]["weighed"]["transition"] == "REQUEUED"
    scale.median_kill(size)
    chosen = size["rounds"]["kill_round"]
    assert chosen["toolkit_s"] == 0.9 and chosen["decision_cpu_s"] == 0.03
    assert chosen["toolkit_s_each"] == [0.2, 3.1, 0.9]
    again = json.loads(json.dumps(size))  # as a reanalysis reads it back
    scale.median_kill(again)
    assert again["rounds"]["kill_round"] == chosen
    two = {"rounds": {"kill_rounds": kills[:2]}}
    scale.median_kill(two)
    assert two["rounds"]["kill_round"]["toolkit_s"] == 0.2  # the lower of two
    rounds = ledger.read(RunDir(scale.save_dir(tmp_path, "rounds", True, 2)).ledger)
    assert scale.decision_after(rounds, Kind.RESTARTED, base + 300) is None
    assert scale.decision_after(rounds, Kind.RESTARTED, None) is None


def test_a_reanalysis_derives_two_figures_said_apart_as_the_run_did():
    """A kill's agents going down (1.4 s) and torchruns starting (0.2 s) are said apart from its
    2.0 s share, in that order; a reanalysis puts both back (``put_back``, the last first) and
    says them apart again: the same figures, the whole kept beside the first one still 2.0 s
    (putting back one at a time had kept 1.8 s there: the second still taken out)."""
    out = {"toolkit_s": 2.0}
    scale.said_apart(out, "agents_down", 1.4)
    scale.said_apart(out, "torchruns_up", 0.2)
    ran = dict(out)
    assert ran["toolkit_with_agents_down_s"] == 2.0 and ran["toolkit_s"] == 0.4
    scale.put_back(out, "agents_down", "torchruns_up")
    assert out == {"toolkit_s": 2.0}
    scale.said_apart(out, "agents_down", 1.4)
    scale.said_apart(out, "torchruns_up", 0.2)
    assert out == ran
