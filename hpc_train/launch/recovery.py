"""What follows a start's end, carried out: the decision, and the one executor of its outcome.

"What happens when a rank crashes", in three files: the evidence, read once
(``hpc_train.faults.end_evidence``: every node's exit record, the ranks' failure reports, the
heartbeats, the hang reports, the round before's reports, the ledger, Slurm's word); the
policy, pure (``launch.restart_policy.after_end``: one ``launch.transition.Transition``); and
this module:

- ``what_follows``: the policy's answer for an end; where it waits on Slurm's word
  (``AskSlurm``), Slurm is asked (``end_evidence.ask``, after the back-off it says) and the
  policy asked again;
- ``carry_out``: the one executor, on every end path (after torchrun, a refused start, a run
  with no progress, max-update reached, the notice, a stuck launcher): the ledger
  (``stopped``, ``finished``, ``requeued``, ``restarted``...), each blame through the start's
  one ``Blamer``, a hang's ``suspect.json``, the round's verdict (the other launchers and the
  hot spares follow it; the spares are released once, here), then the in-job round, the
  requeue or the hold, or the task's end;
- every Slurm change after a start's end is made here, each named once below (``drain``,
  ``requeue_job``, ``exclude``, ``hold``, ``cancel``, ``notice``; the release of nodes left out,
  a thread of task 0, is started here: ``launch.release``), and every Slurm read of a decision
  in ``end_evidence.ask``: the one place each, to batch them at scale.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from hpc_core import slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import SUSPECT, atomic_write
from hpc_train.contract import HOLD_COMMENT, RoundAction, RoundVerdict
from hpc_train.faults import end_evidence
from hpc_train.faults.end_evidence import EndEvidence, Ending
from hpc_train.launch import release, requeue, restart_policy, rounds
from hpc_train.launch import transition as to
from hpc_train.launch.context import Here, log
from hpc_train.launch.restart_policy import EndOptions
from hpc_train.launch.rounds import Onward
from hpc_train.launch.signals import OwnNotice, save_wait_s, wait_for_save

HOLD_COMMENT_CHARS = 400  # the held job's Comment: the whole storage line and the release command


def what_follows(
    ev: EndEvidence, opt: EndOptions, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time, cpu: Callable[[], float] = end_evidence.cpu_s,
) -> to.Transition:  # fmt: skip
    """The policy's transition for the end ``ev``: while it waits on Slurm's word, ask Slurm
    (after the back-off it says) and decide again (``sleep``, ``clock`` and ``cpu``: a test's
    own). The transition says last how it was weighed (``Weighed``)."""
    began = cpu()
    while True:
        found = restart_policy.after_end(ev, opt)
        if not isinstance(found, to.AskSlurm):  # the executor says it after the policy's lines
            weighed = Weighed.of(ev, found, time.time(), ev.read_cpu_s + cpu() - began)
            return replace(found, said=(*found.said, weighed.line()))
        for line in found.said:
            log(line)
        sleep(found.after_s)
        ev = ev.answered(end_evidence.ask(found.question, ev.slurm, ev.where.files.job, clock))


@dataclass(frozen=True)
class Weighed:
    """What a start's end was weighed as (``transition``) and how long that took, from the
    first read of its evidence: reading it (``read_s``, after torchrun's exit: task 0's wait for
    the other nodes' exit records is in it; None on the other end paths) and waiting for
    Slurm's answers (``questions``, each asked whole at once: ``slurm_s``; the part it was
    slowest to answer, ``slowest``, a silence's time-outs in it too); and the CPU seconds of it
    all (``cpu_s``: the launcher's threads and the Slurm clients it ran, ``end_evidence.cpu_s``):
    the work, where the rest is waiting. One line in every launcher's log (``line``, read back by
    ``parsed``): where a decision's time goes at scale (issue 46)."""

    transition: str
    total_s: float
    read_s: float | None = None
    questions: int = 0
    slurm_s: float = 0.0
    slowest: str = ""  # the part of a question Slurm was slowest to answer (``step n2``)
    slowest_s: float = 0.0
    cpu_s: float | None = None

    PATTERN: ClassVar[re.Pattern[str]] = re.compile(r"weighed: (\w+) in ([\d.]+) s(?: \((.*)\))?$")
    PARTS: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"its evidence read in (?P<read>[\d.]+) s"),
        re.compile(r"Slurm asked (?P<questions>\d+) question\(s\), answered in (?P<slurm>[\d.]+) s"
                   r"(?:, the slowest part (?P<slowest>.+) in (?P<slowest_s>[\d.]+) s)?"),
        re.compile(r"(?P<cpu>[\d.]+) s of CPU"),
    )  # fmt: skip

    @classmethod
    def of(cls, ev: EndEvidence, t: to.Transition, now: float, cpu_s: float) -> Weighed:
        read = ev.read_s if ev.ending is Ending.EXITED else None
        word = ev.slurm
        return cls(type(t).__name__, round(now - ev.time + ev.read_s, 3),
                   None if read is None else round(read, 3), word.questions,
                   round(word.waited_s, 3), word.slowest[0], round(word.slowest[1], 3),
                   round(cpu_s, 3))  # fmt: skip

    def line(self) -> str:
        parts = [f"its evidence read in {self.read_s:.2f} s"] if self.read_s is not None else []
        if self.questions:
            slowest = f", the slowest part {self.slowest} in {self.slowest_s:.2f} s"
            parts.append(f"Slurm asked {self.questions} question(s), answered in "
                         f"{self.slurm_s:.2f} s{slowest if self.slowest else ''}")  # fmt: skip
        parts += [f"{self.cpu_s:.2f} s of CPU"] if self.cpu_s is not None else []
        took = f" ({'; '.join(parts)})" if parts else ""
        return f"weighed: {self.transition} in {self.total_s:.2f} s{took}"

    @classmethod
    def parsed(cls, line: str) -> Weighed | None:
        """The ``line`` a launcher logged, read back (None: not one)."""
        found = cls.PATTERN.search(line.rstrip())
        if found is None:
            return None
        got: dict[str, str | None] = {}
        inside = found.group(3)
        for part in inside.split("; ") if inside else []:
            matched = next((m for p in cls.PARTS if (m := p.fullmatch(part))), None)
            if matched is None:
                return None
            got.update(matched.groupdict())

        def number(key: str) -> float | None:
            value = got.get(key)
            return None if value is None else float(value)

        return cls(found.group(1), float(found.group(2)), number("read"),
                   int(got.get("questions") or 0), number("slurm") or 0.0,
                   got.get("slowest") or "", number("slowest_s") or 0.0, number("cpu"))  # fmt: skip


