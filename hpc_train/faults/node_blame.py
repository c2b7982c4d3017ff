"""Task 0 blames a node: the ledger's record, the quarantine list, the drain, the exclusion.

Who is blamed comes from elsewhere: a hang's suspect (``hpc_train.watch.hang_monitor``), a node short of
GPUs (``hpc_train.launch.geometry``), a straggler (``hpc_train.watch.straggler_monitor``), the node of a crash
(``crash_suspect`` below), a node Slurm lost (``lost_nodes``). What follows is the same for all:

- the ledger's ``blamed`` event (node, its machine, why, the evidence, the verdict, drained);
- the quarantine list (``hpc_train.faults.quarantine``): a machine blamed twice within a day stays out;
- where the verdict drains (``hpc_train.faults.evidence``: evidence about the node itself, or the
  machine's second blame), ``scontrol update State=DRAIN Reason="hpc-train: …"`` unless
  ``--no-drain`` (a quarantined node's reason says so), and the caller leaves it out: of the
  in-job restart, and of the requeued job by its ``ExcNodeList`` (``exclude``; Slurm accepts it
  once the job is pending again). Where it does not, the run restarts on the node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_core.wait import FAST, Backoff, wait_until
from hpc_train.contract import StartFiles, last_round, read_beats
from hpc_train.faults import agent_exit, failures, quarantine
from hpc_train.faults.agent_exit import NodeExit
from hpc_train.faults.evidence import Evidence, Verdict
from hpc_train.faults.evidence import decide as weigh
from hpc_train.faults.failures import INFRASTRUCTURE, Failure

EVIDENCE_WAIT_S = 15.0
Log = Callable[[str], None]
Note = Callable[..., None]
# a node Slurm no longer runs jobs on: its own failure, not one a requeue can fix by itself
LOST_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND")
LOST_POLL = Backoff(1.0, 1.5, 5.0)  # Slurm's word on a node whose slurmd may be gone


class Blame(NamedTuple):
    """The node a stop is blamed on, why, and what the blame rests on."""

    node: str
    why: str
    evidence: Evidence


def blame(
    run: RunDir, job: str, restart: int, node: str, why: str, drain: bool, note: Note, log: Log,
    evidence: Evidence, **data: Any,
) -> Verdict:  # fmt: skip
    """Record ``node``'s blame against its machine and update the quarantine list; drain it
    where the verdict on ``evidence`` (``weigh``, with the machine's earlier blames) says so,
    unless ``drain`` is false (--no-drain). The verdict: whether the caller leaves it out."""
    try:
        machine = slurm.node_machine(node)
    except slurm.SlurmError as err:
        machine = ""  # counted with the name's other unknown ones (quarantine.machine_of)
        log(f"cannot tell {node}'s machine ({err}): the blame counts against the name")
    now = time.time()
    earlier = quarantine.earlier(ledger.read(run.ledger), node, machine, now)
    verdict = weigh(evidence, earlier)
    info = {"node": node, "why": why, "machine": machine}
    entries = quarantine.update(run, also=[ledger.Event("blamed", now, job, restart, info)])
    drained = False
    if drain and verdict.drain:
        try:
            slurm.drain(node, quarantine.drain_reason(node, why, entries, machine))
            drained = True
        except slurm.SlurmError as err:
            log(f"could not drain {node}: {err}")
    note("blamed", node=node, why=why, drained=drained, machine=machine,
         evidence=str(evidence), verdict=verdict.why, **data)  # fmt: skip
    kept = "; --no-drain: left out, not drained" if verdict.drain and not drain else ""
    held = (
        f" (quarantined: machine {machine or '?'} blamed twice within a day)"
        if quarantine.holds(entries, node, machine)
        else ""
    )
    log(f"blamed {node}: {why}; {verdict.why}{kept}{held}")
    return verdict


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
) -> Blame | None:
    """The node to blame for a crash, why, and on what evidence; None when it is the training
    code's (a user error is no node's fault) or no one node stands out (pure).

    In order: a rank whose own error is the machine's (a hardware finding: ECC, NVLink, Xid,
    NVML; else a CUDA or NCCL error, not a lost peer; ``rank_nodes`` from the heartbeats says
    where it ran); the one node whose torchrun, or the rank its torchrun names as the root cause,
    was killed by a signal we did not send (the OOM killer, ``kill -9``); the one node whose
    launcher wrote no exit record (it is gone: lost).
    """
    if any(f.cause != INFRASTRUCTURE for f in failures):
        return None
    own = sorted((f for f in failures if not f.witness), key=lambda f: (f.update, f.rank))
    for f in own:
        if f.rank in rank_nodes:
            found = Evidence.HARDWARE if f.hardware else Evidence.OWN_ERROR
            return Blame(rank_nodes[f.rank], f"rank {f.rank} failed: {f.describe()}", found)
    killed = [(e.node, why) for e in exits if (why := e.killed()) is not None]
    if len(killed) == 1:
        return Blame(*killed[0], Evidence.SIGNAL)
    silent = [h for h in hosts if h not in {e.node for e in exits}]
    if not killed and len(silent) == 1:
        why = "its launcher wrote no exit record (the node or its task is gone)"
        return Blame(silent[0], why, Evidence.LOST)
    return None


def rank_nodes(files: StartFiles, hosts: Sequence[str]) -> dict[int, str]:
    """Every rank of a start and its node, from the heartbeats (none with ``--no-watchdog``)."""
    return {beat.rank: beat.node for host in hosts for beat in read_beats(files.heartbeats(host))}


def crash_evidence(files: StartFiles, hosts: Sequence[str]) -> list[Failure]:
    """The start's failure reports, once every node has written its exit record (a worker
    reports before its torchrun exits; ``agent_exit.read`` has them then) or
    ``EVIDENCE_WAIT_S`` has passed."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: len(agent_exit.read(files, len(hosts))) >= len(hosts) or None,
            "every node's exit record", EVIDENCE_WAIT_S, FAST,
        )  # fmt: skip
    return failures.read(files)


