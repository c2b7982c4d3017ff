"""The only way to Slurm: submit, signal, cancel, requeue, drain/resume, job state, waiting.

Every call honours ``SLURM_CONF`` (the local cluster's config lives in
``.local/cluster/etc/slurm.conf``; on ParallelCluster it is ``/opt/slurm/etc/slurm.conf`` and the
commands are in ``/opt/slurm/bin``). Two kinds of failure are kept apart: ``SlurmUnreachable``
(the controller did not answer: transient, retried by the waiting helpers) and ``SlurmError``
(Slurm answered no). A job Slurm has forgotten is the state ``GONE``, never an error.

Slurm's silence is no answer: a caller that waits on Slurm asks again with back-off while the
controller does not answer (``patient``, ``SILENCE_BACKOFF``: 2, 4, 8 s as submitit's watcher),
for at most ``SILENCE_PATIENCE_S``; ``step_starts`` says "unknown" (None) then, never "no"; and
a setting read from the controller (``slurmd_timeout_s``) is read once while it answers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal as _signals  # `signal` is this module's scancel --signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hpc_core.slurm_conf import DEFAULT_CONFS
from hpc_core.slurm_env import SlurmEnv
from hpc_core.wait import Backoff, wait_until

LOCAL_HINT = "start the local cluster with `make cluster-up` and export the SLURM_CONF it prints"
PCLUSTER_BIN = "/opt/slurm/bin"
# What Slurm's clients print when the controller is down or busy (retry), not a refusal.
UNREACHABLE_MARKS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted or received",
    "Slurm backup controller in standby mode",
    # `scontrol requeue` with slurmctld stopped (22.05): the request never reached it
    "Unexpected message received",
)
# A silent controller is asked again this often (submitit's job watcher backs off 2, 4, 8 s) ...
SILENCE_BACKOFF = Backoff(2.0, 2.0, 8.0)
# ... for this long in all: a head node's reboot, `pcluster update-cluster` restarting slurmctld
SILENCE_PATIENCE_S = 300.0
Answer = TypeVar("Answer")
FORGOTTEN_MARK = "Invalid job id specified"
# torchrun's c10d store ports (rendezvous_port): 20000-31999, under Linux's ephemeral ports
# (net.ipv4.ip_local_port_range, 32768-60999 by default), where any outgoing connection of the
# node may already hold a port and the store's listen would fail (EADDRINUSE)
RDZV_PORT_BASE = 20000
RDZV_PORT_SPAN = 12000
RDZV_ROUND_PORTS = 8  # a job's in-job restart rounds take its 8 ports in turn
RDZV_PORT_RULE = (
    f"{RDZV_PORT_BASE} + (job id x {RDZV_ROUND_PORTS} + round mod {RDZV_ROUND_PORTS}) "
    f"mod {RDZV_PORT_SPAN}"
)


class SlurmError(RuntimeError):
    """A Slurm command failed or Slurm cannot be reached; the message is one line."""


class SlurmUnreachable(SlurmError):
    """The controller did not answer (timed out or refused): worth retrying."""


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidate = os.path.join(PCLUSTER_BIN, name)
    if os.access(candidate, os.X_OK):
        return candidate
    raise SlurmError(
        f"`{name}` not found: Slurm's client commands are not installed ({LOCAL_HINT})"
    )


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(
    args: Sequence[str],
    timeout: float = 30.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a Slurm client command; return stdout.

    Raises SlurmUnreachable when the controller does not answer, SlurmError with Slurm's own
    last line when it refuses (``check=False``: return stdout whatever the exit status).
    ``env``: the client's environment (default: this process's).
    """
    cmd = [_binary(args[0]), *args[1:]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env=None if env is None else dict(env))  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise SlurmUnreachable(f"`{' '.join(args)}` timed out after {timeout:.0f} s") from err
    if proc.returncode < 0:
        # a signal ended the client, whatever it had printed before (the requeue's SIGTERM
        # reaches every process of the step, a launcher's scontrol too)
        said = f"exit {proc.returncode}"
    elif proc.returncode != 0:
        said = last_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"
    if proc.returncode != 0:
        if any(mark in said for mark in UNREACHABLE_MARKS):
            raise SlurmUnreachable(f"`{' '.join(args)}`: {said}")
        if check:
            raise SlurmError(f"`{' '.join(args)}` failed: {said}")
    return proc.stdout


