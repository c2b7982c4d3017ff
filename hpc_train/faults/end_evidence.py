"""The evidence of a start's end, read once: one value (``EndEvidence``) for the policy.

"What happens when a rank crashes" is three short steps, each in one file:

1. evidence (here): what the launcher saw of torchrun's end (``Ended``: its exit, a hang, a
   straggler evicted, a stuck agent), this round's files (every node's exit record and
   heartbeats, the ranks' failure reports, the hang reports), the round before's failure
   reports, and the ledger, each file read once; then what Slurm says (``SlurmWord``), asked
   only when the policy needs it (``ask``, the one place a decision reads Slurm);
2. the policy, pure: ``hpc_train.launch.restart_policy.after_end(evidence, options)`` gives
   one ``hpc_train.launch.transition.Transition``, or asks Slurm again after a back-off;
3. the executor: ``hpc_train.launch.recovery`` carries it out (ledger, blames and drains,
   the round's verdict, the spares, requeue or hold).

The other ends of a start are evidence of the same type (``Ending``): a start refused (a node
short of GPUs), a run that stopped advancing, max-update reached before training, the notice
(``checkpoint()``) and a stuck launcher found by the pulse. The rank's side of a crash is
``hpc_train.worker.crash``; the picks of a suspect are ``faults.suspects`` (pure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

from hpc_core import doorbell, ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import incident_reports
from hpc_train.contract import Beat, Cause, FailureRecord, RoundVerdict, StartFiles, read_beats
from hpc_train.faults import failures
from hpc_train.faults.failures import Failure, NodeExit, Probe
from hpc_train.faults.suspects import RankReport, Suspect, code_at_fault

EVIDENCE_WAIT_S = 15.0  # for every node's exit record after a crash (a worker reports first)
# after a node's record says a signal from outside killed it: the longest another node killed by
# the same fault may take to say so too (its agent sees its own rank die, as this one did); the
# records still missing then are of nodes whose ranks die of the lost peer, never evidence
KILLED_GRACE_S = 3.0
# for every node's hang report: each hang monitor before it stops its ranks, task 0 before it
# names the suspect
REPORT_WAIT_S = 20.0
# a node Slurm no longer runs jobs on: its own failure, not one a requeue can fix by itself
LOST_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND")


def cpu_s() -> float:
    """This process's CPU seconds so far: its threads', and those of the children it waited for
    (the Slurm clients a decision runs). A decision's CPU is its work; the rest of its time is
    waiting, which a loaded machine stretches (39 hollow nodes on 2 cores, issue 46)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class Ending(StrEnum):
    """How a start ended, as the launcher met it."""

    EXITED = "torchrun exited"
    REFUSED = "start refused"  # a node short of GPUs, quarantined, failing its check
    NO_PROGRESS = "no progress"  # restarts that never advanced (task 0's decision says so)
    NO_GOOD_CHECKPOINT = "no checkpoint verifies"  # every one set aside (task 0's decision)
    REACHED = "max-update reached before training"
    NOTICE = "notice"  # submitit's checkpoint() on task 0: the save on notice waited for
    SILENT = "stuck launcher"  # the pulse found a watched launcher silent
    UNRECORDED = "ended without a word"  # (the start before) Slurm ended it: NODE_FAIL


@dataclass(frozen=True)
class Ended:
    """How torchrun ended on this node, and what its watchers saw meanwhile."""

    returncode: int
    saved: bool  # the save on notice is durable (the stop marker)
    hang: str | None = None  # the hang the hang monitor stopped the ranks for
    evicted: Suspect | None = None  # the straggler evicted (--evict-stragglers): its measurement
    stuck: str | None = None  # torchrun outlived its ranks: the hang monitor killed it
    # a failed end's storage evidence from this node, kept in memory (never a file on the save
    # dir): its ranks' reports said on stderr (``agent_exit.Tee.failures``), its probe
    said: tuple[FailureRecord, ...] = ()
    probe: Probe | None = None


# --- what Slurm says, asked once per question ----------------------------------------------------


