"""How Slurm reads an option list, proven on the local Slurm 22.05 by behaviour (never by
``scontrol show config``, which echoes the raw line), in a private mini cluster (node ``a1``,
job ids from 7200001, ports of each test's own: the file's tests run side by side on the test
workers, so each mini cluster has its block of ten from 27117) whose slurm.conf ``Include``s a file last, as
ParallelCluster includes a cluster's CustomSlurmSettings after its own lines
(``HPC_TRAIN_CLUSTER_INCLUDE``). The first ``AuthInfo`` and ``SchedulerParameters`` lines of the
cluster's config play ParallelCluster's; the included file plays the custom settings.

- The last line of a keyword is kept whole: two ``AuthInfo`` lines give the second line's hold,
  and a ``SchedulerParameters`` line without ``nohold_on_prolog_fail`` holds a job whose prolog
  failed, however the first line said it (slurmd's ``_launch_job_fail``).
- Inside one line the first occurrence of a key wins: ``cred_expire=70,cred_expire=10`` gives
  70 s (``xstrstr`` in 22.05's src/common/slurm_cred.c).

On 22.05 a requeued batch job is held for the credential lifetime: its begin time is the requeue
time plus ``cred_expire`` plus 1 s (job_mgr.c ``batch_requeue_fini``), and its submit time is set
to the requeue time, so ``scontrol show job``'s EligibleTime (the begin time, as 22.05 shows it)
minus its SubmitTime is the hold plus 1 s, read at once rather than waited out. The lines tried are ``cluster validate``'s own verdicts
(``slurm_conf``): what it says is no loss, and what its advice gives, followed literally.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest

from hpc_core.wait import Backoff, wait_until
from hpc_train.cluster import slurm_conf

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "slurm" / "local" / "cluster.sh"
CLUSTER = {"HPC_TRAIN_CLUSTER_NODES": "1", "HPC_TRAIN_CLUSTER_NODE_PREFIX": "a",
           "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "7200001"}  # fmt: skip
# each test's ports (slurmctld's first; a one-node cluster takes five): no two mini clusters meet
PORT = {"authinfo": 27117, "cred_expire": 27127, "custom line": 27137, "advised line": 27147}
PASSES = "bf_interval=2,sched_interval=2"  # the local cluster's scheduling passes

pytestmark = pytest.mark.slurm


@contextmanager
def mini_cluster(
    port: int, cred_expire: int, sched: str, lines: list[str]
) -> Iterator[dict[str, str]]:
    """A one-node cluster on ``port`` whose own lines hold ``cred_expire`` and ``sched``, with ``lines``
    included last (MUNGE: the cluster's munge socket, through the dir's ``munge`` link that
    ``up`` makes; PROLOG: a prolog that exits 1); the environment of its clients. Short and under
    /tmp: slurmd's sockets live in the cluster dir (108-byte limit)."""
    where = Path(tempfile.mkdtemp(prefix="ol-", dir="/tmp"))
    state, prolog = where / "c", where / "prolog.sh"
    prolog.write_text("#!/bin/sh\nexit 1\n")
    prolog.chmod(0o755)
    socket = str(state / "munge" / "munge.socket")
    text = "".join(f"{line}\n" for line in lines)
    (where / "custom.conf").write_text(text.replace("MUNGE", socket).replace("PROLOG", str(prolog)))
    env = {**os.environ, **CLUSTER, "HPC_TRAIN_CLUSTER_DIR": str(state),
           "HPC_TRAIN_CLUSTER_PORT": str(port),
           "HPC_TRAIN_CLUSTER_CRED_EXPIRE": str(cred_expire),
           "HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS": sched,
           "HPC_TRAIN_CLUSTER_INCLUDE": str(where / "custom.conf"),
           "SLURM_CONF": str(state / "etc" / "slurm.conf")}  # fmt: skip
    try:
        up = sh("up", env)
        assert up.returncode == 0, up.stderr
        yield env
    finally:
        down = sh("down", env)
        shutil.rmtree(where, ignore_errors=True)
    assert down.returncode == 0, down.stderr


def sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True,
                          env=env, timeout=180)  # fmt: skip


