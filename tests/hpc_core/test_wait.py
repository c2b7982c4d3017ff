"""hpc_core.wait and the Slurm watcher on top of it, with a fake clock and a fake controller
(``slurm.run`` replaced: no Slurm needed). The real cluster is in test_slurm.py's slurm tests."""

from __future__ import annotations

import pytest

from hpc_core import slurm
from hpc_core.wait import Backoff, wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_backoff_grows_to_its_ceiling():
    delays = Backoff(1.0, 2.0, 5.0).delays()
    assert [next(delays) for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_wait_until_returns_the_first_real_answer_and_backs_off():
    clock = Clock()
    answers = iter([None, False, None, "ready"])
    got = wait_until(
        lambda: next(answers), "x", 60, Backoff(1, 2, 3), clock.sleep, lambda: clock.now
    )
    assert got == "ready" and clock.slept == [1, 2, 3]


def test_wait_until_times_out_naming_what_it_waited_for():
    clock = Clock()
    with pytest.raises(TimeoutError, match="waiting for the decision"):
        wait_until(
            lambda: None, "the decision", 10, Backoff(4, 1, 4), clock.sleep, lambda: clock.now
        )
    assert sum(clock.slept) == 10  # the last sleep is cut to the deadline


def fake_controller(monkeypatch: pytest.MonkeyPatch, answers: list[object]) -> list[list[str]]:
    """Replace slurm.run: each call pops an answer (an exception to raise, or stdout)."""
    calls: list[list[str]] = []

    def run(args, timeout=30.0, check=True):
        calls.append(list(args))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(slurm, "run", run)
    return calls


def test_a_forgotten_job_is_gone_but_a_silent_controller_is_an_error(monkeypatch):
    fake_controller(
        monkeypatch,
        [
            slurm.SlurmError(
                "`scontrol show job` failed: slurm_load_jobs error: Invalid job id specified"
            ),
            slurm.SlurmUnreachable(
                "`scontrol`: Unable to contact slurm controller (connect failure)"
            ),
        ],
    )
    assert slurm.job_state("5").state == "GONE"
    with pytest.raises(slurm.SlurmUnreachable):
        slurm.job_state("5")


def test_wait_for_job_rides_out_a_controller_hiccup(monkeypatch):
    """Before: any scontrol failure read as GONE and ended `--follow`. Now it is retried."""
    running = "JobId=5 JobName=x JobState=RUNNING Restarts=0 NodeList=n[1-2] Reason=None\n"
    done = running.replace("RUNNING", "COMPLETED")
    hiccup = slurm.SlurmUnreachable("Unable to contact slurm controller")
    calls = fake_controller(monkeypatch, [running, hiccup, hiccup, done])
    seen: list[str] = []
    state = slurm.wait_for_job(
        "5", backoff=Backoff(0.001, 1, 0.001), on_poll=lambda s: seen.append(s.state)
    )
    assert state.state == "COMPLETED" and seen == ["RUNNING", "COMPLETED"]
    assert len(calls) == 4


def test_wait_for_job_gives_up_on_a_controller_gone_for_good(monkeypatch):
    fake_controller(monkeypatch, [slurm.SlurmUnreachable("Socket timed out")] * 50)
    with pytest.raises(slurm.SlurmUnreachable):
        slurm.wait_for_job("5", backoff=Backoff(0.001, 1, 0.001), unreachable_for=0.01)


def test_unreachable_is_told_from_a_refusal_by_slurms_own_words(monkeypatch, tmp_path):
    """A fake `scontrol` on PATH prints what Slurm's client prints when slurmctld is down."""
    fake = tmp_path / "scontrol"
    fake.write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(slurm.SlurmUnreachable):
        slurm.run(["scontrol", "show", "job", "5"])


def test_rendezvous_ports_differ_between_jobs_and_stay_for_a_job():
    assert slurm.rendezvous_port(101) != slurm.rendezvous_port(102)
    assert slurm.rendezvous_port("101") == slurm.rendezvous_port(101)
    assert 1024 < slurm.rendezvous_port(99999999) < 65536


def test_no_rendezvous_port_is_ephemeral_whatever_the_job_id_or_round():
    """Linux hands out 32768-60999 to outgoing connections (ip_local_port_range's default): a
    store listening there may find its port taken. Real job ids run to the millions."""
    ports = {slurm.rendezvous_port(job, r) for job in range(0, 3_000_000, 997) for r in range(20)}
    assert max(ports) < 32768 and min(ports) >= slurm.RDZV_PORT_BASE


def test_each_round_of_a_job_meets_in_a_store_of_its_own():
    """A job's in-job restart rounds take its ports in turn; a requeue (round 0 again) keeps
    the first; the rule the dry run prints is the one computed."""
    rounds = [slurm.rendezvous_port(41, r) for r in range(slurm.RDZV_ROUND_PORTS)]
    assert len(set(rounds)) == slurm.RDZV_ROUND_PORTS and rounds[0] == slurm.rendezvous_port(41)
    assert slurm.rendezvous_port(41, slurm.RDZV_ROUND_PORTS) == rounds[0]
    assert rounds == [slurm.RDZV_PORT_BASE + 41 * 8 + r for r in range(8)]
    assert "job id x 8 + round mod 8" in slurm.RDZV_PORT_RULE


def test_the_test_workers_clusters_never_share_a_rendezvous_port():
    """Three local clusters on one host (tests/conftest.py: worker_cluster_env, job ids from
    1,001,000 N + 1): 400 jobs each, 8 rounds each, no two share a port. With the port of the
    round key's digits (``24.1`` -> 241), gw0's job 24 and gw2's job 2002024 met in round 1
    on one port (CI, 2026-11-27)."""
    first_ids = [1 + 1_001_000 * n for n in range(3)]
    ports = [slurm.rendezvous_port(first + k, r)
             for first in first_ids for k in range(400) for r in range(8)]  # fmt: skip
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize(
    ("body", "raises"),
    [
        ("kill -TERM $$", False),  # ended by the requeue's own SIGTERM: it took effect
        ("kill -KILL $$", True),  # no requeue ends its caller so: not taken for one
        ("echo 'scontrol: error: Invalid job id specified' >&2; exit 1", True),
    ],
)
def test_a_requeue_client_ended_by_the_requeues_sigterm_is_answered(
    monkeypatch, tmp_path, body, raises
):
    """A fake `scontrol` on PATH: asked from inside the job, the requeue's SIGTERM may end the
    client before it exits (run 11 of 2026-11-27); anything else is still an error."""
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    if raises:
        with pytest.raises(slurm.SlurmError):
            slurm.requeue("5")
    else:
        slurm.requeue("5")
