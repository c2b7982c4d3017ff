import os
import sys
import time
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.wait import FAST, wait_until
from hpc_train.testing import job_alive


def test_parse_record_joins_values_with_spaces():
    rec = slurm.parse_record(
        "NodeName=n4 Arch=x86_64 State=IDLE+DRAIN Reason=bad link [root@2026-11-22T02:00:00] CPUTot=2"
    )
    assert rec["NodeName"] == "n4"
    assert rec["Reason"] == "bad link [root@2026-11-22T02:00:00]"
    assert rec["CPUTot"] == "2"


def test_unreachable_controller_gives_the_local_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(slurm.SlurmError, match="make cluster-up"):
        slurm.ensure_reachable()


@pytest.mark.slurm
def test_real_cluster_answers_and_expands_hostnames(slurm_cluster):
    assert os.environ["SLURM_CONF"] == str(slurm_cluster)
    slurm.ensure_reachable()
    assert slurm.hostnames("n[1-3]") == ["n1", "n2", "n3"]
    assert slurm.node_info("n1")["NodeName"] == "n1"
    assert slurm.job_state("999999999").state == "GONE"


def test_the_requeue_hold_is_authinfos_cred_expire_else_slurms_default():
    local = "AuthType = auth/munge\nAuthInfo = socket=/x/munge.socket,cred_expire=10\n"
    assert slurm.cred_expire_of(local) == 10
    assert slurm.cred_expire_of("AuthInfo = cred_expire=70\n") == 70  # ParallelCluster's
    assert slurm.cred_expire_of("AuthInfo = (null)\nAuthType = auth/munge\n") == 120
    assert slurm.cred_expire_of("") == slurm.DEFAULT_CRED_EXPIRE_S == 120


def test_the_requeue_hold_is_requeue_delay_where_the_slurm_honours_it():
    """Slurm 25.11 (ParallelCluster 3.16) holds a requeued job for SchedulerParameters'
    requeue_delay where set; 22.05 (this machine's) ignores the option, so the version is read."""
    pcluster = "SLURM_VERSION = 25.11.2\nAuthInfo = cred_expire=70\n"
    delayed = pcluster + "SchedulerParameters = nohold_on_prolog_fail,requeue_delay=10\n"
    assert slurm.requeue_hold_of(delayed) == 10
    assert slurm.requeue_hold_of(pcluster) == 70  # no requeue_delay: the credentials' lifetime
    older = delayed.replace("25.11.2", "24.11.6")
    assert slurm.requeue_hold_of(older) == 70  # set, but not honoured before 25.11
    assert slurm.requeue_hold_of(delayed.replace("SLURM_VERSION = 25.11.2\n", "")) == 70
    assert slurm.version_of("SLURM_VERSION = 22.05.8\n") == (22, 5)
    assert slurm.config_value(delayed, "SchedulerParameters") == (
        "nohold_on_prolog_fail,requeue_delay=10"
    )
    assert slurm.config_value(delayed, "SlurmctldPort") is None


@pytest.mark.slurm
def test_the_local_clusters_requeue_hold_is_read_from_its_controller(slurm_cluster):
    """cluster.sh's default (10 s; tests stay quick), as the running slurmctld reports it."""
    assert slurm.requeue_hold_s() == 10


@pytest.mark.slurm
def test_partition_nodes_reads_every_node_and_its_state_in_one_query(slurm_cluster):
    """What task 0 asks before a requeue (``restart_policy.requeue_blocked``), on real Slurm:
    a node drained by hand shows as drained (not usable), then idle again once resumed."""
    before = slurm.partition_nodes("low")
    assert sorted(before) == ["n1", "n2", "n3", "n4"]
    slurm.drain("n4", "hpc-train test: partition_nodes")
    try:
        drained = slurm.partition_nodes("low")["n4"]
        assert "drain" in drained and not slurm.node_usable(drained), drained
    finally:
        slurm.resume("n4")
    back = slurm.partition_nodes(None)["n4"]  # "idle", or "idle*" while slurmd re-registers
    assert slurm.node_usable(back) and "drain" not in back, back


RELEASE_JOB = """#!/bin/bash
#SBATCH --nodes=2-3
#SBATCH --no-kill
#SBATCH --requeue
#SBATCH --output={out}/job-%j.out
srun --no-kill bash -c 'if [ "$SLURM_NODEID" = 2 ]; then touch {out}/left-${{SLURM_RESTART_COUNT:-0}}; exit 0; fi
until [ -e {out}/end ]; do sleep 0.5; done'
"""