def run(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


def job(env: dict[str, str], job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s fields (the last of a repeated name)."""
    text = run(env, "scontrol", "show", "job", "-o", job_id)
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def submit(env: dict[str, str]) -> str:
    return run(env, "sbatch", "--parsable", "--requeue", "-N1", "-o", "/dev/null",
               "--wrap", "sleep 300").strip()  # fmt: skip


def wait_job(env: dict[str, str], job_id: str, what: str, **want: str) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        fields = job(env, job_id)
        return fields if all(fields.get(k) == v for k, v in want.items()) else None

    return wait_until(check, what, 60, Backoff(0.2, 1.5, 1.0))


def requeue_hold(env: dict[str, str]) -> int:
    """The hold a requeued job gets: EligibleTime - SubmitTime - 1 s after ``scontrol requeue``."""
    job_id = submit(env)
    wait_job(env, job_id, "the job running", JobState="RUNNING")
    run(env, "scontrol", "requeue", job_id)
    held = wait_job(env, job_id, "the requeued job pending", JobState="PENDING", Reason="BeginTime")
    begin, submitted = (datetime.fromisoformat(held[k]) for k in ("EligibleTime", "SubmitTime"))
    run(env, "scancel", job_id)
    return int((begin - submitted).total_seconds()) - 1


def no_loss(keyword: str, value: str) -> str:
    """``keyword: value`` as a custom setting that ``cluster validate`` says loses nothing: its
    slurm.conf line."""
    config = {"Scheduling": {"SlurmSettings": {"CustomSlurmSettings": [{keyword: value}]}}}
    assert list(slurm_conf.dropped(config)) == []
    return f"{keyword}={value}"


def advised(keyword: str, value: str) -> str:
    """The line ``cluster validate``'s advice gives for ``keyword: value``, followed literally."""
    config = {"Scheduling": {"SlurmSettings": {"CustomSlurmSettings": [{keyword: value}]}}}
    [dropped] = slurm_conf.dropped(config)
    assert isinstance(dropped, slurm_conf.Dropped)
    return f"{keyword}={dropped.message.rpartition(f'Repeat it: {keyword}: ')[2]}"


def test_the_last_authinfo_line_is_kept_whole() -> None:
    """ParallelCluster's line says 70 s; the included custom line, which ``validate`` says loses
    nothing, says 10 s: the hold is 10 s. The log says Slurm saw both lines."""
    line = no_loss("AuthInfo", "socket=MUNGE,cred_expire=10")
    with mini_cluster(PORT["authinfo"], 70, PASSES, [line]) as env:
        hold = requeue_hold(env)
        log = Path(env["HPC_TRAIN_CLUSTER_DIR"], "log", "slurmctld.log").read_text()
    assert hold in (9, 10), hold  # 9: where Slurm bumped the submit time by 1 s (job_mgr.c)
    assert "AuthInfo 1 specified more than once, latest value used" in log


def test_inside_one_line_the_first_cred_expire_wins() -> None:
    """The advice the old comparison gave for ``AuthInfo: cred_expire=10`` was
    ``cred_expire=70,cred_expire=10``: followed, it brings back 70 s."""
    line = "AuthInfo=socket=MUNGE,cred_expire=70,cred_expire=10"
    with mini_cluster(PORT["cred_expire"], 10, PASSES, [line]) as env:
        hold = requeue_hold(env)
    assert hold in (69, 70), hold


def prolog_fail(env: dict[str, str]) -> dict[str, str]:
    """A job whose prolog fails (``Prolog=`` exits 1, in the included lines): its fields once
    Slurm has requeued it."""
    job_id = submit(env)
    fields = wait_job(env, job_id, "the job requeued after its prolog failed",
                      JobState="PENDING", Restarts="1")  # fmt: skip
    run(env, "scancel", job_id)
    return fields


@pytest.mark.parametrize("follow_advice", [False, True], ids=["custom line", "advised line"])
def test_a_flag_left_out_of_the_last_schedulerparameters_line_is_lost(follow_advice: bool) -> None:
    """ParallelCluster's line has nohold_on_prolog_fail; a custom line without it (``validate``
    warns) holds the job a failing prolog requeues (priority 0, launch_failed_requeued_held);
    the advised line requeues it without a hold, and keeps the custom options."""
    custom = f"SchedulerParameters={PASSES}"
    line = advised("SchedulerParameters", PASSES) if follow_advice else custom
    assert line.endswith(PASSES)
    port = PORT["advised line" if follow_advice else "custom line"]
    with mini_cluster(port, 10, f"nohold_on_prolog_fail,{PASSES}", [line, "Prolog=PROLOG"]) as env:
        fields = prolog_fail(env)
    held = fields.get("Reason") == "launch_failed_requeued_held"
    assert held is not follow_advice, fields
    assert (fields.get("Priority") == "0") is held, fields