@dataclass(frozen=True)
class Question:
    """What the policy needs Slurm to say before it can decide."""

    job: bool = False  # the job's state and restart count
    nodes: tuple[str, ...] = ()  # each node's state, reason and machine
    steps: tuple[str, ...] = ()  # does a step of the job still start there
    slurmd_timeout: bool = False  # how long Slurm waits for a silent slurmd
    partition: bool = False  # every node of the partition (sinfo) and the job's ExcNodeList
    partition_name: str | None = None  # which partition (None: the default one)


@dataclass(frozen=True)
class JobWord:
    state: str = ""
    restarts: int = 0
    error: str = ""  # Slurm did not answer
    excluded: str = ""  # the job's ExcNodeList as Slurm writes it ("": none)


@dataclass(frozen=True)
class NodeWord:
    state: str = ""
    reason: str = ""
    machine: str = ""
    time: float = 0.0
    error: str = ""
    silent: bool = False  # the error is the controller's silence, not a refusal

    @property
    def lost(self) -> bool:
        """Slurm no longer runs jobs on it (down, failed, not responding)."""
        return not self.error and any(mark in self.state.upper() for mark in LOST_STATES)


@dataclass(frozen=True)
class PartitionWord:
    states: Mapping[str, str] = field(default_factory=dict)  # sinfo: node -> state
    excluded: tuple[str, ...] = ()  # the job's ExcNodeList
    error: str = ""
    time: float = 0.0  # when Slurm said it


@dataclass(frozen=True)
class SlurmWord:
    """Every answer Slurm gave for one decision (the latest per node)."""

    job: JobWord | None = None
    nodes: Mapping[str, NodeWord] = field(default_factory=dict)
    asked: Mapping[str, int] = field(default_factory=dict)  # node -> how often asked
    # does a step start there (None: Slurm did not say), when probed
    steps: Mapping[str, tuple[bool | None, float]] = field(default_factory=dict)
    slurmd_timeout_s: float | None = None
    partition: PartitionWord | None = None
    # node -> since when no step starts there, Slurm answering at every probe since
    no_start_since: Mapping[str, float] = field(default_factory=dict)
    silence: str = ""  # what the controller's silence was in the last ask ("": it answered)
    silent_s: float = 0.0  # the seconds of silence over this decision's asks, in all
    last_s: float = 0.0  # when Slurm was last asked
    questions: int = 0  # the questions asked for this decision
    waited_s: float = 0.0  # the seconds waited for their answers, in all
    slowest: tuple[str, float] = ("", 0.0)  # the slowest part of any (``step n2``), its seconds


def ask(
    question: Question, word: SlurmWord, job_id: str, clock: Callable[[], float] = time.time
) -> SlurmWord:
    """Ask Slurm ``question`` about job ``job_id``; ``word`` with the answers added. The one
    place a decision after a start's end reads Slurm: one ``scontrol show job`` (its state,
    restart count and ExcNodeList; asked for the partition's question too where this decision
    has no answer of it yet), one ``scontrol show node`` per node asked, one step probe per
    node, one ``scontrol show config``, one ``sinfo``. The parts of one question are asked at
    once (``_at_once``): it waits for its slowest answer, not for their sum. An error is an
    answer too (``error``): the policy says what it makes of it. The controller's silence is
    kept apart from a refusal (``silence``, ``silent_s``: the seconds since the ask before,
    counted when this one went unanswered)."""
    fetch_job = question.job or (question.partition and (word.job is None or bool(word.job.error)))
    calls: dict[str, Callable[[], Any]] = {f"node {n}": partial(_node, n, clock)
                                           for n in question.nodes}  # fmt: skip
    calls |= {f"step {n}": partial(_probe, job_id, n, clock) for n in question.steps}
    calls |= {"job": partial(_job, job_id)} if fetch_job else {}
    calls |= {"config": _slurmd_timeout} if question.slurmd_timeout else {}
    calls |= {"sinfo": partial(_sinfo, question.partition_name)} if question.partition else {}
    began, took = clock(), dict[str, float]()
    got = _at_once({name: _timed(name, call, took, clock) for name, call in calls.items()})
    slowest = max([word.slowest, *took.items()], key=lambda part: part[1])
    job = got.get("job", word.job)
    nodes, asked = dict(word.nodes), dict(word.asked)
    for node in question.nodes:
        nodes[node], asked[node] = got[f"node {node}"], asked.get(node, 0) + 1
    silence = [nodes[n].error for n in question.nodes if nodes[n].silent]
    steps, since = dict(word.steps), dict(word.no_start_since)
    for node in question.steps:
        steps[node] = got[f"step {node}"]
        if steps[node][0] is False:
            since.setdefault(node, steps[node][1])
        else:  # a step started, or Slurm said nothing: the wait for its word begins afresh
            since.pop(node, None)
            silence += [f"no step probed on {node}"] if steps[node][0] is None else []
    timeout = word.slurmd_timeout_s
    if question.slurmd_timeout:
        timeout, unanswered = got["config"]
        timeout = word.slurmd_timeout_s if timeout is None else timeout
        silence += [unanswered] if unanswered else []
    now = clock()
    part = _partition(got["sinfo"], job, now) if question.partition else word.partition
    silent_s = word.silent_s + (now - (word.last_s or now) if silence else 0.0)
    return SlurmWord(job, nodes, asked, steps, timeout, part, since, "; ".join(silence), silent_s,
                     now, word.questions + 1, word.waited_s + now - began, slowest)  # fmt: skip


