"""The doorbell between nodes (``hpc_core.doorbell``): a ring ends a waiting node's nap, so it
looks at once instead of at its next poll. Real UDP sockets on this machine's loopback; the
node name is ``localhost`` (it resolves here as a Slurm node name resolves on a cluster).

Every wait below polls once a minute (or never): a test passes only if the ring woke it, and
fails by its timeout, never by a clock."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_core import doorbell
from hpc_core.wait import Backoff

RARELY = Backoff(60.0, 1.0, 60.0)  # one look, then the next a minute later
KEY = "41-0"  # the Slurm start whose launchers ring one another


@pytest.fixture
def here_bell(tmp_path) -> Iterator[doorbell.Bell]:
    bell = doorbell.open_here(tmp_path / "bells", "localhost", KEY)
    assert bell is not None
    yield bell
    doorbell.close_here()


def test_a_ring_ends_a_nap_and_is_drained(tmp_path):
    bell = doorbell.Bell(tmp_path, "localhost", KEY)
    try:
        assert (tmp_path / "localhost").read_text().split() == [str(bell.port), KEY]
        assert bell.nap(0) is False  # nothing rung yet
        assert doorbell.ring(tmp_path, ["localhost", "localhost"], KEY) == 1  # a name rung once
        assert bell.nap(30) is True and bell.rung == 1
        assert bell.nap(0) is False  # drained: the next nap sleeps
    finally:
        bell.close()


def test_a_name_without_a_bell_or_an_address_is_skipped(tmp_path):
    (tmp_path / "no-such-node.invalid").write_text(f"40000 {KEY}\n")
    (tmp_path / "garbled").write_text("not a port\n")
    assert doorbell.ring(tmp_path, ["nobody", "no-such-node.invalid", "garbled"], KEY) == 0
    assert doorbell.ring(tmp_path / "none-yet", ["localhost"], KEY) == 0


def test_a_word_awaited_is_seen_when_rung_not_at_the_next_poll(tmp_path, here_bell):
    """The word is written and rung from another thread once the waiter has looked and found
    nothing: it returns with the word though its next poll is a minute away (a broken bell
    times out after 20 s)."""
    word, looked = tmp_path / "verdict.json", threading.Event()

    def check() -> str | None:
        if not looked.is_set():  # the first look finds nothing, whenever the writer comes
            looked.set()
            return None
        return word.read_text() if word.exists() else None

    def writer() -> None:
        looked.wait(20)
        word.write_text("go")
        doorbell.ring(tmp_path / "bells", ["localhost"], KEY)

    thread = threading.Thread(target=writer)
    thread.start()
    got = doorbell.await_word(check, "the verdict", 20.0, RARELY)
    thread.join()
    assert got == "go" and here_bell.rung >= 1


def test_without_a_bell_a_nap_is_a_sleep(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(doorbell.time, "sleep", slept.append)
    doorbell.nap(0.25)
    assert slept == [0.25]


WAITER = """
import sys
from pathlib import Path
from hpc_core import doorbell
from hpc_core.wait import Backoff
registry, word = Path(sys.argv[1]), Path(sys.argv[2])
bell = doorbell.open_here(registry, "localhost", "41-0")
looked = []
def check():
    if not looked:  # the first look finds nothing: the word comes after it
        looked.append(print("ready", flush=True))
        return None
    return word.read_text() if word.exists() else None
