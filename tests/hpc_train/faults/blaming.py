"""One blame as the launcher makes it, for the tests of the drain and the quarantine: the
evidence it rests on read (the ledger, Slurm's word on the node: its machine), the policy's
verdict on it (``restart_policy.blame_of``: the evidence and the machine's earlier blames) and
the executor's record through the one ``Blamer`` (the quarantine list, the drain, the ledger)."""

from __future__ import annotations

from collections.abc import Callable

from hpc_train.contract import Cause, StartFiles
from hpc_train.faults import end_evidence
from hpc_train.faults.end_evidence import Ending, Question, SlurmWord, Where
from hpc_train.faults.node_blame import Blamer
from hpc_train.faults.suspects import DrainVerdict, Evidence
from hpc_train.launch import recovery, restart_policy


def blame(
    files: StartFiles, node: str, why: str, drain: bool, note: Callable[..., None],
    log: Callable[[str], None], evidence: Evidence, cause: Cause = Cause.CRASH,
) -> DrainVerdict:  # fmt: skip
    """Blame ``node`` for a stop of ``files``' start on ``evidence`` (``drain``: not
    --no-drain); the verdict."""
    ev = end_evidence.at_start(Ending.EXITED, Where(files, 0, (node,), 1))
    ev = ev.answered(end_evidence.ask(Question(nodes=(node,)), SlurmWord(), files.job))
    found, said = restart_policy.blame_of(ev, node, why, evidence, cause)
    for line in said:
        log(line)
    Blamer(files, drain, note, log).record(found, ev.events, recovery.drain)
    return found.verdict