def patient(
    ask: Callable[[], Answer],
    what: str,
    patience: float = SILENCE_PATIENCE_S,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Answer:
    """``ask()``'s answer, asked again with ``backoff`` (``SILENCE_BACKOFF``) while the
    controller does not answer (``SlurmUnreachable``), for at most ``patience`` seconds; then
    the last SlurmUnreachable, naming ``what`` and how long it waited. A refusal
    (``SlurmError``) is raised at once."""
    began = clock()
    for delay in (backoff or SILENCE_BACKOFF).delays():
        try:
            return ask()
        except SlurmUnreachable as err:
            waited = clock() - began
            if waited + delay > patience:
                raise SlurmUnreachable(f"{what}: no answer for {waited:.0f} s ({err})") from err
        sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover - delays() never ends


def unreachable(timeout: float = 15.0) -> str | None:
    """Why no controller can be asked now (one line), or None when slurmctld answers a ping.

    Never waits for a controller: a config that is not there is said at once (the clients
    would retry reading it for a minute), and ``scontrol ping`` makes one attempt (a refused
    connection answers at once; ``timeout`` bounds a controller host that does not answer).
    """
    conf = SlurmEnv().conf
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf} does not exist"
    if not conf and not any(os.path.isfile(p) for p in DEFAULT_CONFS):
        return "SLURM_CONF is not set"
    try:
        out = run(["scontrol", "ping"], timeout=timeout, check=False)
    except SlurmError as err:
        return str(err)
    if "UP" not in out:
        return f"no Slurm controller answers `scontrol ping` (SLURM_CONF={conf})"
    return None


def ensure_reachable() -> None:
    """Raise SlurmError with a one-line hint unless slurmctld answers."""
    why = unreachable()
    if why is not None:
        raise SlurmError(f"no Slurm reachable: {why}; {LOCAL_HINT}")


def rendezvous_port(job_id: str | int, round_: int = 0) -> int:
    """The c10d store's port of round ``round_`` of a job's start (``RDZV_PORT_RULE``): a
    requeued job keeps its port; each in-job restart round gets the next of the job's
    ``RDZV_ROUND_PORTS``, so no round meets the last one's store; co-located jobs (emulated nodes
    share one host and one port space) get ports ``RDZV_ROUND_PORTS`` apart, the same again only
    ``RDZV_PORT_SPAN / RDZV_ROUND_PORTS`` (1,500) job ids later; never an ephemeral port."""
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    slot = int(digits) * RDZV_ROUND_PORTS + round_ % RDZV_ROUND_PORTS
    return RDZV_PORT_BASE + slot % RDZV_PORT_SPAN


# --- actions ----------------------------------------------------------------------------------


def sbatch(args: Sequence[str]) -> str:
    """``sbatch --parsable ARGS`` (a script path or ``--wrap``); return the job id."""
    out = run(["sbatch", "--parsable", *args])
    return out.strip().split(";")[0]  # "<id>[;<cluster>]"


def signal(job_id: str | int, name: str = "USR2") -> None:
    """Send ``SIG<name>`` to every process of the job's steps (what a preemption notice does).

    A launcher's ``scancel`` runs inside the job it signals, so it is one of those processes: a
    client ended by the very signal it asked for has had its request carried out (slurmd
    signals the step's processes only once the controller took it). Said "exit -12" before,
    it failed task 1's requeue of a stuck task 0 whose ranks had already saved on the notice
    (seen in CI). Any other failure raises."""
    try:
        run(["scancel", f"--signal={name}", str(job_id)])
    except SlurmError as err:
        if not str(err).endswith(f"failed: exit -{int(_signals.Signals[f'SIG{name}'])}"):
            raise


def cancel(job_id: str | int, check: bool = True) -> None:
    run(["scancel", str(job_id)], check=check)


ALREADY_REQUEUED_MARK = "Job is pending execution"  # a requeue asked of a requeued job


def requeue(job_id: str | int, patience: float = SILENCE_PATIENCE_S) -> None:
    """``scontrol requeue``. Asked from inside the job (task 0's launcher), the requeue's own
    SIGTERM reaches every process of the job's steps, the client too, and may end it before it
    exits: a client ended by SIGTERM was answered by the requeue itself (run 11 of 2026-11-27:
    the launcher took it for a failure and never excluded the node it had blamed). A silent
    controller is asked again (``patient``); an ask after one that timed out may find the job
    requeued already (``ALREADY_REQUEUED_MARK``): that was the answer."""
    asked = [0]

    def once() -> None:
        asked[0] += 1
        try:
            run(["scontrol", "requeue", str(job_id)])
        except SlurmUnreachable:
            raise
        except SlurmError as err:
            again = asked[0] > 1 and ALREADY_REQUEUED_MARK in str(err)
            if not (str(err).endswith(TERMINATED) or again):
                raise

    patient(once, f"scontrol requeue {job_id}", patience)


