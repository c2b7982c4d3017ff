"""Experiment tracking as the user asks for it (``JobSpec.tracking``): ``--tensorboard``,
``--wandb-project`` with ``--wandb-entity`` and ``--wandb-mode``; each field with its option
(``job.fields``). Rank 0 writes the curves (``hpc_train.worker.tracking``): one TensorBoard
logdir in the save dir and one W&B run for every start of the run.

What is decided here, in the CLI, once: the W&B run's id (``run_id``: from the save dir, so
every start and every resubmission to the same save dir log to the same run) and name, the mode
(``resolved``: ``auto`` becomes online where the submitting environment has a W&B key, else
offline), and what the launcher hands rank 0 (``wandb_run``: a ``contract.WandbRun``, never the
key). ``check`` refuses, in one line, what cannot work: a package not installed, a W&B option
without a project, fairseq's own ``--tensorboard-logdir`` or ``--wandb-*`` after ``--`` (they
would log every start afresh beside the toolkit's curves).

The W&B key is read by W&B itself on rank 0 (``WANDB_API_KEY``, which Slurm passes on from the
submitting shell like every variable, or ``~/.netrc`` from ``wandb login``); here only whether
one is there is asked, and nothing of it is kept.
"""

from __future__ import annotations

import hashlib
import importlib.util
import netrc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

from hpc_core.rundir import RunDir
from hpc_train.contract import WandbRun
from hpc_train.job.fields import option

MODES = ("auto", "online", "offline")
KEY_ENV = "WANDB_API_KEY"  # W&B's own variable for the key (read by W&B only, never stored)
W_AND_B_HOST = "api.wandb.ai"  # where ~/.netrc keeps the key (``wandb login``)
PACKAGES = {"--tensorboard": "tensorboard", "--wandb-project": "wandb"}
INSTALL = "pip install 'hpc-train[tracking]' (bootstrap/python-env.sh and the images install it)"
# fairseq's own logging options that would fight the toolkit's (a new W&B run and a fresh
# TensorBoard series at every start): refused after `--`, with a pointer (fairseq's argparse
# takes any unambiguous prefix, so every --tensorboard*/--wandb* is refused)
FAIRSEQ_OWN = ("--tensorboard", "--wandb")
# what W&B refuses in a project's name (its UI: "cannot contain /\\#?%:"), and its length
PROJECT_FORBIDDEN = "/\\#?%:"


class TrackingError(ValueError):
    """Bad tracking input; the message is one line meant for the user."""


@dataclass(frozen=True)
class Tracking:
    """Where rank 0 puts the run's curves (``JobSpec.tracking``); all off by default."""

    tensorboard: bool = option(
        "--tensorboard", "rank 0 writes TensorBoard event files to <save-dir>/tensorboard, one "
        "series per metric across every start (steps: fairseq's updates, none logged twice), "
        "with the toolkit's figures (goodput by cause, nodes, checkpoint time) and each restart "
        "at its update; view with `tensorboard --logdir <save-dir>/tensorboard`",
        default=False,
    )  # fmt: skip
    wandb_project: str | None = option(
        "--wandb-project", "log to this Weights & Biases project from rank 0: one W&B run for "
        "every start, its id derived from the save dir (a resubmission to it continues the "
        "run); the key is W&B's own (WANDB_API_KEY or ~/.netrc), never in the job",
        default=None, metavar="NAME", default_text="off",
    )  # fmt: skip
    wandb_entity: str | None = option(
        "--wandb-entity", "the W&B user or team that owns --wandb-project", default=None,
        metavar="NAME", default_text="the key's default entity",
    )  # fmt: skip
    wandb_mode: str = option(
        "--wandb-mode", "online: rank 0 sends as it trains (the nodes need the network); "
        "offline: it writes <save-dir>/wandb, one folder per start, for `wandb sync` later; "
        "auto: online where this shell has a W&B key (WANDB_API_KEY, or api.wandb.ai in "
        "~/.netrc), else offline",
        default="auto", choices=MODES,
    )  # fmt: skip

    @property
    def asked(self) -> bool:
        return self.tensorboard or self.wandb_project is not None


