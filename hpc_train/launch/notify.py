"""``--notify CMD``: the user's own command on the events that need a human.

Task 0's launcher runs ``sh -c CMD`` on the node when the run finishes, stops (a crash, a
cancel, a notice) and each time it is requeued, with the ledger event as one JSON object on its
stdin (``event``, ``job``, ``restart``, ``time``, ``save_dir`` and the event's own fields). The
command gets ``NOTIFY_TIMEOUT_S``; a failing or slow command is logged and never stops training.
Mail needs no command: ``--mail-user``/``--mail-type`` go to sbatch, and Slurm sends it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_core.ledger import Event, Kind

EVENTS = frozenset({Kind.FINISHED, Kind.STOPPED, Kind.REQUEUED})
NOTIFY_TIMEOUT_S = 10.0  # short: the stop on notice runs inside the grace time


def payload(event: Event, save_dir: Path) -> dict[str, Any]:
    return {
        "event": event.kind,
        "job": event.job,
        "restart": event.restart,
        "time": event.time,
        "save_dir": str(save_dir),
        **event.data,
    }


def notify(command: str, event: Event, save_dir: Path, log: Callable[[str], None]) -> bool:
    """Run ``command`` for ``event`` if it is one users are told of; True if it ran and said 0."""
    if event.kind not in EVENTS:
        return False
    try:
        proc = subprocess.run(
            ["sh", "-c", command],
            input=json.dumps(payload(event, save_dir)),
            text=True,
            capture_output=True,
            timeout=NOTIFY_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log(f"--notify command failed on {event.kind}: {err}")
        return False
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        log(f"--notify command exited {proc.returncode} on {event.kind}: {tail[0]}")
        return False
    return True