def hold(job_id: str | int, reason: str) -> None:
    """Requeue the running job held, saying why: its comment first (``scontrol update JobId=
    Comment=``, which a job's own user may set; ``scontrol show job`` shows it), then ``scontrol
    requeuehold``: pending with priority 0 (Reason job_requeued_in_held_state, 22.05) until
    ``scontrol release JOB``.
    Asked from inside the job, the requeue's SIGTERM may end the client first (as ``requeue``)."""
    run(["scontrol", "update", f"JobId={job_id}", f"Comment={reason}"])
    try:
        run(["scontrol", "requeuehold", str(job_id)])
    except SlurmError as err:
        if not str(err).endswith(TERMINATED):
            raise


def drain(node: str, reason: str) -> None:
    run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])


def resume(node: str) -> None:
    run(["scontrol", "update", f"nodename={node}", "state=resume"])


def release(job_id: str | int, node: str) -> bool:
    """Give ``node`` back from the running job ``job_id``: the job shrinks to its other nodes
    (``scontrol update JobId= NodeList=``, which a job's own user may do). Slurm kills the job's
    processes still on the node (a step started ``--no-kill`` goes on without it; one that was
    not is ended whole), so release a node only once its tasks have ended. The node then holds
    no job: drained, it is DRAINED, which ParallelCluster's clustermgtd replaces. A requeue of
    the job asks for its nodes as submitted again (checked on 22.05: 2-3, shrunk to 2, requeued,
    started on 3). Never the batch host: that would end the job. Returns whether it was
    released (False: the job is not running, or the node is not in it or is its batch host).

    scontrol writes ``slurm_job_<id>_resize.sh`` and ``.csh`` into its working directory when
    it runs inside a job (``SLURM_JOBID`` set, ``update_job.c``): run without the job's
    variables, it writes none."""
    info = job_info(job_id)
    if info is None or info.get("JobState") != "RUNNING":
        return False
    nodes = hostnames(info.get("NodeList", ""))
    if node not in nodes or node == info.get("BatchHost") or len(nodes) < 2:
        return False
    keep = ",".join(n for n in nodes if n != node)
    run(["scontrol", "update", f"JobId={job_id}", f"NodeList={keep}"], env=SlurmEnv().outside_job())
    return True


NOT_PENDING_MARK = "no longer pending"
KILLED_RE = re.compile(r"exit -\d+$")  # what run() says of a client that a signal ended
TERMINATED = f"exit -{int(_signals.SIGTERM)}"  # ... and of one that SIGTERM ended


def exclude(job_id: str | int, nodes: Sequence[str], timeout: float = 8.0) -> list[str]:
    """Keep ``nodes`` out of the job's next starts (``ExcNodeList``, added to the one it has).

    Slurm takes it only once the job is pending again: call it right after ``requeue``, while
    the job's old steps are still ending (state COMPLETING), before KillWait's SIGKILL ends the
    caller. Retries for ``timeout`` seconds the "no longer pending" refusal and a client killed
    by a signal (the requeue's SIGTERM reaches every process of the caller's step, scontrol
    too); returns the list.
    """

    def update() -> list[str] | None:
        try:
            info = job_info(job_id) or {}
            current = info.get("ExcNodeList", "(null)")
            excluded = [] if current in ("", "(null)") else hostnames(current)
            wanted = sorted(set(excluded) | set(nodes))
            run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(wanted)}"])
        except SlurmUnreachable:
            return None
        except SlurmError as err:
            if NOT_PENDING_MARK in str(err) or KILLED_RE.search(str(err)):
                return None
            raise
        return wanted

    return wait_until(update, f"job {job_id} pending to exclude {list(nodes)}", timeout,
                      Backoff(0.1, 1.5, 1.0))  # fmt: skip


# --- state ------------------------------------------------------------------------------------