def run_id(save_dir: Path) -> str:
    """The W&B run id of the run in ``save_dir`` (absolute): the same for every start and every
    resubmission to that save dir, as the save dir is the run (its checkpoint resumes)."""
    return "hpc-" + hashlib.sha256(str(save_dir).encode()).hexdigest()[:16]


def key_source(env: Mapping[str, str], home: Path) -> str | None:
    """Where W&B would find a key here (``WANDB_API_KEY``, else a ``~/.netrc`` entry for its
    host, ``$NETRC`` if set), by name; None without one. The key itself is not read."""
    if env.get(KEY_ENV):
        return KEY_ENV
    path = Path(env["NETRC"]) if env.get("NETRC") else home / ".netrc"
    host = urlparse(env.get("WANDB_BASE_URL") or f"https://{W_AND_B_HOST}").hostname or ""
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if found is not None else None


def resolved(tracking: Tracking, env: Mapping[str, str], home: Path) -> Tracking:
    """``tracking`` with ``--wandb-mode auto`` decided: online where a key is here, else
    offline (the submitting environment is the job's: Slurm passes it on)."""
    if tracking.wandb_mode != "auto":
        return tracking
    mode = "online" if key_source(env, home) is not None else "offline"
    return replace(tracking, wandb_mode=mode)


def wandb_run(tracking: Tracking, save_dir: Path) -> WandbRun | None:
    """What rank 0 gets to open (and reopen, at every start) the run's one W&B run; None
    without ``--wandb-project``. Its name is the save dir's, as fairseq names its runs."""
    if tracking.wandb_project is None:
        return None
    return WandbRun(
        project=tracking.wandb_project,
        run_id=run_id(save_dir),
        name=save_dir.name,
        mode=tracking.wandb_mode,
        entity=tracking.wandb_entity,
    )


def tensorboard_dir(tracking: Tracking, run: RunDir) -> Path | None:
    """Rank 0's TensorBoard logdir (``RunDir.tensorboard``); None without ``--tensorboard``."""
    return run.tensorboard if tracking.tensorboard else None


def check(tracking: Tracking, extra_args: Sequence[str]) -> None:
    """TrackingError (one line) for what cannot work: fairseq's own logging options after
    ``--``, a W&B option without ``--wandb-project``, a bad project name, a package this Python
    lacks (the nodes run the same environment: the bootstrap's, or the image's)."""
    for arg in extra_args:
        if arg.startswith(FAIRSEQ_OWN):
            flag = arg.split("=")[0]
            ours = "--tensorboard" if arg.startswith("--tensorboard") else "--wandb-project NAME"
            raise TrackingError(
                f"-- {flag}: fairseq's own logging starts afresh at every start; use the "
                f"toolkit's {ours} (one series, one run across requeues and restarts)"
            )
    project = tracking.wandb_project
    if project is None and (tracking.wandb_entity is not None or tracking.wandb_mode != "auto"):
        raise TrackingError("--wandb-entity and --wandb-mode need --wandb-project NAME")
    if project is not None and (
        not project.strip() or len(project) > 128 or set(project) & set(PROJECT_FORBIDDEN)
    ):
        raise TrackingError(
            f"--wandb-project {project!r}: 1-128 characters, none of {PROJECT_FORBIDDEN}"
        )
    asked = {"--tensorboard": tracking.tensorboard, "--wandb-project": project is not None}
    for flag, package in PACKAGES.items():
        if asked[flag] and importlib.util.find_spec(package) is None:
            raise TrackingError(f"{flag} needs the {package} package, not installed: {INSTALL}")


def describe(tracking: Tracking, run: RunDir) -> list[str]:
    """Where the run's curves will be, in a few lines (``submit``, its ``--dry-run``)."""
    lines = []
    logdir = tensorboard_dir(tracking, run)
    if logdir is not None:
        lines.append(f"TensorBoard (rank 0): tensorboard --logdir {logdir}")
    wandb = wandb_run(tracking, run.root)
    if wandb is not None:
        owner = f"{wandb.entity}/" if wandb.entity else ""
        lines.append(
            f"W&B (rank 0): project {owner}{wandb.project}, run {wandb.name} (id "
            f"{wandb.run_id}), {wandb.mode}; every start resumes this run"
        )
        if wandb.mode == "offline":
            lines.append(f"  later, from a machine online: wandb sync {run.wandb}/offline-run-*")
    return lines
