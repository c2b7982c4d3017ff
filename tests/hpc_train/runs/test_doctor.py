"""hpc-train doctor's rules on synthetic runs with Slurm mocked (milliseconds): each finding,
its fix, what --act runs, and bad input as one line with exit 2."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train.contract import Beat
from hpc_train.runs import doctor, index, metrics

NOW = 50_000.0


def make_run(save: Path, job: str = "7", max_update: int = 100, updates: int = 40) -> index.Run:
    rd = RunDir(save)
    ledger.record(rd.ledger, "submitted", job, 0, NOW - 3000, max_update=max_update, name="r")
    ledger.record(rd.ledger, "started", job, 0, NOW - 2900, nodes=["n1"])
    ledger.record(rd.ledger, "first_update", job, 0, NOW - 2800, update=1)
    rd.train_log.write_text(
        f"2026-01-01 00:00:00 | INFO | train_inner | epoch 001: {updates} / 100 loss=9.5, "
        f"num_updates={updates}\n"
    )
    return index.Run(save, job, "r", max_update)


def beat(run: index.Run, update: int, age_s: float, phase: str = "train") -> None:
    path = RunDir(run.save_dir).heartbeat(run.job or "", 0, "n1", 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(Beat(0, "n1", 1, update, NOW - age_s, phase, 1.0, 0.9).__dict__))


def state(job: str = "7", st: str = "RUNNING", restarts: int = 0, reason: str = "None"):
    return slurm.JobState(job, st, restarts, "n1" if st == "RUNNING" else "", reason)


def find(
    run: index.Run, st: slurm.JobState, nodes: dict[str, str] | None = None
) -> list[doctor.RunFinding]:
    return doctor.diagnose(metrics.observe(run, st, NOW), doctor.Limits(), nodes)


def test_a_healthy_run_has_no_findings(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 5)
    assert find(run, state()) == []


def test_a_stall_past_the_allowance_with_no_verdict_is_found_and_sure_past_twice(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 400)  # allowance: floor 300 + margin 60
    (f,) = find(run, state())
    assert f.check == doctor.STALL and not f.sure and "no in-job verdict" in f.what
    assert f.fix.startswith("scontrol requeue 7")
    beat(run, 40, 800)
    (f,) = find(run, state())
    assert f.sure and f.action == ("scontrol", "requeue", "7")


def test_a_stall_the_watchdog_already_declared_waits_for_it(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 400)
    RunDir(run.save_dir).incident("7", 0).mkdir(parents=True)
    (f,) = find(run, state())
    assert "a hang incident" in f.what and not f.sure


def test_without_heartbeats_a_stall_is_sure_at_once(tmp_path):
    run = make_run(tmp_path / "run")
    os.utime(RunDir(run.save_dir).train_log, (NOW - 1000, NOW - 1000))
    (f,) = find(run, state())
    assert f.check == doctor.STALL and f.sure and "--no-watchdog" in f.what


def test_a_finished_run_whose_job_still_runs_is_stuck_at_exit(tmp_path):
    run = make_run(tmp_path / "run", updates=100)
    beat(run, 100, 60, phase="stopping")
    assert find(run, state()) == []  # within the exit grace
    beat(run, 100, 200, phase="stopping")
    (f,) = find(run, state())
    assert f.check == doctor.EXIT and f.sure and f.action == ("scancel", "7")
    assert "training is over (update 100/100)" in f.what


def test_a_requeue_storm_from_the_ledger_or_from_slurm(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 5)
    for n in (1, 2, 3):
        ledger.record(RunDir(run.save_dir).ledger, "started", "7", n, NOW - 600 + n)
    (f,) = find(run, state(restarts=3))
    assert f.check == doctor.STORM and f.action == ("scontrol", "requeuehold", "7")
    (f,) = find(run, state(st="PENDING", restarts=3, reason="BeginTime"))
    assert f.action == ("scontrol", "hold", "7")
    bare = index.Run(tmp_path / "bare", "8", "bare")
    (tmp_path / "bare").mkdir()
    assert [f.check for f in find(bare, state("8", restarts=5))] == [doctor.STORM]
    assert find(bare, state("8", restarts=2)) == []


def test_a_storm_counts_restarts_of_a_run_whose_first_start_is_older_than_the_window(tmp_path):
    """A 2-hour-old run requeued 3 times in the last 10 minutes: 3 restarts in the window,
    although only 3 starts (not 4) lie in it."""
    save = tmp_path / "old"
    rd = RunDir(save)
    ledger.record(rd.ledger, "submitted", "7", 0, NOW - 7300, max_update=100, name="r")
    ledger.record(rd.ledger, "started", "7", 0, NOW - 7200, nodes=["n1"])
    for n in (1, 2, 3):
        ledger.record(rd.ledger, "started", "7", n, NOW - 600 + 100 * n, nodes=["n1"])
    run = index.Run(save, "7", "r", 100)
    view = metrics.observe(run, state(restarts=3), NOW)
    assert doctor.storm_count(view, doctor.Limits()) == 3
    assert [f.check for f in find(run, state(restarts=3))][:1] == [doctor.STORM]
    assert doctor.storm_count(view, doctor.Limits(storm_window_s=450)) == 2


@pytest.mark.parametrize(
    "reason, nodes, expect",
    [
        ("PartitionDown", {}, "state=up"),
        ("ReqNodeNotAvail,_UnavailableNodes:n2", {"n2": "drained"}, "ExcNodeList=n2"),
        ("ReqNodeNotAvail,_UnavailableNodes:n2", {"n2": "allocated"}, None),  # it may clear
        ("Resources", {}, None),
        ("Priority", {}, None),
    ],
)
def test_pending_for_a_reason_that_never_clears(tmp_path, reason, nodes, expect):
    run = make_run(tmp_path / "run")
    found = find(run, state(st="PENDING", reason=reason), nodes)
    if expect is None:
        assert found == []
    else:
        (f,) = found
        assert f.check == doctor.PENDING and expect in f.fix and not f.sure


def test_pending_on_a_node_the_run_quarantined(tmp_path):
    run = make_run(tmp_path / "run")
    for t in (NOW - 900, NOW - 800):
        ledger.record(RunDir(run.save_dir).ledger, "blamed", "7", 0, t, node="n3", why="hang")
    (f,) = find(run, state(st="PENDING", reason="ReqNodeNotAvail,_UnavailableNodes:n3"), {})
    assert "n3 (quarantined)" in f.what


def test_a_corrupt_ledger_line_is_a_finding(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 5)
    with RunDir(run.save_dir).ledger.open("a") as out:
        out.write('{"event": "checkpoint", "ti\n')
    (f,) = find(run, state())
    assert f.check == doctor.LEDGER and "not a ledger record" in f.what


def test_a_vanished_or_unreadable_save_dir_is_a_finding(tmp_path):
    gone = index.Run(tmp_path / "gone", "7", "r")
    (f,) = find(gone, state())
    assert f.check == doctor.SAVE_DIR and "is gone" in f.what and f.fix.startswith("scancel 7")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # ELOOP: unreadable even for root
    (f,) = find(index.Run(loop, "7", "r"), state())
    assert f.check == doctor.SAVE_DIR and "cannot be read" in f.what
    weird = make_run(tmp_path / "weird")
    RunDir(weird.save_dir).ledger.unlink()
    RunDir(weird.save_dir).ledger.mkdir()  # a ledger that is a directory
    (f,) = find(weird, state())
    assert f.check == doctor.LEDGER and "cannot be read" in f.what


def test_an_ended_job_is_not_checked(tmp_path):
    run = make_run(tmp_path / "run")
    beat(run, 40, 5000)
    assert find(run, state(st="COMPLETED")) == []
    assert find(run, slurm.JobState("7", "GONE", 0, "", "")) == []


def test_all_users_finds_runs_from_slurms_stdout_paths(tmp_path):
    save = tmp_path / "someone" / "run"
    (save / ".hpc-train").mkdir(parents=True)
    other = tmp_path / "someone" / "project"  # logs to a slurm/ dir, but is no run of ours
    (other / "slurm").mkdir(parents=True)
    records = [
        {"JobId": "5", "JobName": "x", "JobState": "RUNNING", "Restarts": "2",
         "StdOut": f"{save}/slurm/5_0_log.out", "NodeList": "n1", "Reason": "None"},
        {"JobId": "6", "JobName": "y", "JobState": "RUNNING", "StdOut": "/home/u/slurm-6.out"},
        {"JobId": "7", "JobName": "z", "JobState": "RUNNING", "StdOut": f"{other}/slurm/7.out"},
    ]  # fmt: skip
    ((run, st),) = metrics.all_jobs_runs(records)
    assert run.save_dir == save and run.job == "5" and st.restarts == 2
    # a save dir gone while its job runs stays: the doctor's save-dir finding needs it
    gone = {**records[0], "JobId": "8", "StdOut": f"{tmp_path}/gone/slurm/8_0_log.out"}
    assert [r.job for r, _ in metrics.all_jobs_runs([gone])] == ["8"]


class Hook:
    """A webhook that records what it is sent."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                hook.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()


