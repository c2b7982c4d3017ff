"""A doorbell between nodes: a node waiting on another node's word looks as soon as it is written,
not at its next poll.

A word between launchers (an exit record, a report, task 0's verdict or decision) is always a
file in the run directory: durable, read by whoever comes later, the only truth. Lustre tells no
other client that a file appeared, so a waiting node polls (``hpc_core.wait.WORD``: a quarter
second at most), and a round is a chain of such waits (exit records -> verdict -> reports ->
decision): the last of N nodes to look is late at every link, the more so the more nodes
(issue 46: the polls were most of an in-job round's own share at 39 nodes).

So each launcher process opens a bell (``open_here``): a UDP socket on a port of the kernel's
choosing, its port registered in the run directory under its node's name, with the Slurm start
it rings for (a bell an earlier start left is never rung). Whoever writes a word
rings the nodes that wait on it (``ring``: one empty datagram each, to the node's name as Slurm
and torchrun's rendezvous resolve it), and a waiting node's sleep between looks
(``nap``, inside ``await_word``) ends at the first datagram. The ring carries nothing and is
never trusted: it only makes a node look now at the file it waits for. A datagram lost, blocked
by a firewall or forged costs nothing but a look: the polls stay the backstop, as late as
before and never later. Trust decision: the port is open to anything that reaches the node
(bound to every address: emulated nodes share one host); what it receives is drained unread.

One bell a process (the launcher's); two threads may nap on it at once (the hang monitor's while
torchrun runs, the main thread's ``checkpoint()`` on a notice): a ring wakes one or both, one
that missed it looks at its next poll. A process that opened none naps by sleeping.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from hpc_core.rundir import atomic_write
from hpc_core.wait import WORD, Backoff, wait_until

T = TypeVar("T")
DRAIN = 64  # datagrams read at most per wake (more are left for the next nap: it returns at once)


class Bell:
    """This process's bell: a UDP socket on an ephemeral port, registered as ``name`` in
    ``registry`` (a folder of the run directory: one file a node, its port and ``key``, the
    start it rings for: a ringer of another start leaves it alone)."""

    def __init__(self, registry: Path, name: str, key: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.rung = 0  # naps ended by a ring (what a test sees of it)
        registry.mkdir(parents=True, exist_ok=True)
        atomic_write(registry / name, f"{self.port} {key}\n", durable=False)

    def nap(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if a ring ended it (every datagram waiting drained).
        Each nap polls on a poll object of its own: one shared by two threads napping at once
        (the hang monitor's, and ``checkpoint()`` in the main thread) raises ("concurrent
        poll() invocation": the notice's save was never waited for). ``poll()``, not
        ``select()``: no limit on the descriptor's number."""
        waiting = select.poll()
        waiting.register(self.sock, select.POLLIN)
        if not waiting.poll(max(0.0, seconds) * 1000):
            return False
        for _ in range(DRAIN):
            try:
                self.sock.recv(16)
            except OSError:  # drained (EAGAIN), or an ICMP error queued on the socket
                break
        self.rung += 1
        return True

    def close(self) -> None:
        self.sock.close()


_here: Bell | None = None


def open_here(registry: Path, name: str, key: str) -> Bell | None:
    """Open this process's bell for the start ``key`` (once: a second call keeps the first);
    None where no socket could be had or registered (the polls alone then, as before)."""
    global _here
    if _here is None:
        with contextlib.suppress(OSError):
            _here = Bell(registry, name, key)
    return _here


def close_here() -> None:
    global _here
    if _here is not None:
        _here.close()
        _here = None


def nap(seconds: float, stop: threading.Event | None = None) -> None:
    """Sleep between two looks: on this process's bell if it has one (a ring ends it early,
    ``wake_here`` too); without one, until ``stop`` is set, if given."""
    if _here is not None:
        _here.nap(seconds)
    elif stop is not None:
        stop.wait(seconds)
    else:
        time.sleep(seconds)


def wake_here() -> None:
    """Ring this process's own bell (on loopback), ending a nap of another of its threads at
    once: a watcher napping on the bell that is told to stop (``watch.hang_monitor``)."""
    if _here is not None:
        with contextlib.suppress(OSError):
            _here.sock.sendto(b"", ("127.0.0.1", _here.port))


def await_word(
    check: Callable[[], T | None], what: str, timeout: float | None, backoff: Backoff = WORD
) -> T:
    """``wait_until`` for another node's word: its polls as ``backoff`` says, each sleep ended
    by a ring (``nap``). Raises TimeoutError as ``wait_until`` does."""
    return wait_until(check, what, timeout, backoff, sleep=nap)


@lru_cache(maxsize=1024)
def _address(name: str) -> str | None:
    """``name``'s IPv4 address, resolved once a process (None: it does not resolve)."""
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0])
    except (OSError, IndexError):
        return None


def ring(registry: Path, names: Iterable[str], key: str) -> int:
    """Ring the bells of ``names`` registered for the start ``key`` (each read once for that
    start, ``_port``: a requeued node registers anew, for its new start; a bell left by an
    earlier start is never rung, its port may be another program's now); how many datagrams
    went. A name with no such bell, or that does not resolve, is skipped: it polls. Never
    raises: a ring that fails is a ring lost."""
    sent = 0
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return 0
    with sock:
        for name in dict.fromkeys(names):
            port = _port(registry / name, key)
            address = None if port is None else _address(name)
            if port is None or address is None:
                continue
            with contextlib.suppress(OSError):
                sock.sendto(b"", (address, port))
                sent += 1
    return sent


# (a bell's registration, its start) -> its port: a start's registration is written once (one
# bell a launcher process, opened once) and never changes, so each is read once a process, not
# at every ring (issue 46: a verdict rang 63 nodes at 64, one open and read each of a small
# file on Lustre's metadata server, on the round's critical path). Only a bell found is kept:
# a node not registered yet, or registered for another start, is read again at the next ring.
# (A start's key is its job id and restart: a run dir kept across a cluster rebuilt, whose job
# ids begin again, may hold a registration of the same key from before; read before the node
# registers anew, it is kept, and that node's rings are lost for the start: its polls answer.)
_ports: dict[tuple[Path, str], int] = {}


def _port(path: Path, key: str) -> int | None:
    """The port of the bell registered at ``path`` for the start ``key`` (None: none)."""
    if (known := _ports.get((path, key))) is not None:
        return known
    try:
        port, registered = path.read_text().split()
        found = int(port) if registered == key else None
    except (OSError, ValueError):
        return None
    if found is not None:
        _ports[(path, key)] = found
    return found