def parse_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show -o`` record (``Key=Value Key=Value …``) into a dict.

    Values may contain spaces only for a few keys (e.g. ``Reason``); a token without ``=`` is
    joined to the previous value.
    """
    record: dict[str, str] = {}
    last = None
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key and (key[0].isupper() or key in {"cpu", "mem", "node", "billing"}):
            record[key] = value
            last = key
        elif last is not None:
            record[last] += " " + token
    return record


def job_info(job_id: str | int) -> dict[str, str] | None:
    """``scontrol show job -o JOBID`` as a dict; None once Slurm has forgotten the job.

    Raises SlurmUnreachable when the controller does not answer (the job may well be alive).
    """
    try:
        out = run(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmUnreachable:
        raise
    except SlurmError as err:
        if FORGOTTEN_MARK in str(err):
            return None
        raise
    line = out.strip().splitlines()[0] if out.strip() else ""
    return parse_record(line) if line.startswith("JobId=") else None


def node_info(node: str) -> dict[str, str]:
    out = run(["scontrol", "show", "node", "-o", node])
    return parse_record(out.strip())


def machine(info: Mapping[str, str]) -> str:
    """The machine behind a node's name, from its ``scontrol show node`` record: its NodeAddr,
    with the InstanceId where Slurm reports one (23.02+, set by whoever launches instances).
    ParallelCluster's clustermgtd sets NodeAddr to an instance's private IP when it launches one
    and back to the node's name when it powers one down (aws-parallelcluster-node,
    ``slurm_commands.update_nodes``/``reset_nodes``): a node replaced is a new address under the
    same name. (A private IP freed by a terminated instance may be given to a later one: that
    machine is then taken for the old one, the strict side.)"""
    addr = info.get("NodeAddr", "")
    instance = info.get("InstanceId", "")
    return f"{addr} {instance}" if instance not in ("", "(null)", "N/A") else addr


def node_machine(node: str) -> str:
    """``machine`` of ``node`` now (one ``scontrol show node``)."""
    return machine(node_info(node))


def partition_info(partition: str | None) -> dict[str, str]:
    """``scontrol show partition -o`` of ``partition``, or of the cluster's default one."""
    out = run(["scontrol", "show", "partition", "-o", *([partition] if partition else [])])
    records = [parse_record(line) for line in out.splitlines() if line.strip()]
    if partition is None:
        records = [r for r in records if r.get("Default") == "YES"]
    if not records:
        raise SlurmError(f"no partition {partition or '(default)'} in this cluster")
    return records[0]


def grace_time_s(partition: str | None) -> float | None:
    """Seconds a job of ``partition`` gets between the preemption signal and its kill (Slurm's
    GraceTime); None when the partition is never preempted (PreemptMode=OFF)."""
    info = partition_info(partition)
    if info.get("PreemptMode", "OFF").upper().startswith("OFF"):
        return None
    return float(info.get("GraceTime", "0") or 0)


# AuthInfo's cred_expire, which a requeued job waits out: Slurm's default (slurm.conf(5)), and
# ParallelCluster's (aws-parallelcluster-cookbook, slurm.conf.erb: AuthInfo=cred_expire=70)
DEFAULT_CRED_EXPIRE_S = 120.0
PCLUSTER_CRED_EXPIRE_S = 70.0
# Slurm 25.11 added SchedulerParameters=requeue_delay= (CHANGELOG/slurm-25.11.md): the hold of a
# requeued job apart from the credentials' lifetime (job_mgr.c: begin_time = now + delay + 1)
REQUEUE_DELAY_SINCE = (25, 11)


def config_value(config: str, key: str) -> str | None:
    """``key``'s value in ``scontrol show config``'s text (``(null)`` where Slurm shows it so);
    None where the key is not shown."""
    for line in config.splitlines():
        found, _, value = line.partition("=")
        if found.strip() == key:
            return value.strip()
    return None


def config_option(config: str, key: str, name: str) -> str | None:
    """``name``'s value in the comma-separated setting ``key`` of ``scontrol show config``'s text
    (``AuthInfo = socket=/x,cred_expire=10``: ``cred_expire`` is ``10``); None where unset."""
    for item in (config_value(config, key) or "").split(","):
        option, _, setting = item.partition("=")
        if option.strip() == name:
            return setting.strip()
    return None