def test_act_runs_the_sure_fix_through_slurm_and_notifies(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "run", updates=100)
    ledger.index_run("7", run.save_dir, "r", 100)
    beat(run, 100, NOW - time.time() + 500, phase="stopping")  # 500 s before the real now
    ran: list[list[str]] = []
    monkeypatch.setattr(slurm, "unreachable", lambda: None)
    monkeypatch.setattr(slurm, "job_states", lambda jobs: {"7": state()})
    monkeypatch.setattr(slurm, "run", lambda args, **kw: ran.append(list(args)) or "")
    hook = Hook()
    try:
        assert doctor.main(["--act", "--notify", hook.url]) == 1
    finally:
        hook.server.shutdown()
    assert ran == [["scancel", "7"]]
    (sent,) = hook.got
    assert sent["check"] == doctor.EXIT and sent["job"] == "7" and sent["fix"].startswith("scancel")
    out = capsys.readouterr().out
    assert "stuck-at-exit [sure]: job 7 (r)" in out and "fix: scancel 7" in out


def test_a_standing_finding_is_notified_once_until_it_changes_or_the_interval_passes(
    tmp_path, monkeypatch
):
    told: list[doctor.RunFinding] = []

    def notify(target: str, f: doctor.RunFinding, log: object) -> bool:
        told.append(f)
        return True

    monkeypatch.setattr(doctor, "notify", notify)
    record = tmp_path / "state" / doctor.NOTIFIED

    def stall(idle: int, sure: bool = False) -> doctor.RunFinding:
        return doctor.RunFinding(doctor.STALL, "7", "r", "/s", f"no update for {idle} s",
                              "scontrol requeue 7", sure)  # fmt: skip

    def rounds(at: float, *found: doctor.RunFinding, checked: tuple[str, ...] = ("/s",)) -> int:
        told.clear()
        doctor.notify_changed("hook", found, checked, print, at, 3600, record)
        return len(told)

    assert rounds(0, stall(400)) == 1  # new
    assert rounds(300, stall(700)) == 0  # the same finding, only older: not again
    assert sorted(p.name for p in record.parent.iterdir()) == [doctor.NOTIFIED]  # atomic
    assert rounds(600, stall(1000, sure=True)) == 1  # changed: sure now
    assert rounds(900, stall(1300, sure=True)) == 0
    assert rounds(4300, stall(4700, sure=True)) == 1  # the interval passed
    assert rounds(4400, stall(4800, sure=True), checked=("/other",)) == 0
    assert rounds(4500, checked=("/elsewhere",)) == 0  # /s not checked: still remembered
    assert rounds(4600, stall(5000, sure=True)) == 0
    assert rounds(4700) == 0  # gone: forgotten
    assert rounds(4800, stall(400)) == 1  # back: news again
    assert doctor.notify_changed("other hook", [stall(400)], ["/s"], print, 4900, 3600,
                                 record) == [stall(400)]  # another target was not told  # fmt: skip
    record.write_text("{garbled")
    assert rounds(5000, stall(400)) == 1  # an unreadable record: told, and rewritten
    assert rounds(5100, stall(500)) == 0