def unrecorded_end(files: StartFiles) -> list[str]:
    """The nodes of the job's Slurm start before ``files``' if its last round ended without a
    word from the toolkit (no save on notice, no stop task 0 recorded): Slurm ended and requeued
    it itself (NODE_FAIL, an administrator's requeue). Empty otherwise. The job is
    ``files.job``, its id, never a round's name."""
    job, restart = files.job, files.restart
    if restart == 0:
        return []
    events = [e for e in ledger.read(files.run.ledger) if (e.job, e.restart) == (job, restart - 1)]
    before = StartFiles(files.run, job, restart - 1, last_round(events, job, restart - 1))
    if before.stop() is not None:
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


def unless_lost(found: Blame, job: str, log: Log, wait_s: float | None = None) -> Blame:
    """A signal kill (``found``) whose node Slurm then finds lost is a lost node: a node lost
    whole (chaos kill-node --stop-slurmd, a dead instance) first looks like its ranks killed,
    and Slurm marks it DOWN only after SlurmdTimeout. So: lost where Slurm says so already
    (``lost_nodes``); else, where no step starts on it any more (``slurm.step_starts``), lost
    once Slurm marks it not responding or down within ``wait_s`` (default: SlurmdTimeout, by
    which it has marked it DOWN). The probe alone never makes a node lost (a busy controller or
    the job's end fail it too): without Slurm's word the signal kill stands."""
    if not (gone := lost_nodes([found.node], log)):
        if slurm.step_starts(job, found.node):
            return found
        if wait_s is None:
            try:
                wait_s = slurm.slurmd_timeout_s()
            except slurm.SlurmError:
                wait_s = slurm.DEFAULT_SLURMD_TIMEOUT_S
        log(f"no step starts on {found.node}: waiting up to {wait_s:.0f} s for Slurm's word")
        with contextlib.suppress(TimeoutError):
            gone = wait_until(lambda: lost_nodes([found.node], log) or None,
                              f"Slurm's word on {found.node}", wait_s, LOST_POLL)  # fmt: skip
        if not gone:
            log(f"Slurm still counts {found.node} as up: weighed as {found.evidence}")
            return found
    why = f"{found.why}, then Slurm lost it: {gone[0][1]}"
    return Blame(found.node, why, Evidence.LOST)
