"""The one home for blame: which node a stop is blamed on, on what evidence, and what follows.

The watchers only report (a hang's node reports, ``hpc_train.watch.hang_monitor``; a straggler,
``hpc_train.watch.straggler_monitor``); task 0's launcher asks here, with its ``Blamer`` (the
start's files and nodes, ``--no-drain``, its ledger and log; task 1's, acting for a stuck task
0). Whom each stop blames, and on what (``hpc_train.faults.evidence``):

- ``for_stop``: a hang's suspect (``hang_suspect``: every node's report, ``suspect.json``) or a
  crash's (``suspects.crash_suspect``: the ranks' failure records and each node's agent exit; a
  signal kill whose node Slurm then loses is a lost node, ``unless_lost``);
- ``lost``: after a start Slurm ended by itself, the nodes it lost (NODE_FAIL);
- ``refused``: the nodes a start refused (short of GPUs, quarantined: a failed health check);
- ``stuck_launcher``: the node of a launcher the pulse found silent (a hang with no stack);
- ``straggler``: the node ``--evict-stragglers`` evicts (a measured straggler).

The suspect is ``suspects.Suspect``, the one type for all. What follows is the same for all
(``blame``):

- the ledger's ``blamed`` event (node, its machine, why, the evidence, the verdict, drained);
- the quarantine list (``hpc_train.faults.quarantine``): a machine blamed twice within a day stays out;
- where the verdict drains (``hpc_train.faults.evidence``: evidence about the node itself, or the
  machine's second blame), ``scontrol update State=DRAIN Reason="hpc-train: …"`` unless
  ``--no-drain`` (a quarantined node's reason says so), and the caller leaves it out: of the
  in-job restart, and of the requeued job by its ``ExcNodeList`` (``exclude``; Slurm accepts it
  once the job is pending again). Where it does not (a first signal kill, say), the node is
  blamed, recorded and kept: the run restarts on it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import SUSPECT, atomic_write, incident_reports
from hpc_core.wait import FAST, Backoff, wait_until
from hpc_train.contract import Cause, StartFiles, read_beats
from hpc_train.faults import agent_exit, failures, quarantine
from hpc_train.faults.evidence import DrainVerdict, Evidence, drain_verdict
from hpc_train.faults.failures import Failure
from hpc_train.faults.suspects import RankReport, Suspect, crash_suspect, hang_suspect

EVIDENCE_WAIT_S = 15.0
# for every node's hang report: each hang monitor before it stops its ranks, task 0 before it
# names the suspect
REPORT_WAIT_S = 20.0
Log = Callable[[str], None]
Note = Callable[..., None]
# a node Slurm no longer runs jobs on: its own failure, not one a requeue can fix by itself
LOST_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND")
LOST_POLL = Backoff(1.0, 1.5, 5.0)  # Slurm's word on a node whose slurmd may be gone


@dataclass(frozen=True)
class Blamer:
    """Who blames for one start: task 0 (or task 1 acting for it, with its own ``note``), the
    start's ``files`` and ``hosts``, ``drain`` (false: --no-drain), the ledger and the log."""

    files: StartFiles
    hosts: Sequence[str]
    drain: bool
    note: Note
    log: Log

    def blame(self, node: str, why: str, evidence: Evidence, **data: Any) -> DrainVerdict:
        """``blame`` for this start."""
        return blame(self.files, node, why, self.drain, self.note, self.log, evidence, **data)


def for_stop(by: Blamer, cause: Cause) -> tuple[Suspect | None, bool]:
    """Task 0: the node to blame for this stop (a hang's suspect, the node of a crash),
    blamed, and whether the verdict leaves it out of what follows; (None, False) when no node
    can be named. A crash's signal kill whose node Slurm then finds lost is a lost node
    (``unless_lost``)."""
    files, hosts = by.files, by.hosts
    job = files.name  # as the log and the ledger have always said it (a round's: 41.1)
    if cause == Cause.HANG:
        found = name_hang_suspect(files, hosts, by.log)
        why = f"hang in job {job}: {found.why}" if found else ""
    else:
        ranks = rank_nodes(files, hosts)
        exits = agent_exit.read(files, len(hosts)).values()
        found = crash_suspect(failures.read(files), list(exits), hosts, ranks)
        if found is not None and found.evidence is Evidence.SIGNAL:
            found = unless_lost(found, files.job, by.log)
        why = f"crash in job {job}: {found.why}" if found else ""
    if found is None:
        return None, False
    return found, by.blame(found.node, why, found.evidence, rank=found.rank).drain


