"""faults.suspects: the one suspect type and who a stop points to, after a hang (every node's
report) or a crash (the ranks' reports, each node's agent exit). Pure, milliseconds."""

from __future__ import annotations

from hpc_train.faults import suspects
from hpc_train.faults.failures import Failure, NodeExit
from hpc_train.faults.suspects import Evidence, RankReport, Suspect

GLOO_PEER = ("DistBackendError", "[gloo] Connection closed by peer [10.0.0.2]:5")
CUDA = ("RuntimeError", "CUDA error: an illegal memory access was encountered")
RANKS = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def failure(rank: int, kind: tuple[str, str], update: int = 40) -> Failure:
    return Failure(rank, update, *kind)


HOSTS = ("n1", "n2")


def exits(*records: tuple[str, int, int | None, int | None]) -> list[NodeExit]:
    return [NodeExit(i, node, rc, rank, code) for i, (node, rc, rank, code) in enumerate(records)]


def test_a_rank_with_its_own_machine_error_is_blamed_not_its_witnesses():
    found = suspects.crash_suspect(
        [failure(0, GLOO_PEER), failure(3, CUDA), failure(1, GLOO_PEER)],
        exits(("n1", 1, 0, 1), ("n2", 1, 3, 1)), HOSTS, RANKS,
    )  # fmt: skip
    assert (
        found is not None and found[0] == "n2" and "rank 3 failed: RuntimeError: CUDA" in found[1]
    )
    assert found.evidence is Evidence.OWN_ERROR  # an illegal address: no hardware finding
    ecc = failure(3, ("RuntimeError", "CUDA error: uncorrectable ECC error encountered"))
    found = suspects.crash_suspect([failure(0, GLOO_PEER), ecc], [], HOSTS, RANKS)
    assert found is not None and found.node == "n2" and found.evidence is Evidence.HARDWARE


def test_the_node_whose_agent_or_root_rank_was_killed_is_blamed():
    """What the local cluster showed (kill -9 of n2's torchrun at update 25): n2's orphaned
    rank reported a reset connection, n1's agent stopped its own rank with SIGTERM."""
    seen = exits(("n1", 1, 0, -15), ("n2", -9, None, None))
    found = suspects.crash_suspect([failure(1, GLOO_PEER)], seen, HOSTS, {0: "n1", 1: "n2"})
    assert found == Suspect("n2", "torchrun on n2 was killed (SIGKILL)", Evidence.SIGNAL)
    oom = exits(("n1", 1, 0, -15), ("n2", 1, 1, -9))  # the OOM killer took rank 1
    assert suspects.crash_suspect([], oom, HOSTS, {}) == Suspect(
        "n2",
        "rank 1 on n2 was killed (SIGKILL)",
        Evidence.SIGNAL,
    )


def test_the_one_node_that_wrote_no_exit_record_is_blamed():
    found = suspects.crash_suspect([failure(0, GLOO_PEER)], exits(("n1", 1, 0, 1)), HOSTS, {})
    assert found is not None and found[0] == "n2" and "no exit record" in found[1]
    assert found.evidence is Evidence.LOST


def test_no_node_is_blamed_without_evidence_against_one():
    quiet = exits(("n1", 1, 0, 1), ("n2", 1, 0, -15))
    assert suspects.crash_suspect([], quiet, HOSTS, RANKS) is None  # nobody said anything
    user_bug = failure(2, ("ValueError", "bad shape"))
    killed = exits(("n1", -9, None, None), ("n2", 1, None, None))
    assert suspects.crash_suspect([user_bug], killed, HOSTS, RANKS) is None  # the code's
    both = exits(("n1", -9, None, None), ("n2", -9, None, None))
    assert suspects.crash_suspect([], both, HOSTS, RANKS) is None  # two: no one stands out
    assert suspects.crash_suspect([], [], ("n1", "n2", "n3"), {}) is None  # three silent


def report(rank, node, update, at, stack=True) -> RankReport:
    return RankReport(rank, node, update, at, stack)


def test_the_suspect_is_the_rank_that_gave_no_stack():
    ranks = [report(0, "n1", 67, 10.0), report(1, "n2", 67, 11.0, stack=False)]
    found = suspects.hang_suspect(ranks, ["n1", "n2"], ["n1", "n2"])
    assert found is not None and (found.node, found.rank) == ("n2", 1)
    assert "gave no Python stack" in found.why


def test_else_the_oldest_heartbeat_and_first_a_node_that_never_reported():
    ranks = [report(0, "n1", 67, 10.0), report(1, "n2", 66, 11.0), report(2, "n3", 67, 5.0)]
    found = suspects.hang_suspect(ranks, ["n1", "n2", "n3"], ["n1", "n2", "n3"])
    assert found is not None and (found.node, found.rank) == ("n2", 1)
    silent = suspects.hang_suspect(ranks[:1], ["n1"], ["n1", "n2"])
    assert silent is not None and silent.node == "n2" and silent.rank is None
    assert suspects.hang_suspect([], [], []) is None
