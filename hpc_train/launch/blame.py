"""Task 0 names the node behind a stop; ``hpc_train.faults.node_blame`` does what follows.

The one place the launcher picks whom to blame:

- ``for_stop``: after a hang (the suspect of ``watch.hang_monitor.blame``: every node's
  report) or a crash (``node_blame.crash_suspect``: the ranks' failure records and each
  node's agent exit);
- ``lost``: after a start Slurm ended by itself, the nodes it lost (NODE_FAIL);
- ``refused``: the nodes a start refused (short of GPUs, quarantined);
- ``stuck_launcher``: the node of a launcher the pulse found silent (``watch.launchers``).

Each blamed node goes to ``node_blame.blame`` with what the blame rests on
(``faults.evidence``: a hang's suspect with no stack or with every stack, a crash's signal kill,
rank error or hardware finding, a failed health check, a lost node, a stuck launcher); its verdict
says whether the node is drained (unless ``--no-drain``) and left out. A node that is not (a first
signal kill, say) is blamed, recorded and kept: the run restarts on it. The requeue that leaves a
node out is ``launch.requeue``'s, the in-job restart without it ``launch.spares``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpc_train.faults import agent_exit, failures, node_blame
from hpc_train.faults.evidence import Evidence, Verdict
from hpc_train.launch.context import Here, log
from hpc_train.watch import hang_monitor
from hpc_train.watch.hangs import Suspect


def _blame(
    here: Here, node: str, why: str, evidence: Evidence, deputy: bool = False, **data: Any
) -> Verdict:
    files, note = here.files, here.deputy_note if deputy else here.note
    return node_blame.blame(files.run, files.name, files.restart, node, why,
                            not here.spec.no_drain, note, log, evidence, **data)  # fmt: skip


def for_stop(here: Here, cause: str) -> tuple[Suspect | None, bool]:
    """Task 0: the node to blame for this stop (a hang's suspect, the node of a crash),
    blamed, and whether the verdict leaves it out of what follows; (None, False) when no node
    can be named. A crash's signal kill whose node Slurm then finds lost is a lost node
    (``node_blame.unless_lost``)."""
    files, hosts = here.files, here.start.hosts
    job = files.name  # as the log and the ledger have always said it (a round's: 41.1)
    if cause == "hang":
        found = hang_monitor.blame(files, hosts, log)
        why = f"hang in job {job}: {found.why}" if found else ""
    else:
        ranks = node_blame.rank_nodes(files, hosts)
        exits = agent_exit.read(files, len(hosts)).values()
        crash = node_blame.crash_suspect(failures.read(files), list(exits), hosts, ranks)
        if crash is not None and crash.evidence is Evidence.SIGNAL:
            crash = node_blame.unless_lost(crash, here.job_id, log)
        found = Suspect(crash.node, None, crash.why, crash.evidence) if crash else None
        why = f"crash in job {job}: {crash.why}" if crash else ""
    if found is None:
        return None, False
    # a suspect carries its evidence (watch.hangs.suspect, the crash above); one that did not
    # would rest on nothing about the node: weighed as the weakest, drained at a second blame
    evidence = found.evidence or Evidence.HANG_WITH_STACKS
    return found, _blame(here, found.node, why, evidence, rank=found.rank).drain


def lost(here: Here, previous_end: str) -> str:
    """Task 0, after a start Slurm ended by itself: blame the nodes it lost (NODE_FAIL: a
    lost node, drained; the requeued job is Slurm's and already left it);
    the previous start's end, as the log and the ledger say it."""
    found = node_blame.lost_nodes(node_blame.unrecorded_end(here.files), log)
    for node, state in found:
        _blame(here, node, f"node failure in job {here.job_id}: {state}", Evidence.LOST)
    if not found:
        return previous_end
    return f"node failure ({', '.join(f'{n} {s}' for n, s in found)}): last periodic checkpoint"


def refused(here: Here, nodes: Sequence[str], why: str) -> list[str]:
    """Task 0: a start refused ``nodes`` (short of GPUs, quarantined: a failed health check):
    each is blamed; the nodes the verdicts leave out (all of them)."""
    return [n for n in nodes if _blame(here, n, why, Evidence.HEALTH_CHECK).drain]


def stuck_launcher(here: Here, node: str, why: str, deputy: bool) -> bool:
    """The node of a stuck launcher, blamed by task 0 or by task 1 acting for it (``deputy``);
    whether the verdict leaves it out. The evidence is a hang with no Python stack: the
    launcher's own pulse thread stopped beating, so the whole process is frozen (SIGSTOP, a
    kernel hang in its I/O) and no stack can be asked of it; a launcher whose slurmd is gone
    is not acted on at all (``recovery.start_over``)."""
    return _blame(here, node, why, Evidence.HANG_NO_STACK, deputy=deputy).drain
