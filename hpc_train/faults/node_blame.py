"""Task 0 blames a node: the ledger's record, the quarantine list, the drain, the exclusion.

Who is blamed comes from elsewhere: a hang's suspect (``hpc_train.watch.hang_monitor``), a node short of
GPUs (``hpc_train.launch.geometry``), a straggler (``hpc_train.watch.straggler_monitor``), the node of a crash
(``crash_suspect`` below), a node Slurm lost (``lost_nodes``). What follows is the same for all:

- the ledger's ``blamed`` event (node, its machine, why, drained);
- the quarantine list (``hpc_train.faults.quarantine``): a machine blamed twice within a day stays out;
- ``scontrol update State=DRAIN Reason="hpc-train: …"`` unless ``--no-drain`` (a quarantined
  node's reason says so);
- the requeued job's ``ExcNodeList`` (Slurm accepts it once the job is pending again).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_core.wait import FAST, wait_until
from hpc_train.contract import last_round, read_beats, read_stop, round_key
from hpc_train.faults import agent_exit, failures, quarantine
from hpc_train.faults.agent_exit import NodeExit
from hpc_train.faults.failures import INFRASTRUCTURE, Failure

EVIDENCE_WAIT_S = 15.0
Log = Callable[[str], None]
Note = Callable[..., None]
# a node Slurm no longer runs jobs on: its own failure, not one a requeue can fix by itself
LOST_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND")


def blame(
    run: RunDir, job: str, restart: int, node: str, why: str, drain: bool, note: Note, log: Log,
    **data: Any,
) -> None:  # fmt: skip
    """Record ``node``'s blame against its machine, update the quarantine list, drain it
    (``drain``)."""
    try:
        machine = slurm.node_machine(node)
    except slurm.SlurmError as err:
        machine = ""  # counted with the name's other unknown ones (quarantine.machine_of)
        log(f"cannot tell {node}'s machine ({err}): the blame counts against the name")
    info = {"node": node, "why": why, "machine": machine}
    entries = quarantine.update(run, also=[ledger.Event("blamed", time.time(), job, restart, info)])
    drained = False
    if drain:
        try:
            slurm.drain(node, quarantine.drain_reason(node, why, entries, machine))
            drained = True
        except slurm.SlurmError as err:
            log(f"could not drain {node}: {err}")
    note("blamed", node=node, why=why, drained=drained, machine=machine, **data)
    quarantined = quarantine.holds(entries, node, machine)
    held = (
        f" (quarantined: machine {machine or '?'} blamed twice within a day)" if quarantined else ""
    )
    log(f"blamed {node}: {why}{'; drained' if drained else ''}{held}")


def exclude(job: str, nodes: Sequence[str], log: Log) -> None:
    """Keep ``nodes`` out of the requeued job (Slurm takes it once the job is pending)."""
    try:
        excluded = slurm.exclude(job, list(nodes))
        log(f"job {job} excludes {','.join(excluded)} from now on")
    except (slurm.SlurmError, TimeoutError) as err:
        log(f"could not exclude {', '.join(nodes)} from job {job}: {err}")


def crash_suspect(
    failures: Sequence[Failure],
    exits: Sequence[NodeExit],
    hosts: Sequence[str],
    rank_nodes: Mapping[int, str],
) -> tuple[str, str] | None:
    """The node to blame for a crash, with why; None when it is the training code's (a user
    error is no node's fault) or no one node stands out (pure).

    In order: a rank whose own error is the machine's (a CUDA or ECC error, not a lost peer;
    ``rank_nodes`` from the heartbeats says where it ran); the one node whose torchrun, or the
    rank its torchrun names as the root cause, was killed by a signal we did not send (the OOM
    killer, ``kill -9``); the one node whose launcher wrote no exit record (it is gone).
    """
    if any(f.cause != INFRASTRUCTURE for f in failures):
        return None
    own = sorted((f for f in failures if not f.witness), key=lambda f: (f.update, f.rank))
    for f in own:
        if f.rank in rank_nodes:
            return rank_nodes[f.rank], f"rank {f.rank} failed: {f.describe()}"
    killed = [(e.node, why) for e in exits if (why := e.killed()) is not None]
    if len(killed) == 1:
        return killed[0]
    silent = [h for h in hosts if h not in {e.node for e in exits}]
    if not killed and len(silent) == 1:
        return silent[0], "its launcher wrote no exit record (the node or its task is gone)"
    return None


def rank_nodes(run: RunDir, job: str, restart: int, hosts: Sequence[str]) -> dict[int, str]:
    """Every rank of a start and its node, from the heartbeats (none with ``--no-watchdog``)."""
    return {
        beat.rank: beat.node
        for host in hosts
        for beat in read_beats(run.heartbeats(job, restart, host))
    }


def crash_evidence(run: RunDir, job: str, restart: int, hosts: Sequence[str]) -> list[Failure]:
    """The start's failure reports, once every node has written its exit record (a worker
    reports before its torchrun exits; ``agent_exit.read`` has them then) or
    ``EVIDENCE_WAIT_S`` has passed."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: len(agent_exit.read(run, job, restart, len(hosts))) >= len(hosts) or None,
            "every node's exit record", EVIDENCE_WAIT_S, FAST,
        )  # fmt: skip
    return failures.read(run, job, restart)


def unrecorded_end(run: RunDir, job: str, restart: int) -> list[str]:
    """The nodes of the start before ``restart`` if its last round ended without a word from the
    toolkit (no save on notice, no stop task 0 recorded): Slurm ended and requeued it itself
    (NODE_FAIL, an administrator's requeue). Empty otherwise."""
    if restart == 0:
        return []
    events = [e for e in ledger.read(run.ledger) if (e.job, e.restart) == (job, restart - 1)]
    last = last_round(events, job, restart - 1)
    if read_stop(run, round_key(job, last), restart - 1) is not None:
        return []
    rounds = [i for i, e in enumerate(events) if e.kind == "restarted"]
    events = events[rounds[-1] + 1 :] if rounds else events  # the last round's own
    if any(e.kind in ("stopped", "blamed") for e in events):
        return []  # task 0 said how it ended (and blamed whom it could)
    started = [e.get("nodes") or [] for e in events if e.kind == "started"]
    return [str(n) for n in started[-1]] if started else []


def lost_nodes(nodes: Sequence[str], log: Log) -> list[tuple[str, str]]:
    """The nodes of ``nodes`` Slurm reports lost (down, failed, not responding), with state and
    reason: after a start Slurm itself ended and requeued (NODE_FAIL)."""
    lost = []
    for node in nodes:
        try:
            info = slurm.node_info(node)
        except slurm.SlurmError as err:
            log(f"cannot read node {node} ({err})")
            continue
        state = info.get("State", "")
        if any(mark in state.upper() for mark in LOST_STATES):
            lost.append((node, f"{state} ({info.get('Reason', 'no reason given')})"))
    return lost