@dataclass(frozen=True)
class EndPath:
    """How an end path carries out: what it does when training is over (``finished``: wait for
    the launchers this one watches), task 0's own notice, and whether it runs on the pulse's
    thread (``pulse``: a requeue returns, Slurm ends the task; no raise)."""

    finished: Callable[[], None] = lambda: None
    own_notice: OwnNotice | None = None
    pulse: bool = False


def carry_out(here: Here, t: to.Transition, ev: EndEvidence, path: EndPath = EndPath()) -> Onward:
    """Apply ``t`` (the policy's, for ``ev``) on this node: say it, record the start's end and
    its blames, write the round's word, then finish, stop, hold, requeue, restart in the
    allocation, or follow task 0. Returns this node's way on; raises where the task fails."""
    for line in t.said:
        log(line)
    deputy = ev.ending is Ending.SILENT and here.start.task != 0
    note = here.deputy_note if deputy else here.note
    if isinstance(t, to.Finish):
        note(Kind.FINISHED, why=t.why, **t.progress)
        _blames(here, t, ev, deputy)
        _to_spares(here, RoundAction.DONE, t.why)
        path.finished()
        return Onward.ends(here.done())
    if isinstance(t, to.Stop):
        return _stop(here, t, ev, path, deputy)
    if isinstance(t, to.Hold):
        _record(here, t, ev, deputy, note)
        _held(here, t)
    if isinstance(t, to.Requeue):
        return _requeue(here, t, ev, path, deputy)
    if isinstance(t, to.InJobRound):
        _record(here, t, ev, deputy, note)
        return _in_job_round(here, t)
    if isinstance(t, to.Follow):
        return rounds.follow(here, t.why)
    if isinstance(t, to.Proceed):
        _blames(here, t, ev, deputy)
        return Onward(came_from=t.why)
    assert isinstance(t, to.Ignore | to.AskSlurm)  # decided: never an AskSlurm here
    return Onward.ends(here.done())


