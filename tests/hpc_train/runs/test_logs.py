"""`hpc-train logs`: a run's logs merged across tasks and requeues; the summary; bad input."""

from __future__ import annotations

import json

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.runs import follow, logs


def fairseq(t: str, update: int, loss: float) -> str:
    payload = {"epoch": 1, "loss": str(loss), "num_updates": str(update), "wps": "100"}
    return f"2026-11-22 10:00:{t} | INFO | train_inner | {json.dumps(payload)}"


def launcher(t: str, host: str, what: str) -> str:
    return f"[2026-11-22T10:00:{t}Z] hpc-train {host}: {what}"


@pytest.fixture
def run(tmp_path, monkeypatch) -> RunDir:
    """A run that was preempted once: job 5 on n1+n2, then start #2 on n3 alone."""
    monkeypatch.setenv("TZ", "UTC")  # fairseq stamps local time; the launcher UTC
    import time

    time.tzset()
    run = RunDir(tmp_path / "run")
    run.slurm_logs.mkdir(parents=True)
    run.train_log.write_text(
        "\n".join(
            [
                fairseq("02,000", 1, 9.0),
                fairseq("04,000", 2, 8.0),
                "2026-11-22 10:00:05 | INFO | hpc_train.worker.preemption | saved on notice at update 2",
                fairseq("12,000", 3, 7.0),
                "Traceback (most recent call last):",  # no stamp: stays after its line
            ]
        )
        + "\n"
    )
    run.task_log("5", 0).write_text(
        "\n".join(
            [
                launcher("01", "n1", "job 5 start #1: first start"),
                "submitit INFO (2026-11-22) noise the view leaves out",
                launcher("05", "n1", "notice received"),
                launcher("10", "n3", "job 5 start #2: saved on notice (SIGUSR2) at update 2"),
            ]
        )
        + "\n"
    )
    run.task_log("5", 1).write_text(launcher("03", "n2", "node 2/2, 1 rank(s) here") + "\n")
    ledger.record(run.ledger, "submitted", "5", 0, max_update=3, name="demo")
    return run


def short(line: str) -> str:
    """A launcher line's text, or a fairseq line's message (its update for metrics)."""
    if line.startswith("["):
        return line.split("] ", 1)[1]
    message = line.split(" | ")[-1]
    return f"update {json.loads(message)['num_updates']}" if message.startswith("{") else message


def test_the_run_view_merges_train_log_and_every_launcher_by_time(run):
    assert [short(ln) for ln in follow.RunTail(run).new_lines()] == [
        "hpc-train n1: job 5 start #1: first start",
        "update 1",
        "hpc-train n2: node 2/2, 1 rank(s) here",
        "update 2",
        "saved on notice at update 2",
        "hpc-train n1: notice received",
        "hpc-train n3: job 5 start #2: saved on notice (SIGUSR2) at update 2",
        "update 3",
        "Traceback (most recent call last):",
    ]  # submitit's own lines in the task logs are left out


def test_a_tail_hands_each_line_over_once_even_as_files_grow(run):
    tail = follow.RunTail(run)
    first = tail.new_lines()
    assert tail.new_lines() == []
    with run.train_log.open("a") as fh:
        fh.write(fairseq("20,000", 4, 6.0) + "\n" + fairseq("21,000", 5, 5.0)[:30])
    run.task_log("5", 2).write_text(launcher("19", "n4", "a new node") + "\n")
    new = tail.new_lines()
    assert len(new) == 2 and "a new node" in new[0] and '"num_updates": "4"' in new[1]
    assert not set(new) & set(first)