def lost(by: Blamer, previous_end: str) -> str:
    """Task 0, after a start Slurm ended by itself: blame the nodes it lost (NODE_FAIL: a
    lost node, drained; the requeued job is Slurm's and already left it);
    the previous start's end, as the log and the ledger say it."""
    found = lost_nodes(unrecorded_end(by.files), by.log)
    for node, state in found:
        by.blame(node, f"node failure in job {by.files.job}: {state}", Evidence.LOST)
    if not found:
        return previous_end
    return f"node failure ({', '.join(f'{n} {s}' for n, s in found)}): last periodic checkpoint"


def refused(by: Blamer, nodes: Sequence[str], why: str) -> list[str]:
    """Task 0: a start refused ``nodes`` (short of GPUs, quarantined: a failed health check):
    each is blamed; the nodes the verdicts leave out (all of them)."""
    return [n for n in nodes if by.blame(n, why, Evidence.HEALTH_CHECK).drain]


def stuck_launcher(by: Blamer, node: str, why: str) -> bool:
    """The node of a stuck launcher, blamed by task 0 or by task 1 acting for it (its
    ``Blamer``); whether the verdict leaves it out. The evidence is a hang with no Python stack:
    the launcher's own pulse thread stopped beating, so the whole process is frozen (SIGSTOP, a
    kernel hang in its I/O) and no stack can be asked of it; a launcher whose slurmd is gone
    is not acted on at all (``launch.recovery.start_over``)."""
    return by.blame(node, why, Evidence.HANG_NO_STACK).drain


def straggler(by: Blamer, node: str, describe: str) -> Suspect:
    """Task 0's straggler watch evicts ``node`` (``--evict-stragglers``): blamed on a measured
    straggler (always drained, unless --no-drain); the suspect the start's end names."""
    by.blame(node, f"straggler in job {by.files.job}: {describe}", Evidence.STRAGGLER)
    return Suspect(node, f"straggler: {describe}", Evidence.STRAGGLER)