@pytest.mark.slurm
def test_release_gives_a_node_back_from_a_running_job_its_step_goes_on(slurm_cluster, tmp_path):
    """On real Slurm: a job of 2-3 nodes whose step (``srun --no-kill``) ended its third task;
    ``release`` takes that node out of the running job (idle again, the batch host never),
    the step goes on and the job ends COMPLETED (no task killed, srun exits 0). Requeued, the
    job asks for its nodes as submitted: it starts on 3 again."""
    deadline = time.monotonic() + 120
    while slurm.idle_nodes("low") < 3 and time.monotonic() < deadline:
        time.sleep(1)
    script = tmp_path / "job.sh"
    script.write_text(RELEASE_JOB.format(out=tmp_path))
    job = slurm.sbatch(["--partition", "low", str(script)])
    try:
        running = slurm.wait_for_job(job, lambda s: s.state == "RUNNING", timeout=60)
        nodes = slurm.hostnames(running.nodes)
        assert len(nodes) == 3, nodes
        wait_until(lambda: (tmp_path / "left-0").exists(), "task 2's file", 30, FAST)
        wait_until(lambda: not job_alive(job, SLURM_PROCID="2"), "task 2's end", 30, FAST)
        batch_host = (slurm.job_info(job) or {})["BatchHost"]
        assert slurm.release(job, batch_host) is False
        assert slurm.release(job, nodes[2]) is True
        after = slurm.job_info(job) or {}
        assert slurm.hostnames(after["NodeList"]) == nodes[:2], after
        assert "IDLE" in slurm.node_info(nodes[2])["State"]
        assert slurm.release(job, nodes[2]) is False  # not in the job any more
        slurm.requeue(job)
        again = slurm.wait_for_job(job, lambda s: s.state == "RUNNING" and s.restarts == 1,
                                   timeout=90)  # fmt: skip
        assert len(slurm.hostnames(again.nodes)) == 3, again
        (tmp_path / "end").touch()
        final = slurm.wait_for_job(job, timeout=60)
        assert final.state == "COMPLETED", (final, list(tmp_path.glob("job-*.out")))
        assert not list(Path.cwd().glob(f"slurm_job_{job}_resize.*"))
    finally:
        (tmp_path / "end").touch()
        slurm.cancel(job, check=False)


HOLD_JOB = """#!/bin/bash
#SBATCH --requeue
#SBATCH --output={out}/job-%j.out
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
  {python} -c 'import os; from hpc_core import slurm; slurm.hold(os.environ["SLURM_JOB_ID"], "{why}")'
  sleep 120
fi
touch {out}/released-${{SLURM_RESTART_COUNT:-0}}
"""


@pytest.mark.slurm
def test_hold_requeues_the_job_held_with_its_reason_until_scontrol_release(slurm_cluster, tmp_path):
    """On real Slurm, from inside the job as the launcher asks it: ``hold`` leaves the job
    pending, held (priority 0; 22.05 says job_requeued_in_held_state: it never starts by
    itself), its comment the reason;
    ``scontrol release`` starts it again (restart 1) and it runs to its end."""
    why = "hpc-train: storage: [Errno 28] No space left on device: held"
    script = tmp_path / "job.sh"
    script.write_text(HOLD_JOB.format(out=tmp_path, python=sys.executable, why=why))
    job = slurm.sbatch(["--partition", "low", str(script)])
    try:
        held = slurm.wait_for_job(job, lambda s: s.state == "PENDING" and s.restarts == 1,
                                  timeout=90)  # fmt: skip
        info = slurm.job_info(job) or {}
        assert held.reason == "job_requeued_in_held_state" and info.get("Priority") == "0", info
        assert info.get("Comment") == why and not (tmp_path / "released-1").exists()
        slurm.run(["scontrol", "release", job])
        done = slurm.wait_for_job(job, timeout=120)
        assert done.state == "COMPLETED" and (tmp_path / "released-1").exists(), done
    finally:
        slurm.cancel(job, check=False)


def test_exclude_retries_until_the_requeued_job_is_pending_and_keeps_earlier_exclusions(
    monkeypatch,
):
    """A fake scontrol (the moments right after a requeue cannot be timed on a real cluster):
    refused while the job runs, killed once by the requeue's SIGTERM, then accepted."""
    answers = [
        slurm.SlurmError("`scontrol update` failed: Job is no longer pending execution for job 7"),
        slurm.SlurmError("`scontrol update` failed: exit -15"),
        "",
    ]
    calls: list[list[str]] = []

    def fake_run(args, timeout=30.0, check=True):
        calls.append(list(args))
        if args[:2] == ["scontrol", "update"]:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
        return ""

    monkeypatch.setattr(slurm, "run", fake_run)
    monkeypatch.setattr(slurm, "job_info", lambda job: {"ExcNodeList": "n4"})
    monkeypatch.setattr(slurm, "hostnames", lambda nodes: nodes.split(","))
    assert slurm.exclude("7", ["n2"], timeout=5) == ["n2", "n4"]
    assert calls[-1] == ["scontrol", "update", "JobId=7", "ExcNodeList=n2,n4"] and not answers
    answers[:] = [slurm.SlurmError("`scontrol update` failed: Invalid node name specified")]
    with pytest.raises(slurm.SlurmError, match="Invalid node name"):
        slurm.exclude("7", ["nX"], timeout=5)


