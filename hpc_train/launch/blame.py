"""Task 0 names the node behind a stop; ``hpc_train.faults.node_blame`` does what follows.

The one place the launcher picks whom to blame:

- ``for_stop``: after a hang (the suspect of ``watch.hang_monitor.blame``: every node's
  report) or a crash (``node_blame.crash_suspect``: the ranks' failure records and each
  node's agent exit);
- ``lost``: after a start Slurm ended by itself, the nodes it lost (NODE_FAIL);
- ``refused``: the nodes a start refused (short of GPUs, quarantined);
- ``stuck_launcher``: the node of a launcher the pulse found silent (``watch.launchers``).

Each blamed node goes to ``node_blame.blame`` (the ledger's ``blamed``, the quarantine list, a
drain unless ``--no-drain``); the requeue that leaves it out is ``launch.requeue``'s, the in-job
restart without it ``launch.spares``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpc_train.faults import agent_exit, failures, node_blame
from hpc_train.launch.context import Here, log
from hpc_train.watch import hang_monitor
from hpc_train.watch.hangs import Suspect


def _blame(here: Here, node: str, why: str, deputy: bool = False, **data: Any) -> None:
    job, restart = here.key
    note = here.deputy_note if deputy else here.note
    node_blame.blame(here.run, job, restart, node, why, not here.spec.no_drain, note, log, **data)


def for_stop(here: Here, cause: str) -> Suspect | None:
    """Task 0: the node to blame for this stop (a hang's suspect, the node of a crash),
    blamed; None when no node can be named."""
    run, (job, restart), hosts = here.run, here.key, here.start.hosts
    if cause == "hang":
        found = hang_monitor.blame(run, job, restart, hosts, log)
        why = f"hang in job {job}: {found.why}" if found else ""
    else:
        ranks = node_blame.rank_nodes(run, job, restart, hosts)
        exits = agent_exit.read(run, job, restart, len(hosts)).values()
        crash = node_blame.crash_suspect(failures.read(run, job, restart), list(exits), hosts,
                                         ranks)  # fmt: skip
        found = Suspect(crash[0], None, crash[1]) if crash else None
        why = f"crash in job {job}: {crash[1]}" if crash else ""
    if found is not None:
        _blame(here, found.node, why, rank=found.rank)
    return found


def lost(here: Here, previous_end: str) -> str:
    """Task 0, after a start Slurm ended by itself: blame the nodes it lost (NODE_FAIL);
    the previous start's end, as the log and the ledger say it."""
    job, restart = here.key
    found = node_blame.lost_nodes(node_blame.unrecorded_end(here.run, job, restart), log)
    for node, state in found:
        _blame(here, node, f"node failure in job {job}: {state}")
    if not found:
        return previous_end
    return f"node failure ({', '.join(f'{n} {s}' for n, s in found)}): last periodic checkpoint"


def refused(here: Here, nodes: Sequence[str], why: str) -> None:
    """Task 0: a start refused ``nodes`` (short of GPUs, quarantined): each is blamed."""
    for node in nodes:
        _blame(here, node, why)


def stuck_launcher(here: Here, node: str, why: str, deputy: bool) -> None:
    """The node of a stuck launcher, blamed by task 0 or by task 1 acting for it (``deputy``)."""
    _blame(here, node, why, deputy=deputy)