def wait_for_reports(incident: Path, nodes: int, timeout: float) -> int:
    """Wait until ``nodes`` nodes have reported a hang (or ``timeout``); how many did."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: len(incident_reports(incident)) >= nodes or None,
            "every node's hang report",
            timeout,
            Backoff(0.2, 1.5, 1.0),
        )
    return len(incident_reports(incident))


def name_hang_suspect(files: StartFiles, hosts: Sequence[str], log: Log) -> Suspect | None:
    """Task 0, after a hang: name the suspect from every node's report (``hang_suspect``) and
    record it in ``suspect.json``. None when no node can be named."""
    incident = files.incident
    wait_for_reports(incident, len(hosts), REPORT_WAIT_S)
    reports = []
    for path in incident_reports(incident):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    ranks = [RankReport(**r) for report in reports for r in report.get("ranks", [])]
    nodes = list(hosts) or sorted({r.node for r in ranks})
    found = hang_suspect(ranks, [str(r["node"]) for r in reports], nodes)
    record = {"suspect": found._asdict() if found else None, "time": time.time()}
    atomic_write(incident / SUSPECT, json.dumps(record))
    if found is None:
        log("hang: no suspect node (no rank had completed an update)")
    else:
        log(f"hang: suspect {found.node}: {found.why}")
    return found


def blame(
    files: StartFiles, node: str, why: str, drain: bool, note: Note, log: Log,
    evidence: Evidence, **data: Any,
) -> DrainVerdict:  # fmt: skip
    """Record ``node``'s blame against its machine and update the quarantine list; drain it
    where the verdict on ``evidence`` (``drain_verdict``, with the machine's earlier blames) says so,
    unless ``drain`` is false (--no-drain). The verdict: whether the caller leaves it out."""
    try:
        machine = slurm.node_machine(node)
    except slurm.SlurmError as err:
        machine = ""  # counted with the name's other unknown ones (quarantine.machine_of)
        log(f"cannot tell {node}'s machine ({err}): the blame counts against the name")
    now = time.time()
    run = files.run
    earlier = quarantine.earlier(ledger.read(run.ledger), node, machine, now)
    verdict = drain_verdict(evidence, earlier)
    info = {"node": node, "why": why, "machine": machine}
    entries = quarantine.update(
        run, also=[ledger.Event(Kind.BLAMED, now, files.name, files.restart, info)]
    )
    drained = False
    if drain and verdict.drain:
        try:
            slurm.drain(node, quarantine.drain_reason(node, why, entries, machine))
            drained = True
        except slurm.SlurmError as err:
            log(f"could not drain {node}: {err}")
    note(Kind.BLAMED, node=node, why=why, drained=drained, machine=machine,
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
    events = ledger.read(files.run.ledger)
    before = files.previous_start(events)
    if before is None or before.stop() is not None:
        return []
    events = [e for e in events if (e.job, e.restart) == (job, restart - 1)]
    rounds = [i for i, e in enumerate(events) if e.kind == Kind.RESTARTED]
    events = events[rounds[-1] + 1 :] if rounds else events  # the last round's own
    if any(e.kind in (Kind.STOPPED, Kind.BLAMED) for e in events):
        return []  # task 0 said how it ended (and blamed whom it could)
    started = [e.get("nodes") or [] for e in events if e.kind == Kind.STARTED]
    return [str(n) for n in started[-1]] if started else []


def lost_state(node: str) -> str | None:
    """``node``'s state and reason where Slurm reports it lost (down, failed, not responding),
    else None; SlurmUnreachable while the controller does not answer."""
    info = slurm.node_info(node)
    state = info.get("State", "")
    if any(mark in state.upper() for mark in LOST_STATES):
        return f"{state} ({info.get('Reason', 'no reason given')})"
    return None


def lost_nodes(nodes: Sequence[str], log: Log) -> list[tuple[str, str]]:
    """The nodes of ``nodes`` Slurm reports lost (down, failed, not responding), with state and
    reason: after a start Slurm itself ended and requeued (NODE_FAIL)."""
    lost = []
    for node in nodes:
        try:
            state = lost_state(node)
        except slurm.SlurmError as err:
            log(f"cannot read node {node} ({err})")
            continue
        if state is not None:
            lost.append((node, state))
    return lost


def unless_lost(
    found: Suspect, job: str, log: Log, wait_s: float | None = None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> Suspect:  # fmt: skip
    """A signal kill (``found``) whose node Slurm then finds lost is a lost node: a node lost
    whole (chaos kill-node --stop-slurmd, a dead instance) first looks like its ranks killed,
    and Slurm marks it DOWN only after SlurmdTimeout. So: lost where Slurm says so already
    (``lost_state``); else, where no step starts on it any more (``slurm.step_starts``), lost
    once Slurm marks it not responding or down within ``wait_s`` (default: SlurmdTimeout, read
    once while the controller answers, by which it has marked it DOWN), the step probed again
    at each look (a step that starts ends the wait: a controller just back refuses the first
    ones). The probe alone never makes a node lost (the job's end fails it too): without
    Slurm's word the signal kill stands. Slurm's silence is no word (``slurm.SlurmUnreachable``,
    a probe that says None): the node is asked about again every few seconds, and the wait for
    Slurm's word begins afresh once the controller answers, for at most
    ``slurm.SILENCE_PATIENCE_S`` of silence in all."""
    node, deadline, silent = found.node, None, 0.0
    for delay in LOST_POLL.delays():
        try:
            if (gone := _said_lost(node, log)) is not None:
                return found._replace(why=f"{found.why}, then Slurm lost it: {gone}",
                                      evidence=Evidence.LOST)  # fmt: skip
            if (starts := slurm.step_starts(job, node)) is None:
                raise slurm.SlurmUnreachable(f"no step probed on {node}")
            if starts:
                return found
            if deadline is None:
                waiting = wait_s if wait_s is not None else _slurmd_timeout_s()
                deadline = clock() + waiting
                log(f"no step starts on {node}: waiting up to {waiting:.0f} s for Slurm's word")
        except slurm.SlurmUnreachable as err:
            silent, deadline = silent + delay, None  # once it answers: probed afresh
            if silent > slurm.SILENCE_PATIENCE_S:
                log(f"Slurm silent for {silent:.0f} s ({err}): weighed as {found.evidence}")
                return found
            log(f"Slurm does not answer ({err}): asking again about {node} in {delay:.0f} s")
        if deadline is not None and clock() >= deadline:
            log(f"Slurm still counts {node} as up: weighed as {found.evidence}")
            return found
        sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover - delays() never ends


def _said_lost(node: str, log: Log) -> str | None:
    """``lost_state``, a refusal logged and read as not lost; SlurmUnreachable passes."""
    try:
        return lost_state(node)
    except slurm.SlurmUnreachable:
        raise
    except slurm.SlurmError as err:
        log(f"cannot read node {node} ({err})")
        return None


def _slurmd_timeout_s() -> float:
    """SlurmdTimeout (``slurm.slurmd_timeout_s``: read once while the controller answers);
    Slurm's default where the controller refuses to say. SlurmUnreachable passes."""
    try:
        return slurm.slurmd_timeout_s()
    except slurm.SlurmUnreachable:
        raise
    except slurm.SlurmError:
        return slurm.DEFAULT_SLURMD_TIMEOUT_S