Stopping = to.Stop | to.Hold | to.Requeue | to.InJobRound  # the cases with a ``stopped`` line


def _record(
    here: Here, t: Stopping, ev: EndEvidence, deputy: bool, note: Callable[..., Any]
) -> None:
    """The start's end in the ledger (``stopped``), then its blames."""
    if t.stopped is not None:
        note(Kind.STOPPED, **t.stopped.data())
    _blames(here, t, ev, deputy)


def _blames(here: Here, t: to.Transition, ev: EndEvidence, deputy: bool) -> None:
    """A hang's suspect in its incident's ``suspect.json``, then each blame through the one
    ``Blamer`` (the quarantine counts this decision's earlier ones)."""
    if t.hang is not None:
        found = t.hang.suspect
        record = {"suspect": found._asdict() if found else None, "time": time.time()}
        atomic_write(t.hang.incident / SUSPECT, json.dumps(record))
    blamer, events = here.blamer(deputy), list(ev.events)
    files = here.files
    for blame in t.blames:
        blamer.record(blame, events, drain)
        events.append(blame.event(files.name, files.restart, time.time()))


def _to_spares(here: Here, action: RoundAction, why: str, everyone: bool = False) -> None:
    """Task 0, as the run ends in this allocation: the hot spares standing by end too
    (``everyone``: and the launchers following its word)."""
    if here.start.task == 0 and (here.start.standby or everyone):
        here.tell(RoundVerdict(action, why, [], list(here.start.standby)))


def _stop(here: Here, t: to.Stop, ev: EndEvidence, path: EndPath, deputy: bool) -> Onward:
    """The run ends here: a task that fails raises (task 0 first tells the other launchers and
    the spares); one that ends well returns its result (task 0 releases the spares)."""
    note = here.deputy_note if deputy else here.note
    _record(here, t, ev, deputy, note)
    if t.blocked:
        note(Kind.REQUEUE_BLOCKED, why=t.blocked, waiting=False)
    if not t.fails:  # on task 0, a cancel: its verdict is the others' answer (one look-up)
        _to_spares(here, RoundAction.DONE, t.why, everyone=True)
        return Onward.ends(here.done(**t.result))
    if here.start.task == 0 or deputy:
        here.tell(RoundVerdict(RoundAction.FAIL, t.why, [], list(here.start.standby)))
    if path.pulse:  # nothing can replace the node: end the job, not hold it
        cancel(here.job_id)
        return Onward.ends(here.done())
    raise RuntimeError(t.why)


def _held(here: Here, t: to.Hold) -> None:
    """Requeue the job held, the others told (they wait for Slurm to end them): it waits for
    ``scontrol release``. A verdict the full or read-only save dir refuses is said instead: the
    hold ends every task."""
    try:
        here.tell(RoundVerdict(RoundAction.REQUEUE, t.why, [], list(here.start.standby)))
    except OSError as err:
        log(f"the round's verdict not written ({err}): the hold ends the other tasks")
    here.note(Kind.REQUEUED, by=f"task {here.start.task}, held: scontrol release {here.job_id}")
    hold(here.job_id, f"{HOLD_COMMENT}{t.why}")
    requeue.await_end()
    raise RuntimeError(t.why)


