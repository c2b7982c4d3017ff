"""This host's processes whose environment carries given values, read from /proc.

The one scan behind three questions: which processes of a job run on an emulated node
(``hpc_train.chaos``), which ranks of a start torchrun left running (the launcher's
``lifecycle.leftovers``), and whether any process of a job or task is left (the tests'
``hpc_train.testing.job_alive``).

- The environment read is the one a process started with (``/proc/PID/environ``).
- A process this user may not read is none of them.
- On a host that several emulated nodes share (the local cluster), each process carries its
  node's ``SLURMD_NODENAME``. ``node`` keeps only that node's processes; a process without the
  variable counts as any node's (on a real cluster a node is a host of its own).
- Most processes carry none of the values: their environment is matched as bytes first and
  parsed only when every value is in it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_core.slurm_env import NODENAME

PROC = Path("/proc")
NODE_VAR = NODENAME  # set by slurmd in every process of a step, per emulated node


@dataclass(frozen=True)
class Process:
    """A process found by ``carrying``: its pid, its environment, where it was read."""

    pid: int
    environ: Mapping[str, str]
    entry: Path

    def cmdline(self) -> str | None:
        """Its command line, words joined by spaces; None if it exited meanwhile."""
        try:
            return (
                (self.entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            return None


def carrying(
    values: Mapping[str, str],
    node: str | None = None,
    skip: Collection[int] = (),
    proc: Path = PROC,
) -> Iterator[Process]:
    """The processes whose environment has each of ``values``, on ``node`` if given (see the
    module docstring), less the pids in ``skip``; in /proc's order."""
    marks = [f"\0{k}={v}\0".encode() for k, v in values.items()]
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            raw = b"\0%b\0" % (entry / "environ").read_bytes()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if not all(mark in raw for mark in marks):
            continue
        env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
        if node is not None and env.get(NODE_VAR, node) != node:
            continue  # another emulated node's, on a shared host
        yield Process(int(entry.name), env, entry)
