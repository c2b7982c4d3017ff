"""Thin helpers over Slurm's client commands, in one place.

Every call honours ``SLURM_CONF`` (the local cluster's config lives in
``.local/cluster/etc/slurm.conf``; on ParallelCluster it is ``/opt/slurm/etc/slurm.conf`` and the
commands are in ``/opt/slurm/bin``). Nothing here imports torch or fairseq.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

LOCAL_HINT = "start the local cluster with `make cluster-up` and export the SLURM_CONF it prints"
PCLUSTER_BIN = "/opt/slurm/bin"
DEFAULT_CONFS = ("/etc/slurm/slurm.conf", "/opt/slurm/etc/slurm.conf")


class SlurmError(RuntimeError):
    """A Slurm command failed or Slurm cannot be reached."""


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


def run(args: Sequence[str], timeout: float = 30.0, check: bool = True) -> str:
    """Run a Slurm client command; return stdout. Raises SlurmError with Slurm's own message."""
    cmd = [_binary(args[0]), *args[1:]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise SlurmError(f"`{' '.join(args)}` timed out after {timeout:.0f} s") from err
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(args)}` failed: {msg[-1] if msg else proc.returncode}")
    return proc.stdout


def ensure_reachable() -> None:
    """Raise SlurmError with a one-line hint unless slurmctld answers."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        raise SlurmError(f"no Slurm reachable: SLURM_CONF={conf} does not exist; {LOCAL_HINT}")
    if not conf and not any(os.path.isfile(p) for p in DEFAULT_CONFS):
        raise SlurmError(f"no Slurm reachable: SLURM_CONF is not set; {LOCAL_HINT}")
    try:
        out = run(["scontrol", "ping"], timeout=15, check=False)
    except SlurmError as err:
        raise SlurmError(f"no Slurm reachable ({err}); {LOCAL_HINT}") from None
    if "UP" not in out:
        raise SlurmError(f"no Slurm controller answers (SLURM_CONF={conf}); {LOCAL_HINT}")


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
    """``scontrol show job -o JOBID`` as a dict, or None once Slurm has forgotten the job."""
    out = run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    line = out.strip().splitlines()[0] if out.strip() else ""
    if not line.startswith("JobId="):
        return None
    return parse_record(line)


def node_info(node: str) -> dict[str, str]:
    out = run(["scontrol", "show", "node", "-o", node])
    return parse_record(out.strip())


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``n[1-3]``) into host names."""
    return run(["scontrol", "show", "hostnames", nodelist]).split()


def requeue(job_id: str | int) -> None:
    run(["scontrol", "requeue", str(job_id)])


def drain(node: str, reason: str) -> None:
    run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])


def resume(node: str) -> None:
    run(["scontrol", "update", f"nodename={node}", "state=resume"])


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, …; GONE when forgotten
    restarts: int
    nodes: str
    reason: str

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


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


def job_state(job_id: str | int) -> JobState:
    info = job_info(job_id)
    if info is None:
        return JobState(str(job_id), "GONE", 0, "", "")
    return JobState(
        job_id=info.get("JobId", str(job_id)),
        state=info.get("JobState", "UNKNOWN"),
        restarts=int(info.get("Restarts", "0") or 0),
        nodes=info.get("NodeList", ""),
        reason=info.get("Reason", ""),
    )