def _timed(
    name: str, call: Callable[[], Any], took: dict[str, float], clock: Callable[[], float]
) -> Callable[[], Any]:
    """``call``, its seconds kept in ``took[name]`` (which part of a question Slurm was slowest
    to answer: the step probe, at 39 hollow nodes on 2 cores)."""

    def timed() -> Any:
        began = clock()
        try:
            return call()
        finally:
            took[name] = clock() - began

    return timed


def _at_once(calls: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each of ``calls`` (a Slurm client each, every one catching its own error) at once, a
    thread each; their answers by name. One alone is made here (issue 46: a requeue's
    decision made five in a row, each slower the more nodes loaded the controller and the
    cores: 1.45 s of it at 39 hollow nodes, 0.07 s at 2)."""
    if len(calls) <= 1:
        return {name: call() for name, call in calls.items()}
    with ThreadPoolExecutor(len(calls), thread_name_prefix="slurm-ask") as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def _job(job_id: str) -> JobWord:
    try:
        state = slurm.job_state(job_id)
    except slurm.SlurmError as err:
        return JobWord(error=str(err))
    return JobWord(state.state, state.restarts, excluded=state.excluded)


def _node(node: str, clock: Callable[[], float]) -> NodeWord:
    try:
        info = slurm.node_info(node)
    except slurm.SlurmError as err:
        silent = isinstance(err, slurm.SlurmUnreachable)
        return NodeWord(time=clock(), error=str(err), silent=silent)
    state, reason = info.get("State", ""), info.get("Reason", "no reason given")
    return NodeWord(state, reason, slurm.machine(info), clock())


def _probe(job_id: str, node: str, clock: Callable[[], float]) -> tuple[bool | None, float]:
    """Does a step of the job start on ``node`` (``slurm.step_starts``), and when it was said."""
    starts = slurm.step_starts(job_id, node)
    return starts, clock()


def _slurmd_timeout() -> tuple[float | None, str]:
    """SlurmdTimeout (Slurm's default where the configuration cannot be read), or (None, the
    controller's silence)."""
    try:
        return slurm.slurmd_timeout_s(), ""
    except slurm.SlurmUnreachable as err:
        return None, str(err)
    except slurm.SlurmError:
        return slurm.DEFAULT_SLURMD_TIMEOUT_S, ""


def _sinfo(name: str | None) -> dict[str, str] | str:
    """Every node of the partition and its state; what Slurm said instead, where it failed."""
    try:
        return slurm.partition_nodes(name)
    except slurm.SlurmError as err:
        return str(err)


def _partition(states: dict[str, str] | str, job: JobWord | None, now: float) -> PartitionWord:
    """The partition's word: sinfo's ``states`` and the job's ExcNodeList (``job``'s)."""
    if isinstance(states, str):
        return PartitionWord(error=states, time=now)
    if job is None or job.error:  # ``ask`` asked the job with the partition where it had none
        return PartitionWord(error=job.error if job else "the job not asked", time=now)
    try:
        out = slurm.hostnames(job.excluded) if job.excluded else []
    except slurm.SlurmError as err:
        return PartitionWord(error=str(err), time=now)
    return PartitionWord(states, tuple(out), time=now)


# --- the evidence: a start's end, read once ------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """Whose end it is: one node's start (its round), as the launcher knows it."""

    files: StartFiles  # the round's (its job id, restart, round)
    task: int
    hosts: tuple[str, ...]  # the round's nodes, in task order
    num_nodes: int
    standby: tuple[str, ...] = ()  # the hot spares standing by
    node: str = ""  # this node
    spent: int = 0  # the restarts the one budget counted before this start


@dataclass(frozen=True)
class EndEvidence:
    """One start's end on one node, as the policy weighs it: every file read once."""

    ending: Ending
    where: Where
    time: float  # when the evidence was read
    events: tuple[ledger.Event, ...] = ()  # the ledger
    ended: Ended | None = None  # EXITED: how torchrun ended here
    signals: tuple[str, ...] = ()  # SIGTERM / notice, in the order this task got them
    beats: Mapping[str, tuple[Beat, ...]] = field(default_factory=dict)  # by the node's dir
    failures: tuple[Failure, ...] = ()  # the round's failure reports (files and stderr)
    before: tuple[Failure, ...] = ()  # the round before's (a user error again?)
    exits: tuple[NodeExit, ...] = ()  # every node's exit record (task 0)
    hang_ranks: tuple[RankReport, ...] = ()  # every node's hang report (task 0, a hang)
    hang_reported: tuple[str, ...] = ()  # the nodes that sent one
    detail: str = ""  # REFUSED, NO_PROGRESS: why; SILENT: the silence; REACHED: where it is
    nodes: tuple[str, ...] = ()  # REFUSED: the nodes refused; SILENT: the silent one
    saved: bool = False  # NOTICE: the save on notice is durable
    own_cause: Cause | None = None  # NOTICE: task 0's own notice's cause (a grow, a hang)
    training: bool = False  # SILENT: the ranks are training
    slurm: SlurmWord = field(default_factory=SlurmWord)
    probes: tuple[Probe, ...] = ()  # EXITED: each node's probe of the save dir it sent
    needed: int | None = None  # EXITED, a failure: the bytes one checkpoint takes
    decided: RoundVerdict | None = None  # EXITED, task 0: the round's verdict written already
    read_s: float = 0.0  # EXITED: the seconds reading it took (task 0's wait for records in it)
    read_cpu_s: float = 0.0  # EXITED: the CPU seconds it took (``cpu_s``)

    def answered(self, word: SlurmWord) -> EndEvidence:
        """This evidence with Slurm's newer word."""
        return dataclasses.replace(self, slurm=word)


def at_exit(where: Where, ended: Ended, signals: Sequence[str], updates: int) -> EndEvidence:
    """torchrun exited on this node: read this round's evidence once. Every node reads its own
    heartbeats and the failure reports; task 0 every node's heartbeats (the ranks' nodes, how
    far the round got: it alone blames and records; every node read them all before, N x N
    reads, issue 46) and, after a crash no report puts on the training code, waits for the exit
    records (a worker reports before its torchrun exits; ``_exits_awaited``: each read once as
    it comes, the reports read again if it waited), after a hang for every node's hang report;
    whoever weighs a crash reads the round before's reports."""
    files, hosts, node, began, cpu = where.files, where.hosts, where.node, time.time(), cpu_s()
    if where.task == 0 and (decided := files.verdict()) is not None:
        # the round's end was decided before task 0 weighed it: task 1 for this stuck launcher
        # (SIGCONT'd by the requeue, it ran on to here), or this launcher's pulse: nothing more
        # to read (the policy adds nothing)
        read = time.time()
        return EndEvidence(Ending.EXITED, where, read, ended=ended, signals=tuple(signals),
                           decided=decided, read_s=read - began,
                           read_cpu_s=cpu_s() - cpu)  # fmt: skip
    readers = [*hosts, node] if where.task == 0 else [node]  # the others weigh their own end
    beats = {h: tuple(read_beats(files.heartbeats(h))) for h in dict.fromkeys(readers)}
    own = beats[node]
    finished = bool(own) and min(b.update for b in own) >= updates  # by the beats alone
    crashed = ended.returncode != 0 and ended.hang is None and not ended.stuck and not finished
    exits: tuple[NodeExit, ...] = ()
    reports = tuple(failures.read(files))
    # a report that says the training code failed blames no node, whatever the exit records say
    if where.task == 0 and crashed and not code_at_fault(reports):
        exits, waited = _exits_awaited(files, len(hosts))
        reports = tuple(failures.read(files)) if waited else reports  # written meanwhile
    now, probes = _reports_and_probes(reports, ended, exits)
    events = tuple(ledger.read(files.run.ledger))
    before: tuple[Failure, ...] = ()
    if now and crashed and (previous := files.round_before(events)) is not None:
        before = tuple(failures.read(previous))
    ranks: tuple[RankReport, ...] = ()
    reported: tuple[str, ...] = ()
    stuck_hang = ended.stuck is not None and not ended.saved and not (finished and not now)
    if where.task == 0 and (ended.hang is not None or stuck_hang):
        ranks, reported = read_hang_reports(files.incident, len(hosts))
    needed = failures.checkpoint_bytes(events, files.run.checkpoint_last) if probes else None
    read = time.time()
    return EndEvidence(
        Ending.EXITED, where, read, events, ended, tuple(signals), beats, now, before,
        exits, ranks, reported, probes=probes, needed=needed, read_s=read - began,
        read_cpu_s=cpu_s() - cpu,
    )  # fmt: skip


def _reports_and_probes(
    reports: Sequence[Failure], ended: Ended, exits: Sequence[NodeExit]
) -> tuple[tuple[Failure, ...], tuple[Probe, ...]]:
    """The round's failure reports: the files (``reports``, read), then those said on stderr
    (this node's, in ``ended``; the others', in their exit records) of ranks with no file; and
    the save dir's probes (this node's first)."""
    found = list(reports)
    said = [Failure(**asdict(r)) for r in ended.said] + [f for e in exits for f in e.reports()]
    ranks = {f.rank for f in found}
    for failure in said:
        if failure.rank not in ranks:
            found.append(failure)
            ranks.add(failure.rank)
    probes = {p.node: p for p in (e.probed() for e in exits) if p is not None}
    if ended.probe is not None:
        probes = {ended.probe.node: ended.probe, **probes, ended.probe.node: ended.probe}
    return tuple(found), tuple(probes.values())


def at_start(ending: Ending, where: Where, **more: Any) -> EndEvidence:
    """A start that ends before or beside training (refused, no progress, max-update reached,
    the notice, a stuck launcher): the ledger, read once, and what the caller knows (``more``:
    the ``EndEvidence`` fields of its ending)."""
    return EndEvidence(
        ending, where, time.time(), tuple(ledger.read(where.files.run.ledger)), **more
    )


def at_notice(where: Where, saved: bool, own_cause: Cause | None) -> EndEvidence:
    """Task 0's ``checkpoint()`` waited for the save on notice (``saved``): the ledger and the
    round's heartbeats (how far it got), each read once."""
    files = where.files
    beats = {h: tuple(read_beats(files.heartbeats(h))) for h in where.hosts}
    return at_start(Ending.NOTICE, where, beats=beats, saved=saved, own_cause=own_cause)


def at_next_start(where: Where, previous_end: str) -> EndEvidence:
    """Task 0 at a start after one Slurm ended by itself (no word from the toolkit): the nodes of
    that start (``unrecorded_end``), to ask Slurm which it lost; ``previous_end``: what the log
    says of it otherwise."""
    events = tuple(ledger.read(where.files.run.ledger))
    nodes = tuple(unrecorded_end(where.files, events))
    return EndEvidence(Ending.UNRECORDED, where, time.time(), events, detail=previous_end,
                       nodes=nodes)  # fmt: skip


def _exits_awaited(
    files: StartFiles, nodes: int, clock: Callable[[], float] = time.time
) -> tuple[tuple[NodeExit, ...], bool]:
    """Every node's exit record, each read once as it appears, and whether that took a wait.
    Waited for until all are in; or until ``KILLED_GRACE_S`` after one that says its node was
    killed by a signal from outside was written (its file's time: the killed node's agent
    saw its own rank die and said so first, often seconds before task 0's torchrun ended; the
    records missing then are of nodes still tearing down ranks that died of the lost peer: at
    16 real nodes the last came 14 s after task 0's, issue 46); at most ``EVIDENCE_WAIT_S``
    (a node that never writes one is gone). Task 0's own is read where it exists, never
    awaited: it was written before, or a full or read-only save dir refused it (its evidence is
    in memory then: ``Ended``)."""
    found: dict[int, NodeExit] = {}
    killed_at: list[float] = []

    def enough() -> bool | None:
        for task in range(nodes):
            path = files.node_exit(task)
            if task not in found and path.exists():
                found.update(failures.read_exits_of(files, [task]))
                if task in found and found[task].killed() is not None:
                    with contextlib.suppress(OSError):
                        killed_at.append(path.stat().st_mtime)
        others = all(t in found for t in range(1, nodes))
        done = others or (killed_at and clock() - min(killed_at) >= KILLED_GRACE_S)
        return bool(done) or None

    waited = not enough()
    if waited:
        with contextlib.suppress(TimeoutError):
            doorbell.await_word(enough, "every node's exit record", EVIDENCE_WAIT_S)
    return tuple(found[t] for t in sorted(found)), waited


def wait_for_reports(incident: Path, nodes: int, timeout: float) -> int:
    """Wait until ``nodes`` nodes have reported a hang (or ``timeout``); how many did. A listing
    of the incident dir a poll, for the few seconds of a hang; the last report rings
    (``watch.hang_monitor``)."""
    with contextlib.suppress(TimeoutError):
        doorbell.await_word(
            lambda: len(incident_reports(incident)) >= nodes or None,
            "every node's hang report",
            timeout,
        )
    return len(incident_reports(incident))


def read_hang_reports(incident: Path, nodes: int) -> tuple[tuple[RankReport, ...], tuple[str, ...]]:
    """Every node's hang report (waited for, each read once): its ranks, and the nodes that
    reported."""
    wait_for_reports(incident, nodes, REPORT_WAIT_S)
    reports = []
    for path in incident_reports(incident):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    ranks = tuple(RankReport(**r) for report in reports for r in report.get("ranks", []))
    return ranks, tuple(str(r["node"]) for r in reports)


def unrecorded_end(files: StartFiles, events: Sequence[ledger.Event]) -> list[str]:
    """The nodes of the job's Slurm start before ``files``' if its last round ended without a
    word from the toolkit (no save on notice, no stop task 0 recorded): Slurm ended and requeued
    it itself (NODE_FAIL, an administrator's requeue). Empty otherwise. The job is
    ``files.job``, its id, never a round's name; ``events``: the ledger's."""
    job, restart = files.job, files.restart
    if restart == 0:
        return []
    before = files.previous_start(events)
    if before is None or before.stop() is not None:
        return []
    mine = [e for e in events if (e.job, e.restart) == (job, restart - 1)]
    rounds = [i for i, e in enumerate(mine) if e.kind == Kind.RESTARTED]
    mine = mine[rounds[-1] + 1 :] if rounds else mine  # the last round's own
    if any(e.kind in (Kind.STOPPED, Kind.BLAMED) for e in mine):
        return []  # task 0 said how it ended (and blamed whom it could)
    started = [e.get("nodes") or [] for e in mine if e.kind == Kind.STARTED]
    return [str(n) for n in started[-1]] if started else []