def _requeue(here: Here, t: to.Requeue, ev: EndEvidence, path: EndPath, deputy: bool) -> Onward:
    """Requeue the job: submitit's (after ``checkpoint()``: recorded), task 0's own notice (the
    save on notice, then submitit's), or this task's ``scontrol requeue`` (task 1's for a stuck
    task 0 after the save on notice), the nodes excluded once it is pending."""
    note = here.deputy_note if deputy else here.note
    if t.by is to.RequeueBy.SUBMITIT:
        _record(here, t, ev, deputy, note)
        note(Kind.REQUEUED, by="submitit (notice)")
        return Onward.ends(here.done())
    if t.by is to.RequeueBy.OWN_NOTICE:
        _blames(here, t, ev, deputy)
        assert path.own_notice is not None
        path.own_notice.send(t.cause, here.job_id)  # the save on notice, then submitit's requeue
        return Onward.ends(here.done())
    if t.save_first and t.stopped is not None:  # rank 0's marker alone says it
        notice(here.job_id)
        saved = wait_for_save(here.files.stop_marker, save_wait_s(here.spec))
        t = replace(t, stopped=replace(t.stopped, saved=saved))
    _record(here, t, ev, deputy, note)
    if t.waiting:
        note(Kind.REQUEUE_BLOCKED, why=t.waiting, waiting=True)
    here.tell(RoundVerdict(RoundAction.REQUEUE, t.why))
    note(Kind.REQUEUED, by=f"task {here.start.task}")
    requeue_job(here.job_id)
    if t.exclude:
        exclude(here.job_id, t.exclude)
    if path.pulse:
        return Onward.ends(here.done())
    requeue.await_end()  # the requeue ends this task; never report success meanwhile
    raise RuntimeError(t.why)


def _in_job_round(here: Here, t: to.InJobRound) -> Onward:
    """Restart training in the allocation on ``t.members``: the round's verdict for every other
    launcher and spare, each node left out released once its task has ended (a thread),
    ``restarted`` in the ledger; this node's next start (or its end, if left out itself)."""
    start = here.start
    members, standby = list(t.members), list(t.standby)
    here.tell(RoundVerdict(RoundAction.RESTART_IN_JOB, t.why, members, standby))
    tasks = {start.hosts.index(n): n for n in t.left_out}
    release.start(release.LeftOut(here.files, tasks), log, here.note)
    spares = {"spare_in": list(t.spare_in), "spares": standby} if start.standby else {}
    here.note(Kind.RESTARTED, why=t.why, members=members, left_out=list(t.left_out),
              round=start.round + 1, **spares)  # fmt: skip
    log(f"in-job restart on {', '.join(members)} (without {', '.join(t.left_out) or 'none'}"
        + (f"; hot spare {', '.join(t.spare_in)} in" if t.spare_in else "") + ")")  # fmt: skip
    return rounds.next_round(here, members, t.why, standby)


# --- Slurm, changed after a start's end: each change named once, here ---------------------------


def drain(node: str, reason: str) -> bool:
    """Drain ``node`` with ``reason`` (a blame whose verdict drains); whether it was."""
    try:
        slurm.drain(node, reason)
    except slurm.SlurmError as err:
        log(f"could not drain {node}: {err}")
        return False
    return True


def requeue_job(job_id: str) -> None:
    slurm.requeue(job_id)


def exclude(job_id: str, nodes: tuple[str, ...]) -> None:
    """Keep ``nodes`` out of the requeued job (Slurm takes it once the job is pending)."""
    try:
        excluded = slurm.exclude(job_id, list(nodes))
        log(f"job {job_id} excludes {','.join(excluded)} from now on")
    except (slurm.SlurmError, TimeoutError) as err:
        log(f"could not exclude {', '.join(nodes)} from job {job_id}: {err}")


def hold(job_id: str, reason: str) -> None:
    slurm.hold(job_id, reason[:HOLD_COMMENT_CHARS])


def cancel(job_id: str) -> None:
    slurm.cancel(job_id)


def notice(job_id: str) -> None:
    """The notice (USR2) to every task of the job: the ranks save on it."""
    slurm.signal(job_id, "USR2")
