"""The training worker: one per rank, started by torchrun as ``python -m hpc_train.train ARGS``.

It runs fairseq's own training entry with the few fixes this stack needs:
- distributed init from torchrun's environment (env://, WORLD_SIZE, RANK). Without it fairseq on
  a CPU node takes its world size from the CUDA device count (0 → 1) and every rank silently
  trains alone;
- checkpoint loading under torch's weights_only default through an explicit allow-list
  (see ``hpc_train.checkpoints``), instead of switching the safety off;
- atomic checkpoint files (write, fsync, rename) instead of fairseq's in-place copies;
- save on notice: SIGUSR2 → all ranks save at the same update and stop (``hpc_train.preemption``).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpc_core.rundir import STOP_MARKER_ENV, RunDir
from hpc_train import checkpoints, preemption


def distributed_args(env: Mapping[str, str]) -> list[str]:
    """fairseq flags for the rank torchrun started us as; none outside torchrun."""
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return []
    return [
        "--distributed-init-method", "env://",
        "--distributed-world-size", env["WORLD_SIZE"],
        "--distributed-rank", env["RANK"],
        "--distributed-no-spawn",
    ]  # fmt: skip


def stop_marker(run: RunDir, env: Mapping[str, str]) -> Path:
    """Where to record a save on notice: the path the launcher chose for this start, or (a
    worker run by hand, outside the launcher) the run directory's marker for a local run."""
    return Path(env[STOP_MARKER_ENV]) if STOP_MARKER_ENV in env else run.stop_marker("local", 0)


def save_dir_of(args: Sequence[str]) -> Path:
    """The (last) ``--save-dir`` among fairseq arguments; fairseq's default otherwise."""
    found = "checkpoints"
    for flag, value in itertools.pairwise(args):
        if flag == "--save-dir":
            found = value
    return Path(found)


def log_to_file(path: Path) -> None:
    """Copy this rank's log records to ``path`` (one handler on the root logger).

    fairseq's own ``--log-file`` adds a new handler for every epoch's progress bar, so its lines
    repeat from the second epoch on. Ranks other than 0 log warnings only (fairseq lowers them).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    logging.getLogger().addHandler(handler)


def quiet_known_warnings() -> None:
    """Hide deprecation noise fairseq 0.12 triggers in hydra and torch on every rank."""
    warnings.filterwarnings("ignore", category=UserWarning, module=r"hydra\.")
    warnings.filterwarnings("ignore", message=".*is validated against ConfigStore schema")
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator")
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.autocast")


def main(argv: list[str] | None = None) -> None:
    preemption.install_handler()  # first: a notice during start-up is kept, not lost
    quiet_known_warnings()
    args = list(sys.argv[1:] if argv is None else argv) + distributed_args(os.environ)
    save_dir = save_dir_of(args)
    checkpoints.allow_fairseq_globals()
    from fairseq_cli.train import cli_main  # configures logging on import

    run = RunDir(save_dir)
    log_to_file(run.train_log)
    checkpoints.install_atomic_writes()
    preemption.install_save_on_notice(run, stop_marker(run, os.environ))
    sys.argv = ["fairseq-train", *args]
    cli_main()


if __name__ == "__main__":
    main()
