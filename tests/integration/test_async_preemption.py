"""A preemption that lands while a background checkpoint write is in flight still loses 0 updates
(issue 11; real Slurm, tiny preset, 2 emulated nodes, async saves).

On this box a tiny checkpoint is written in ~10 ms, so a write is made slow on purpose:
``hpc-train chaos JOB slow-save --seconds 6`` (every background write of the run sleeps 6 s
first, the rehearsal of a slow FSx). Saves every 10 updates; once the log shows a periodic
save's write begun (update >= 20) and not finished, the job is preempted through the ``high``
partition. The save on notice must first wait for that write (one save in flight), then write
its own checkpoint, slow too, before the stop marker lets the launcher requeue.

Why S = 6 and ``HPC_TRAIN_SAVE_WAIT_S=28``. The ``low`` partition's GraceTime is 30 s: after it
Slurm requeues the job whatever the launcher does. Worst case from the signal: the signal lands
just after a save point's agreement, so that periodic save waits for the one in flight (<= S),
queues its own (S), and the notice is agreed one update later; the save on notice then flushes
that write (S) and writes its own (S is slept only once per write: <= 3 S with the first wait).
3 x 6 = 18 s plus a few updates and fsyncs fits in the launcher's 28 s, which fits in the 30 s
grace; S = 8 (24 s + overheads) would leave no margin on a loaded 2-core box. The launcher's
default wait would come from the ledger's measured saves (slow ones here), so it is pinned.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.worker import checkpoints

MAX_UPDATE = 50  # the preemption lands at ~20-35; the epoch (~58 updates) never ends
SLOW_S = 6
SAVE_WAIT_S = 28  # < the low partition's GraceTime (30 s); see the module docstring
FLAGS = ("--log-interval", "1")  # one loss line per update: compare update by update
SNAPSHOT = re.compile(r"snapshot for (\S*checkpoint_\d+_(\d+)\.pt) in [\d.]+ s; writing in the")
NOTICE = re.compile(r"notice \(\w+\): saving at update (\d+) and stopping")


def write_in_flight(log: str, at_least: int = 0) -> int | None:
    """The update of a periodic checkpoint (>= ``at_least``) whose background write ``log``
    shows begun (its snapshot) and not finished (no "wrote" line after it); None: none."""
    for m in SNAPSHOT.finditer(log):
        if int(m.group(2)) >= at_least and f"wrote {m.group(1)} " not in log[m.end() :]:
            return int(m.group(2))
    return None


def test_write_in_flight_reads_the_writers_lines():
    begun = "snapshot for /r/checkpoint_1_20.pt in 0.00 s; writing in the background\n"
    done = "wrote /r/checkpoint_1_20.pt in the background in 6.01 s\n"
    assert write_in_flight(begun) == 20 and write_in_flight(begun, at_least=30) is None
    assert write_in_flight(begun + done) is None


def hpc_train_chaos(*argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "chaos", *argv],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return proc.stdout


@pytest.fixture(scope="module")
def preempted_mid_write(runs):
    """The run, the update of the periodic save whose write was in flight when the preemptor
    was submitted, and the final job state."""
    runs.wait_idle_nodes(2)
    job, save = runs.submit(
        "async-preempted", MAX_UPDATE, fairseq=FLAGS,
        extra_cli=("--save-interval", "10"), env={"HPC_TRAIN_SAVE_WAIT_S": str(SAVE_WAIT_S)},
    )  # fmt: skip
    assert f"sleep {SLOW_S} s first" in hpc_train_chaos(job, "slow-save", "--seconds", str(SLOW_S))
    log = RunDir(save).train_log
    found: dict[str, int] = {}

    def in_flight() -> bool:
        text = log.read_text() if log.exists() else ""
        update = write_in_flight(text, at_least=20)
        if update is not None:
            found["update"] = update
        return update is not None

    runs.wait_for("a periodic save's slow write in flight (update >= 20)", in_flight, 300)
    runs.wait_running(job)
    chaos.preempt(job, partition="high", hold_s=2)
    runs.wait_for("the save on notice", lambda: len(runs.notices(save)) > 0, 120)
    hpc_train_chaos(job, "slow-save", "--seconds", "0")  # the resumed start trains at full pace
    final = runs.wait_done(job)
    return job, save, found["update"], final


def test_a_preemption_during_a_background_write_loses_no_update(preempted_mid_write, runs):
    job, save, _, final = preempted_mid_write
    assert final.state == "COMPLETED", runs.explain(save, job)
    assert runs.summary(save).updates == MAX_UPDATE
    assert checkpoints.num_updates(checkpoints.load(save / checkpoints.LAST)) == MAX_UPDATE
    notices = runs.notices(save)
    assert len(notices) == 1, notices
    assert runs.trained_updates(save) == list(range(1, MAX_UPDATE + 1))  # 0 recomputed
    assert runs.summary(save).resumed_at == notices  # the resumed start began at the notice
    starts = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "started"]
    assert [s.get("resume_at") for s in starts[1:]] == notices


def test_the_notice_landed_on_a_write_in_flight_and_waited_for_it(preempted_mid_write, runs):
    """The premise, from the worker's own lines: when the notice was agreed a periodic write
    had begun and not finished; its "wrote" line comes before "saved on notice"."""
    job, save, submitted_at, _ = preempted_mid_write
    log = RunDir(save).train_log.read_text()
    notice = NOTICE.search(log)
    assert notice is not None, runs.explain(save, job)
    pending = write_in_flight(log[: notice.start()])
    assert pending is not None and pending >= submitted_at, runs.explain(save, job)
    wrote = log.index(f"checkpoint_1_{pending}.pt in the background in", notice.end())
    assert wrote < log.index("saved on notice at update", notice.end())
    took = re.search(r"saved on notice at update \d+ in [\d.]+ s \(([\d.]+) s after the sig", log)
    assert took is not None and float(took.group(1)) < SAVE_WAIT_S
    assert "the save on notice is durable" in runs.launcher_log(save, job)


def test_the_ledger_records_the_notice_save_after_the_slow_periodic_one(preempted_mid_write, runs):
    _, save, _, _ = preempted_mid_write
    events = ledger.read(RunDir(save).ledger)
    saves = [e for e in events if e.kind == "checkpoint"]
    on_notice = [e for e in saves if e.get("notice")]
    assert [e.get("update") for e in on_notice] == runs.notices(save)
    assert on_notice[0].get("write_s") >= SLOW_S  # the notice's own write was slow too
    before = saves[: saves.index(on_notice[0])]
    assert before and not before[-1].get("notice") and before[-1].get("write_s") >= SLOW_S
    assert [e.get("saved") for e in events if e.kind == "stopped"] == [True]


def test_the_slow_save_rehearsal_is_a_file_of_the_run(preempted_mid_write):
    _, save, _, _ = preempted_mid_write
    assert not RunDir(save).chaos_slow_save.exists()  # `--seconds 0` ended it
    assert RunDir(save).train_log.read_text().count("chaos slow-save: writing") >= 3