def version_of(config: str) -> tuple[int, int]:
    """(major, minor) of ``scontrol show config``'s ``SLURM_VERSION`` ((0, 0) where unreadable)."""
    found = re.search(r"^SLURM_VERSION\s*=\s*(\d+)\.(\d+)", config, re.MULTILINE)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def cred_expire_of(config: str) -> float:
    """AuthInfo's ``cred_expire`` in ``scontrol show config``'s text; Slurm's default without it."""
    seconds = config_option(config, "AuthInfo", "cred_expire")
    return float(seconds) if seconds and seconds.isdigit() else DEFAULT_CRED_EXPIRE_S


def requeue_hold_of(config: str) -> float:
    """How long a requeued batch job is held (``Reason=BeginTime``), from ``scontrol show
    config``'s text: SchedulerParameters' ``requeue_delay`` where this Slurm honours it (25.11+;
    an older one ignores the option: the version is read, never assumed), else AuthInfo's
    ``cred_expire``."""
    delay = config_option(config, "SchedulerParameters", "requeue_delay")
    if delay and delay.isdigit() and version_of(config) >= REQUEUE_DELAY_SINCE:
        return float(delay)
    return cred_expire_of(config)


def show_config() -> str:
    """``scontrol show config``'s text: the running controller's settings."""
    return run(["scontrol", "show", "config"])


def requeue_hold_s() -> float:
    """``requeue_hold_of`` the cluster at hand (one ``scontrol show config``)."""
    return requeue_hold_of(show_config())


DEFAULT_SLURMD_TIMEOUT_S = 300.0  # Slurm's own default (slurm.conf(5))


def slurmd_timeout_of(config: str) -> float:
    """How long slurmctld waits for a silent slurmd before it marks the node DOWN
    (``SlurmdTimeout = 20 sec`` in ``scontrol show config``'s text)."""
    value = (config_value(config, "SlurmdTimeout") or "").split()
    return float(value[0]) if value and value[0].isdigit() else DEFAULT_SLURMD_TIMEOUT_S


_SLURMD_TIMEOUTS: dict[str, float] = {}  # by SLURM_CONF: read once while the controller answers


def slurmd_timeout_s() -> float:
    """``slurmd_timeout_of`` the cluster at hand: one ``scontrol show config`` the first time
    it answers, then that value (a setting changes only with a restart of the controller).
    SlurmUnreachable while the controller is silent and nothing was read yet: never a guess."""
    conf = SlurmEnv().conf or ""
    if conf not in _SLURMD_TIMEOUTS:
        _SLURMD_TIMEOUTS[conf] = slurmd_timeout_of(show_config())
    return _SLURMD_TIMEOUTS[conf]


def step_starts(job_id: str | int, node: str, timeout: float = 20.0) -> bool | None:
    """Does ``node``'s slurmd still start a step of the running job ``job_id`` (``srun
    --overlap true`` there, outside the caller's own step)? True: one started. False: Slurm
    answered and none started (the slurmd gone, the job ending): a doubt, not a verdict. None:
    unknown, the controller did not answer (``srun`` could not reach it and ``scontrol ping``
    does not answer either): ask again once it does."""
    try:
        run(["srun", f"--jobid={job_id}", "--overlap", f"--nodelist={node}", "-N1", "-n1",
             "true"], timeout=timeout, env=SlurmEnv().clients_only())  # fmt: skip
    except SlurmUnreachable:
        # a step that timed out on a hung slurmd looks the same: the controller's ping tells
        return None if unreachable() is not None else False
    except SlurmError:
        return False
    return True


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``n[1-3]``) into host names."""
    return run(["scontrol", "show", "hostnames", nodelist]).split()


def idle_nodes(partition: str) -> int:
    """Idle nodes of ``partition`` that answer (``-r``): a node whose slurmd was just restarted
    shows "idle*" until it registers, and a job started on it then may fail with NODE_FAIL."""
    out = run(["sinfo", "-h", "-r", "-p", partition, "-t", "idle", "-o", "%D"])
    return sum(int(n) for n in out.split())


# sinfo's states in which a node takes no new job until someone (or clustermgtd) acts; not
# ``unknown``: a controller that has just started says it of every node until its slurmd
# registers, seconds later (a requeue decided then found "0 usable nodes" and stopped the run)
UNUSABLE_STATES = ("drain", "down", "fail", "maint", "reserved", "inval", "future")


def node_usable(state: str) -> bool:
    """Can a node in sinfo's ``state`` (``idle``, ``drained``, ``down*``, ``idle~``...) take a
    job? A node only not responding for now (``idle*``: a slurmd restarting) counts as usable:
    stopping a run needs a state that stays."""
    state = state.lower()
    return not any(s in state for s in UNUSABLE_STATES)


TEST_ONLY_RE = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def start_estimate(args: Sequence[str], timeout: float = 30.0) -> float | None:
    """When Slurm would start a job of these sbatch options if it were submitted now
    (``sbatch --test-only``, which submits nothing), as a Unix time; None when Slurm says it
    never could (the request cannot be met)."""
    cmd = [_binary("sbatch"), "--test-only", *args, "--wrap", "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise SlurmUnreachable(f"`sbatch --test-only` timed out after {timeout:.0f} s") from err
    said = f"{proc.stdout}\n{proc.stderr}"
    if any(mark in said for mark in UNREACHABLE_MARKS):
        raise SlurmUnreachable(f"`sbatch --test-only`: {last_line(said)}")
    found = TEST_ONLY_RE.search(said)
    if proc.returncode != 0 or found is None:
        return None
    return time.mktime(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))  # the controller's


def partition_nodes(partition: str | None) -> dict[str, str]:
    """Every node of ``partition`` (the default one if None) and its state as sinfo writes it
    (``idle``, ``allocated``, ``drained``, ``down*``, ``idle~`` ...), in one query."""
    where = ["-p", partition] if partition else []
    out = run(["sinfo", "-h", "-N", *where, "-o", "%N|%T"])
    found: dict[str, str] = {}
    for line in out.splitlines():
        node, _, state = line.strip().partition("|")
        if node:
            found[node] = state
    return found


TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "GONE",
    }
)


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, …; GONE when forgotten
    restarts: int
    nodes: str
    reason: str
    comment: str = ""  # the job's Comment (``hold`` writes why it is held there)
    excluded: str = ""  # the job's ExcNodeList as Slurm writes it (``n[3-4]``; "": none)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def job_state(job_id: str | int) -> JobState:
    """The job's state now; raises SlurmUnreachable when the controller does not answer."""
    return _state_of(str(job_id), job_info(job_id))