def test_exclude_survives_the_requeues_sigterm_killing_its_first_look_at_the_job(monkeypatch):
    """A fake scontrol: `show job` killed by the SIGTERM once (seen in a real hang test)."""
    looks = [slurm.SlurmError("`scontrol show job -o 76` failed: exit -15")]

    def job_info(job):
        if looks:
            raise looks.pop()
        return {"ExcNodeList": "(null)"}

    monkeypatch.setattr(slurm, "job_info", job_info)
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30.0, check=True: "")
    assert slurm.exclude("76", ["n2"], timeout=5) == ["n2"] and not looks


def test_a_client_a_signal_ended_is_said_so_even_after_it_printed(tmp_path, monkeypatch):
    """A fake `scontrol` (a script first on PATH) prints the whole job record, then the
    requeue's SIGTERM ends it (seen in CI: `show job` printed, was killed, and its record was
    taken for Slurm's refusal, so exclude gave up and the requeued job kept the hung node
    eligible). run() says `exit -15`, which exclude retries."""
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho 'JobId=32 JobName=hang ExcNodeList=(null)'\nkill -TERM $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmError) as err:
        slurm.run(["scontrol", "show", "job", "-o", "32"])
    assert str(err.value).endswith("failed: exit -15") and slurm.KILLED_RE.search(str(err.value))


def test_job_states_asks_once_for_every_job_and_a_forgotten_one_is_gone(monkeypatch):
    """A fake scontrol: every job the controller remembers, in one answer."""
    calls: list[list[str]] = []

    def fake_run(args, timeout=30.0, check=True):
        calls.append(list(args))
        return (
            "JobId=7 JobName=a JobState=RUNNING Reason=None Restarts=2 NodeList=n[1-2]\n"
            "JobId=8 JobName=b JobState=COMPLETING Reason=NonZeroExitCode Restarts=0 NodeList=n3\n"
        )

    monkeypatch.setattr(slurm, "run", fake_run)
    states = slurm.job_states(["7", 9, "8", "7"])
    assert calls == [["scontrol", "show", "job", "-o"]]
    assert list(states) == ["7", "9", "8"]
    assert states["7"] == slurm.JobState("7", "RUNNING", 2, "n[1-2]", "None")
    assert states["8"].state == "COMPLETING" and states["9"].state == "GONE"
    calls.clear()
    assert slurm.job_states([]) == {} and calls == []


def test_unreachable_says_why_without_waiting_for_a_controller(tmp_path, monkeypatch):
    """A missing config is said before any client runs (it would retry reading it for a
    minute); otherwise one `scontrol ping`, whose refusal comes at once (a fake here)."""
    pings: list[float] = []
    answer: list[str | Exception] = []

    def fake_run(args, timeout=30.0, check=True):
        assert list(args) == ["scontrol", "ping"]
        pings.append(timeout)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    monkeypatch.setattr(slurm, "run", fake_run)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert slurm.unreachable() == f"SLURM_CONF={tmp_path / 'missing.conf'} does not exist"
    assert pings == []
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    answer[:] = [slurm.SlurmUnreachable("`scontrol ping`: Unable to contact slurm controller")]
    assert slurm.unreachable(timeout=3) == "`scontrol ping`: Unable to contact slurm controller"
    answer[:] = ["Slurmctld(primary) at vm is DOWN\n"]
    assert "no Slurm controller answers" in (slurm.unreachable() or "")
    answer[:] = ["Slurmctld(primary) at vm is UP\n"]
    assert slurm.unreachable() is None and pings == [3, 15.0, 15.0]
    slurm.ensure_reachable()


def test_a_scancel_the_signal_it_sent_ended_has_delivered_it(tmp_path, monkeypatch):
    """A fake `scancel` (first on PATH) that, as one inside the job it signals, receives the
    USR2 it asked for and dies of it: the notice was sent (task 1's requeue of a stuck task 0
    failed on "exit -12" in CI, its ranks already saved). Another signal, or a refusal, is
    still an error."""
    fake = tmp_path / "scancel"
    fake.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\nkill -"${FAKE_SIG:-USR2}" $$\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    slurm.signal("26", "USR2")
    assert (tmp_path / "scancel.calls").read_text() == "--signal=USR2 26\n"
    monkeypatch.setenv("FAKE_SIG", "TERM")
    with pytest.raises(slurm.SlurmError, match="exit -15"):
        slurm.signal("26", "USR2")
    fake.write_text("#!/bin/sh\necho 'scancel: error: Invalid job id 26' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.signal("26", "USR2")