def test_logs_cli_prints_the_run_by_save_dir_and_by_job_id(run, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    assert logs.main([str(run.root)]) == 0
    by_dir = capsys.readouterr().out
    ledger.index_run("5", run.root, "demo", 3)
    assert logs.main(["5"]) == 0
    assert capsys.readouterr().out == by_dir and "start #2" in by_dir
    assert logs.main(["5", "--task", "1"]) == 0
    raw = capsys.readouterr().out
    assert "5_1_log.out" in raw and "node 2/2" in raw and "start #1" not in raw


def test_logs_summary_as_json(run, capsys):
    assert logs.main(["summary", str(run.train_log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["updates"] == 3 and data["first_loss"] == 9.0 and data["final_loss"] == 7.0
    assert logs.main([str(run.root), "--summary", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is True  # max_update 3 from ledger


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["/no/such/dir"], "no such directory, and not a job id"),
        (["424242"], "job 424242: not in your run index"),
        (["summary"], "summary: name one or more existing log files"),
        (["a", "b"], "name one run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, said, capsys, monkeypatch):
    monkeypatch.setattr(logs.index.slurm, "job_info", lambda job: None)  # Slurm forgot it
    with pytest.raises(SystemExit) as exit_:
        logs.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and len(err.strip().splitlines()) == 1


def test_an_empty_directory_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        logs.main([str(tmp_path)])
    assert exit_.value.code == 2 and "not a run directory" in capsys.readouterr().err


def test_follow_piped_prints_progress_and_launcher_lines_then_the_summary(run, monkeypatch):
    """Slurm is faked (two polls, then COMPLETED): the display and the summary are under test."""
    from hpc_core import slurm
    from hpc_core.wait import Backoff

    states = iter(["RUNNING", "COMPLETED"])
    monkeypatch.setattr(slurm, "job_state", lambda j: slurm.JobState(j, next(states), 1, "", ""))
    said: list[str] = []
    code = follow.follow(run, "5", 3, Backoff(0.001, 1, 0.001), said.append)
    assert code == 0
    progress = [s for s in said if s.startswith("update ")]
    assert [p.split(" |")[0] for p in progress] == ["update 1/3", "update 2/3", "update 3/3"]
    assert any("start #2: saved on notice" in s for s in said)
    assert "job COMPLETED: 3/3 updates" in said[-1]


def test_on_a_terminal_follow_draws_a_bar_with_loss_and_restarts(run, capsys):
    display = follow.Display(3, print, bar=True)
    for line in follow.RunTail(run).new_lines():
        display(line)
    assert display.bar.n == 3 and display.bar.total == 3
    assert display.bar.postfix == "loss=7.000, restarts=1, words/s=100"
    display.close()
    out = capsys.readouterr()
    assert "start #2" in out.out  # launcher lines go above the bar
    assert "update 1/3" not in out.out  # no plain progress lines under a bar


def test_logs_help_shows_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        logs.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "hpc-train logs 4242 --follow" in out and "--task N" in out


def test_a_64_node_start_is_a_few_lines_and_a_nodes_own_line_stands_out():
    """Issue 46: at 64 nodes every launcher says the same at each start (its node k/64, the
    torchrun line, the spot watch): shown once each with how many nodes said it; what one node
    alone said (a blame) stays, and a 2-node run's lines stay as they are."""
    stamp = "[2026-11-29T00:07:{:02d}Z] hpc-train {}: {}"
    lines = []
    for k in range(1, 65):
        lines.append(stamp.format(k % 7, f"s{k}", f"node {k}/64, 1 rank(s) here"))
        lines.append(stamp.format(k % 7 + 1, f"s{k}", "spot watch off: not on EC2"))
    lines.insert(70, '2026-11-29 00:07:03 | INFO | train_inner | {"num_updates": "1"}')
    lines.append(stamp.format(30, "s1", "blamed s17: crash in job 41"))
    folded = follow.fold(lines)
    assert folded == [
        lines[0] + " [64 nodes: s1..s64]",
        lines[1] + " [64 nodes: s1..s64]",
        '2026-11-29 00:07:03 | INFO | train_inner | {"num_updates": "1"}',
        lines[-1],
    ]
    two = [stamp.format(1, f"n{k}", "training finished") for k in (1, 2)]
    assert follow.fold(two) == two
    later = [stamp.format(1, "n1", "x 1"), "[2026-11-29T00:17:00Z] hpc-train n2: x 2"]
    assert follow.fold(later, least=2) == later  # ten minutes apart: not one event