def test_the_doctor_command_does_not_repeat_a_standing_finding(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    run = make_run(tmp_path / "run", updates=100)
    ledger.index_run("7", run.save_dir, "r", 100)
    beat(run, 100, NOW - time.time() + 500, phase="stopping")  # 500 s before the real now
    monkeypatch.setattr(slurm, "unreachable", lambda: None)
    monkeypatch.setattr(slurm, "job_states", lambda jobs: {"7": state()})
    hook = tmp_path / "told.jsonl"
    for _ in range(3):  # the timer's passes
        assert doctor.main(["--notify", f"cat >> {hook}; echo >> {hook}"]) == 1
    lines = lambda: [json.loads(x) for x in hook.read_text().splitlines() if x]  # noqa: E731
    assert [said["check"] for said in lines()] == [doctor.EXIT]
    assert (tmp_path / "state" / doctor.NOTIFIED).is_file()
    assert doctor.main(["--notify", f"cat >> {hook}; echo >> {hook}", "--renotify", "0"]) == 1
    assert len(lines()) == 2  # --renotify 0: every pass


def test_a_notify_command_gets_the_finding_on_stdin(tmp_path):
    f = doctor.RunFinding(doctor.STALL, "7", "r", "/s", "no update", "scontrol requeue 7", True)
    out = tmp_path / "said.json"
    assert doctor.notify(f"cat > {out}", f, print)
    assert json.loads(out.read_text())["what"] == "no update"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--all-users", "--act"], "--all-users is read-only"),
        (["--exit-grace", "-5"], "--exit-grace -5: seconds cannot be negative"),
        (["--margin", "-1"], "--margin -1: seconds cannot be negative"),
        (["--storm-restarts", "0"], "--storm-restarts 0: at least 1"),
        (["--renotify", "-1"], "--renotify -1: seconds cannot be negative"),
        (["/no/such/run"], "/no/such/run: no such directory, and not a job id"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as ended:
        doctor.main(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert said in err and len(err.strip().splitlines()) == 1, err