got = doorbell.await_word(check, "the word", 60.0, Backoff(600.0, 1.0, 600.0))
print(got, bell.rung, flush=True)
"""


def test_another_process_is_woken_across_processes(tmp_path):
    """A launcher's way: the waiter is its own process with its own bell; the word's writer
    rings it by name (its port read from the run directory)."""
    word = tmp_path / "decision.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", WAITER, str(tmp_path / "bells"), str(word)],
                            stdout=subprocess.PIPE, text=True, cwd=root)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        word.write_text("decided")
        assert doorbell.ring(tmp_path / "bells", ["localhost"], KEY) == 1
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    got, rung = out.split()
    assert got == "decided" and int(rung) >= 1


def test_a_bell_past_descriptor_1024_still_naps(tmp_path):
    """A launcher with many files open gets a socket numbered above select()'s limit (1024):
    its naps still work (``poll``)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        bell = doorbell.Bell(tmp_path, "localhost", KEY)
        assert bell.sock.fileno() > 1024
        assert bell.nap(0) is False
        assert doorbell.ring(tmp_path, ["localhost"], KEY) == 1 and bell.nap(30) is True
        bell.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_bell_left_by_an_earlier_start_is_never_rung(tmp_path):
    """A requeued job's launcher may ring a node before that node's new launcher registered:
    the bell file there is the last start's, its port maybe another program's now. A ring for
    this start leaves it alone, and rings the node's new launcher at its new port once it has
    registered (a registration of another start is read again at every ring, never kept)."""
    old = doorbell.Bell(tmp_path, "localhost", "41-0")
    try:
        assert doorbell.ring(tmp_path, ["localhost"], "41-1") == 0
        assert old.nap(0) is False
    finally:
        old.close()
    new = doorbell.Bell(tmp_path, "localhost", "41-1")
    try:
        assert doorbell.ring(tmp_path, ["localhost"], "41-1") == 1 and new.nap(30) is True
    finally:
        new.close()


def test_a_start_s_registration_is_read_once_then_rung_without_a_read(tmp_path, monkeypatch):
    """A verdict rings every other node of the round: each node's registration is read at the
    first ring of its start and kept (on Lustre each read is an open on the metadata server,
    63 of them on a 64-node round's critical path). Counted by the files ``ring`` opens: the
    second ring opens none and still wakes the bell; a node not registered at the first ring
    is read again at the next and rung once it is."""
    opened: list[str] = []
    read_text = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda path, *a, **k: (opened.append(path.name), read_text(path, *a, **k))[1],
    )
    bell = doorbell.Bell(tmp_path, "localhost", "42-0")
    try:
        assert doorbell.ring(tmp_path, ["localhost", "127.0.0.1"], "42-0") == 1
        assert opened == ["localhost", "127.0.0.1"] and bell.nap(30) is True
        late = doorbell.Bell(tmp_path, "127.0.0.1", "42-0")  # registers after the first ring
        try:
            assert doorbell.ring(tmp_path, ["localhost", "127.0.0.1"], "42-0") == 2
            assert opened == ["localhost", "127.0.0.1", "127.0.0.1"]  # the new one alone read
            assert bell.nap(30) is True and late.nap(30) is True
            assert doorbell.ring(tmp_path, ["localhost", "127.0.0.1"], "42-0") == 2
            assert len(opened) == 3  # both kept: no file opened
        finally:
            late.close()
    finally:
        bell.close()


def test_two_threads_nap_on_one_bell_at_once(tmp_path):
    """The hang monitor naps on the launcher's bell while torchrun runs, and ``checkpoint()``
    naps on it in the main thread on a notice: both at once, neither fails (one poll object
    shared by two threads raised "concurrent poll() invocation", and the notice's save was
    never waited for); rung until both have woken."""
    bell = doorbell.Bell(tmp_path, "localhost", KEY)
    together, woke, failed = threading.Barrier(3, timeout=20), [], []

    def napper() -> None:
        together.wait()
        try:
            woke.append(bell.nap(30))
        except Exception as err:  # what the shared poll object raised
            failed.append(err)

    threads = [threading.Thread(target=napper) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        together.wait()
        while any(t.is_alive() for t in threads):  # a ring one of them missed: the next one
            doorbell.ring(tmp_path, ["localhost"], KEY)
            threads[0].join(0.05)
        assert failed == [] and woke == [True, True]
    finally:
        for thread in threads:
            thread.join(30)
        bell.close()
