"""`hpc-train status`: rows from the ledger, train.log and Slurm's word (faked here: Slurm's
state is an input of ``index.status_of``; the real-Slurm path is in tests/integration)."""

from __future__ import annotations

import json

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train.contract import StartFiles
from hpc_train.runs import index, status


def loss_line(n: int, loss: float) -> str:
    payload = {"loss": str(loss), "num_updates": str(n)}
    return f"2026-11-22 10:00:00 | INFO | train_inner | {json.dumps(payload)}"


def make_run(root, job: str, updates: int, finished: bool, t0: float = 1000.0) -> RunDir:
    run = RunDir(root)
    run.state.mkdir(parents=True)
    lines = [loss_line(n, 10 - n / 10) for n in range(1, updates + 1)]
    run.train_log.write_text("\n".join(lines) + "\n")
    ledger.record(run.ledger, "submitted", job, 0, when=t0, max_update=100, name=f"run{job}")
    ledger.record(run.ledger, "started", job, 0, when=t0 + 10, previous="first start")
    ledger.record(run.ledger, "first_update", job, 0, when=t0 + 20, update=1)
    ledger.record(run.ledger, "checkpoint", job, 0, when=t0 + 50, update=30, seconds=2.0)
    if finished:
        ledger.record(run.ledger, "finished", job, 0, when=t0 + 120)
    ledger.index_run(job, run.root, f"run{job}", 100)
    return run


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    done = make_run(tmp_path / "a", "11", 100, finished=True)
    going = make_run(tmp_path / "b", "12", 40, finished=False)
    said = {"11": slurm.JobState("11", "GONE", 0, "", ""),
            "12": slurm.JobState("12", "RUNNING", 0, "n[1-2]", "")}  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    return done, going


def test_status_json_on_two_runs_at_once(two_runs, capsys, monkeypatch):
    monkeypatch.setattr(status.time, "time", lambda: 1100.0)
    assert status.main(["--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    done, going = rows["11"], rows["12"]
    assert done["state"] == "COMPLETED"  # Slurm forgot it: the ledger says, in Slurm's word
    assert done["updates"] == 100 and done["goodput"]["wall_s"] == 120
    assert done["goodput"]["ettr"] == pytest.approx((120 - 20 - 2) / 120)
    assert done["eta_s"] is None
    assert going["state"] == "RUNNING" and going["nodes"] == "n[1-2]"
    assert going["updates"] == 40 and going["last_loss"] == pytest.approx(6.0)
    assert going["checkpoint_update"] == 30 and going["checkpoint_age_s"] == 50
    # 39 updates in the 80 s since the first one: 60 to go
    assert going["eta_s"] == pytest.approx(60 * 80 / 39)


def test_status_table_and_one_run_in_detail(two_runs, capsys):
    done, _ = two_runs
    assert status.main([]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == status.HEADER and len(table) == 3
    assert table[1].split()[:3] == ["11", "run11", "COMPLETED"]
    assert status.main([str(done.root)]) == 0
    detail = capsys.readouterr().out
    assert "save dir:" in detail and "ETTR 82% of 120 s" in detail


def test_restarts_and_their_causes_show(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "r", "21", 50, finished=False)
    ledger.record(run.ledger, "stopped", "21", 0, when=1100.0, cause="notice")
    ledger.record(run.ledger, "started", "21", 1, when=1130.0, resume_at=30,
                  previous="saved on notice (SIGUSR2) at update 30")  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: {})
    assert status.main(["21"]) == 0
    out = capsys.readouterr().out
    assert "1 (saved on notice)" in out
    assert "restart 1: resumed at update 30; before it: saved on notice (SIGUSR2)" in out


def test_no_runs_yet_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "empty"))
    assert status.main([]) == 0
    assert "hpc-train submit" in capsys.readouterr().out


