"""The run ledger and the user's run index: appends, reads, bad lines."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.ledger import Kind


def test_events_round_trip_in_order(tmp_path):
    path = tmp_path / ".hpc-train" / "ledger.jsonl"
    ledger.record(path, "submitted", "41", 0, nodes="2", max_update=60)
    ledger.record(path, "started", "41", 1, nodes=["n1", "n2"], world=2)
    events = ledger.read(path)
    assert [(e.kind, e.job, e.restart) for e in events] == [
        ("submitted", "41", 0),
        ("started", "41", 1),
    ]
    assert events[0].get("max_update") == 60 and events[1].get("nodes") == ["n1", "n2"]
    assert events[0].time <= events[1].time


def test_an_unknown_event_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with pytest.raises(ValueError, match="unknown ledger event 'exploded'"):
        ledger.record(path, "exploded", "1", 0)
    assert not path.exists()


def test_a_field_its_kind_does_not_have_is_refused_before_anything_is_written(tmp_path):
    """Each kind knows its fields (``Kind.fields``): a writer passing another (a typo, a field
    of another kind) is told at once, and the ledger keeps only lines its readers know."""
    path = tmp_path / "ledger.jsonl"
    with pytest.raises(ValueError, match="ledger event blamed has no field reason"):
        ledger.record(path, Kind.BLAMED, "1", 0, node="n2", reason="a typo of why")
    assert not path.exists()
    ledger.record(path, Kind.BLAMED, "1", 0, node="n2", why="hang", cause="hang")
    assert ledger.read(path)[0].get("cause") == "hang"


def test_bad_lines_are_skipped_with_a_warning_never_fatal(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger.record(path, "submitted", "7", 0)
    with path.open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"event": "nonsense", "time": 1.0}) + "\n")
        fh.write("[1, 2]\n")
    ledger.record(path, "finished", "7", 0)
    with path.open("a") as fh:
        fh.write('{"event": "stopped", "ti')  # a line cut short by a crash
    warned: list[str] = []
    events = ledger.read(path, warned.append)
    assert [e.kind for e in events] == ["submitted", "finished"]
    assert len(warned) == 4 and ":2: not a ledger record" in warned[0]


def _append_many(path: str, tag: str) -> None:
    for i in range(200):
        ledger.record(Path(path), "stopped", tag, 0, reached=i, why="x" * 300)  # long lines


def test_concurrent_writers_leave_only_whole_lines(tmp_path):
    """Two processes appending at once (task 0's launcher and rank 0's worker do)."""
    path = tmp_path / "ledger.jsonl"
    procs = [
        multiprocessing.get_context("spawn").Process(target=_append_many, args=(str(path), t))
        for t in ("a", "b")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    warned: list[str] = []
    events = ledger.read(path, warned.append)
    assert warned == [] and len(events) == 400
    for tag in ("a", "b"):
        assert [e.get("reached") for e in events if e.job == tag] == list(range(200))


def test_the_index_lives_where_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.delenv(ledger.INDEX_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert ledger.user_index() == tmp_path / "xdg" / "hpc-train" / "runs.jsonl"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ledger.user_index() == tmp_path / "home" / ".local/state/hpc-train/runs.jsonl"
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "mine"))
    assert ledger.user_index() == tmp_path / "mine" / "runs.jsonl"


def test_the_index_keeps_one_entry_per_job_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path))
    ledger.index_run("5", tmp_path / "a", "first", 10)
    ledger.index_run("6", tmp_path / "b", "second", 20)
    ledger.index_run("5", tmp_path / "a2", "again", 30)
    runs = ledger.indexed_runs()
    assert [(r["job"], r["name"]) for r in runs] == [("6", "second"), ("5", "again")]


def test_a_ledger_on_a_read_only_file_system_is_said_not_fatal(small_fs, capfd):
    """The ledger on a tmpfs of its own remounted read-only (the save dir's FSx made read-only):
    record() says the event on stderr, whole, and returns; nothing raises."""
    fs = small_fs("2m")
    path = fs.root / ".hpc-train" / "ledger.jsonl"
    ledger.record(path, Kind.STARTED, "41", 0, nodes=["n1"])
    fs.read_only()
    event = ledger.record(path, Kind.FINISHED, "41", 0, why="done")
    assert event.kind == Kind.FINISHED
    err = capfd.readouterr().err
    assert err.startswith(f"hpc-train: ledger not written ({path}: OSError: [Errno 30]")
    assert '"event": "finished"' in err and '"why": "done"' in err
    assert [e.kind for e in ledger.read(path)] == [Kind.STARTED]