def job_states(job_ids: Iterable[str | int]) -> dict[str, JobState]:
    """The state of each of ``job_ids`` now, in one query for all of them (as submitit asks
    ``sacct`` once for all its jobs; ``scontrol`` needs no accounting database): every job the
    controller remembers, the ones asked for kept; a job Slurm has forgotten is GONE. Raises
    SlurmUnreachable when the controller does not answer."""
    wanted = list(dict.fromkeys(str(job) for job in job_ids))
    if not wanted:
        return {}
    out = run(["scontrol", "show", "job", "-o"])
    known = {}
    for line in out.splitlines():
        if line.startswith("JobId="):
            record = parse_record(line)
            known[record["JobId"]] = record
    return {job: _state_of(job, known.get(job)) for job in wanted}


def _state_of(job_id: str, info: dict[str, str] | None) -> JobState:
    if info is None:
        return JobState(job_id, "GONE", 0, "", "")
    return JobState(
        job_id=info.get("JobId", job_id),
        state=info.get("JobState", "UNKNOWN").split()[0],
        restarts=int(info.get("Restarts", "0") or 0),
        nodes=info.get("NodeList", ""),
        reason=info.get("Reason", ""),
        comment=info.get("Comment", "").removeprefix("(null)"),
        excluded=info.get("ExcNodeList", "").removeprefix("(null)"),
    )


def wait_for_job(
    job_id: str | int,
    until: Callable[[JobState], bool] = lambda s: s.finished,
    timeout: float | None = None,
    backoff: Backoff = Backoff(0.5, 1.5, 5.0),
    on_poll: Callable[[JobState], None] | None = None,
    unreachable_for: float = SILENCE_PATIENCE_S,
) -> JobState:
    """Poll the job with back-off until ``until(state)``; return that state.

    A controller that does not answer is retried for up to ``unreachable_for`` seconds in a row
    before SlurmUnreachable is raised; ``on_poll`` sees every state read (e.g. to print changes
    or tail a log). TimeoutError after ``timeout`` seconds.
    """
    failing_since: list[float] = []

    def check() -> JobState | None:
        try:
            state = job_state(job_id)
        except SlurmUnreachable:
            now = time.monotonic()
            failing_since[:] = failing_since or [now]
            if now - failing_since[0] > unreachable_for:
                raise
            return None
        failing_since.clear()
        if on_poll is not None:
            on_poll(state)
        return state if until(state) else None

    return wait_until(check, f"job {job_id}", timeout=timeout, backoff=backoff)