def test_an_unknown_run_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(index.slurm, "job_info", lambda job: None)
    with pytest.raises(SystemExit) as exit_:
        status.main(["999"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("hpc-train status: error: job 999: not in your")


def test_a_job_id_slurm_still_knows_finds_its_save_dir(tmp_path, monkeypatch):
    """Not in the index (submitted by hand): Slurm's StdOut path points into <save>/slurm/."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "empty"))
    out = RunDir(tmp_path / "save").task_log("77", 0)
    monkeypatch.setattr(
        index.slurm, "job_info", lambda job: {"StdOut": str(out), "JobName": "by-hand"}
    )
    found = index.resolve("77")
    assert (found.save_dir, found.job, found.name) == (tmp_path / "save", "77", "by-hand")


def test_a_straggler_shows_in_the_one_run_view(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "s", "31", 50, finished=False)
    ledger.record(run.ledger, "straggler", "31", 0, when=1060.0, node="n2", ratio=1.4,
                  seconds=300, compute_s=0.14, median_s=0.1)  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: {})
    assert status.main(["31"]) == 0
    out = capsys.readouterr().out
    said = "straggler: n2 1.40x the other nodes' median compute for 300 s (job 31, start #1)"
    assert said + "\n" in out
    ledger.record(run.ledger, "blamed", "31", 0, when=1061.0, node="n2", why="straggler: ...",
                  cause="straggler")  # fmt: skip
    assert status.main(["31"]) == 0
    assert "for 300 s (job 31, start #1); evicted" in capsys.readouterr().out


def test_blamed_nodes_show_with_drain_and_quarantine_and_in_json(tmp_path, monkeypatch, capsys):
    """The morning view accounts for every node the run blamed: why, which start, drained,
    quarantined after a second blame within a day; a straggler's eviction is not listed twice."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "b", "41", 50, finished=False)
    ledger.record(run.ledger, "blamed", "41", 0, when=1030.0, node="n3",
                  why="hang: rank 2 made no progress for 300 s", drained=True)  # fmt: skip
    ledger.record(run.ledger, "blamed", "41", 1, when=1090.0, node="n3",
                  why="torchrun on n3 was killed (SIGKILL)", drained=False)  # fmt: skip
    ledger.record(run.ledger, "straggler", "41", 2, when=1095.0, node="n4", ratio=2.5, seconds=30)
    ledger.record(run.ledger, "blamed", "41", 2, when=1096.0, node="n4",
                  why="straggler: 2.50x", drained=True, cause="straggler")  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: {})
    assert status.main(["41"]) == 0
    out = capsys.readouterr().out.splitlines()
    named = [line for line in out if line.startswith(("blamed:", "straggler:"))]
    assert named == [
        "blamed: n3: hang: rank 2 made no progress for 300 s (job 41, start #1); drained;"
        " quarantined",
        "blamed: n3: torchrun on n3 was killed (SIGKILL) (job 41, start #2); quarantined",
        "straggler: n4 2.50x the other nodes' median compute for 30 s (job 41, start #3); evicted",
    ]
    assert status.main(["41", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert [(n["node"], n["kind"], n["drained"], n["quarantined"]) for n in row["nodes_named"]] == [
        ("n3", "blamed", True, True), ("n3", "blamed", False, True), ("n4", "straggler", False, False)
    ]  # fmt: skip


def test_a_run_slurm_forgot_and_one_it_remembers_completed_say_the_same_word(
    tmp_path, monkeypatch, capsys
):
    """One word for a run that ended well: Slurm's COMPLETED, whether Slurm still remembers
    the job or only the ledger says it finished."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    make_run(tmp_path / "a", "61", 100, finished=True)
    make_run(tmp_path / "b", "62", 100, finished=True)
    said = {"61": slurm.JobState("61", "GONE", 0, "", ""),
            "62": slurm.JobState("62", "COMPLETED", 0, "n[1-2]", "")}  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    assert status.main(["--json"]) == 0
    assert {r["job"]: r["state"] for r in json.loads(capsys.readouterr().out)} == {
        "61": "COMPLETED", "62": "COMPLETED"
    }  # fmt: skip


SCONTROL_JOBS = "\n".join([
    "JobId=71 JobName=run71 JobState=RUNNING Reason=None Restarts=0 NodeList=n[1-2]",
    "JobId=72 JobName=run72 JobState=PENDING Reason=BeginTime Restarts=1 NodeList=(null)",
    "JobId=5 JobName=someone-else JobState=RUNNING Reason=None Restarts=0 NodeList=n3",
])  # fmt: skip


def test_status_asks_slurm_once_for_all_its_runs(tmp_path, monkeypatch, capsys):
    """Three runs, one query (``slurm.job_states``: `scontrol show job -o`, after a ping that
    answers at once); a job Slurm forgot takes its state from the ledger."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    for job, finished in (("71", False), ("72", False), ("73", True)):
        make_run(tmp_path / job, job, 40, finished=finished)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    asked: list[list[str]] = []

    def fake_run(args, timeout=30.0, check=True):  # a fake Slurm: no Slurm here
        asked.append(list(args))
        if list(args) == ["scontrol", "ping"]:
            return "Slurmctld(primary) at vm is UP\n"
        assert list(args) == ["scontrol", "show", "job", "-o"], args
        return SCONTROL_JOBS + "\n"

    monkeypatch.setattr(slurm, "run", fake_run)
    assert status.main(["--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert [a for a in asked if a != ["scontrol", "ping"]] == [["scontrol", "show", "job", "-o"]]
    assert (rows["71"]["state"], rows["71"]["nodes"]) == ("RUNNING", "n[1-2]")
    assert rows["72"]["state"] == "PENDING" and rows["73"]["state"] == "COMPLETED"


def test_status_with_no_controller_waits_for_none_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    make_run(tmp_path / "a", "81", 40, finished=True)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    monkeypatch.setattr(slurm, "run", lambda *a, **k: pytest.fail(f"Slurm asked: {a}"))
    assert status.main([]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[1].split()[:3] == ["81", "run81", "COMPLETED"]
    assert "Slurm not asked for the jobs' states (SLURM_CONF=" in out.err


def test_a_requeue_by_scontrol_shows_as_a_requeue_not_a_cancel(tmp_path, monkeypatch, capsys):
    """`scontrol requeue` ends the start with a SIGTERM and no notice, as scancel does: the
    launcher recorded the stop as cancelled. The same job starting again says it was a requeue
    (a cancel is final); a cancel that nothing followed stays a cancel."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "q", "91", 50, finished=False)
    ledger.record(run.ledger, "stopped", "91", 0, when=1100.0, cause="cancelled",
                  why="the job was cancelled (scancel): not requeued", returncode=-15)  # fmt: skip
    ledger.record(run.ledger, "started", "91", 1, when=1130.0, resume_at=30,
                  previous="cancelled (the job was cancelled (scancel): not requeued): last "
                           "periodic checkpoint")  # fmt: skip
    said = {"91": slurm.JobState("91", "RUNNING", 1, "n[1-2]", "")}  # Slurm: Restarts=1
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    assert status.main(["91"]) == 0
    out = capsys.readouterr().out
    assert "1 (requeued)" in out and "cancelled" not in out, out
    assert "restart 1: resumed at update 30; before it: requeued (by Slurm, with no notice" in out
    from hpc_train.planning import goodput

    events = ledger.read(run.ledger)
    assert [s.cause for s in goodput.segments(events, 1200.0)] == ["requeued", "running"]

    cancelled = make_run(tmp_path / "c", "92", 50, finished=False)
    ledger.record(cancelled.ledger, "stopped", "92", 0, when=1100.0, cause="cancelled",
                  why="the job was cancelled (scancel): not requeued")  # fmt: skip
    said["92"] = slurm.JobState("92", "GONE", 0, "", "")
    assert status.main(["92", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["state"] == "CANCELLED" and row["restarts"] == []
    assert [s.cause for s in goodput.segments(ledger.read(cancelled.ledger), 1200.0)] == [
        "cancelled"
    ]


def test_a_requeue_that_cannot_start_shows_as_blocked_until_a_start_follows(
    tmp_path, monkeypatch, capsys
):
    """Task 0 requeued with too few usable nodes (``requeue_blocked``): Slurm only says
    PENDING; status says why, by node, until the run starts again."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "b", "51", 40, finished=False)
    why = "1 usable node(s) for --nodes 2: n2 drained (blamed: hang), n3 excluded"
    ledger.record(run.ledger, "requeue_blocked", "51", 0, when=1070.0, why=why, waiting=True)
    pending = {"51": slurm.JobState("51", "PENDING", 1, "", "")}
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: pending)
    assert status.main(["51"]) == 0
    out = capsys.readouterr().out
    assert "PENDING (blocked)" in out and f"requeue blocked: {why}\n" in out
    assert status.main(["51", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["blocked"] == why
    ledger.record(run.ledger, "started", "51", 1, when=1200.0, previous="requeued")
    pending["51"] = slurm.JobState("51", "RUNNING", 1, "n[1-2]", "")
    assert status.main(["51"]) == 0
    out = capsys.readouterr().out
    assert "blocked" not in out and "RUNNING" in out


def test_the_hot_spares_standing_by_show_while_the_run_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "h", "61", 40, finished=False)
    ledger.record(run.ledger, "started", "61", 0, when=1030.0, nodes=["n1", "n2"],
                  spares=["n3", "n4"], previous="first start")  # fmt: skip
    said = {"61": slurm.JobState("61", "RUNNING", 0, "n[1-4]", "")}
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    assert status.main(["61"]) == 0
    assert "hot spares standing by: n3, n4\n" in capsys.readouterr().out
    ledger.record(run.ledger, "restarted", "61", 0, when=1040.0, members=["n1", "n3"],
                  left_out=["n2"], spare_in=["n3"], spares=["n4"])  # fmt: skip
    assert status.main(["61", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["spares"] == ["n4"]


def grown_run(root, job: str) -> RunDir:
    """A run that grew from 1 to 3 nodes at update 30, its ledger and stop marker as task 0's
    launcher writes them; the next start's ``previous`` is the launcher's own words for it."""
    from hpc_train.contract import StopMarker, write_stop
    from hpc_train.launch import starts

    run = make_run(root, job, 50, finished=False)
    ledger.record(run.ledger, "grown", job, 0, when=1090.0, why="n2, n3 idle",
                  **{"from": 1, "to": 3})  # fmt: skip
    write_stop(run.stop_marker(job, 0), StopMarker(30, "SIGUSR2", 1095.0))
    ledger.record(run.ledger, "stopped", job, 0, when=1100.0, cause="grow", saved=True)
    ledger.record(run.ledger, "started", job, 1, when=1130.0, resume_at=30, nodes=["n1", "n2", "n3"],
                  previous=starts.previous_stop(StartFiles(run, job, 1)))  # fmt: skip
    return run


def test_a_grown_restart_is_named_in_the_table_the_detail_and_the_json(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    grown_run(tmp_path / "g", "31")
    said = {"31": slurm.JobState("31", "RUNNING", 1, "n[1-3]", "")}
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    assert status.main([]) == 0
    (row,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("31 ")]
    assert "1 (grown from 1 to 3 node(s))" in row
    assert status.main(["31"]) == 0
    assert (
        "restart 1: resumed at update 30; before it: grown from 1 to 3 node(s): saved on notice "
        "at update 30" in capsys.readouterr().out
    )
    assert status.main(["31", "--json"]) == 0
    [got] = json.loads(capsys.readouterr().out)
    assert got["restarts"] == [
        {"resumed_at": 30, "previous": "grown from 1 to 3 node(s): saved on notice at update 30"}
    ]


def test_a_held_job_says_its_one_line_from_the_ledger_else_from_its_slurm_comment(
    tmp_path, monkeypatch, capsys
):
    """Task 0 held the job for storage: status shows PENDING (held) and the line (what failed,
    the figures, the release command), from the ledger's stop; where the full save dir lost
    that line, from the job's Comment (``recovery.hold`` writes it); gone once a start follows."""
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "h", "61", 40, finished=False)
    line = ("storage: /fsx/r is full (ENOSPC): 4 kB free, quota unknown (no `lfs quota` on this "
            "node), a checkpoint needs 4.2 MB; seen on n1; job 61 held: fix the storage, then "
            "`scontrol release 61` resumes it")  # fmt: skip
    comment = f"hpc-train: {line}"
    pending = {"61": slurm.JobState("61", "PENDING", 1, "", "job_requeued_in_held_state",
                                    comment)}  # fmt: skip
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: pending)
    assert status.main(["61"]) == 0
    out = capsys.readouterr().out
    assert "PENDING (held)" in out and f"held: {line}\n" in out  # from the Comment
    ledger.record(run.ledger, "stopped", "61", 0, when=1070.0, cause="storage", why=line)
    pending["61"] = slurm.JobState("61", "PENDING", 1, "", "", "")
    assert status.main(["61", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["held"] == line  # from the ledger
    ledger.record(run.ledger, "started", "61", 1, when=1200.0, previous="released")
    pending["61"] = slurm.JobState("61", "RUNNING", 1, "n[1-2]", "")
    assert status.main(["61"]) == 0
    out = capsys.readouterr().out
    assert "(held)" not in out and "\nheld: " not in out and "RUNNING" in out
