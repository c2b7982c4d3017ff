"""Heartbeats: each rank records its progress every update; its launcher reads them.

The worker side (``Heartbeat``) writes ``rank-<r>.json`` in the directory its launcher passes
(``HPC_TRAIN_HEARTBEAT_DIR``) three times per update: when the update has trained (``stepped``,
phase ``train``, before the ranks' per-update notice agreement), once they agreed (phase
``checkpoint``: validation and saves may follow) and when it goes back to training (``train``;
``epoch`` at the end of an epoch, ``stopping`` once fairseq decided to stop). Inside
validate-and-save, ``hpc_train.worker.validation_beats`` adds a beat per validation batch
(``validate``) and one as each save begins (``checkpoint``). A write is a small
JSON renamed into place without fsync (three small renames per update, counted in its test):
whole for a reader, never durable (a heartbeat only matters while the job runs). A write that
fails (the save dir's file system full or read-only) says so once on stderr and training goes on:
the launcher's hang watcher, seeing no progress, is what acts. It also arms faulthandler: SIGUSR1 writes the rank's Python stacks (all threads) to
``rank-<r>.stacks``, even while blocked in a collective. With ``hpc_train.worker.compute_time``
installed, each beat also carries ``compute_s``: the median of the rank's own compute per update
over its recent updates, which ``hpc_train.watch.stragglers`` compares across nodes.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO

from hpc_core.rundir import atomic_write, heartbeat_file, stacks_file
from hpc_train.contract import (
    CHECKPOINT,
    EPOCH,
    STACKS_SIGNAL,
    STARTUP,
    STOPPING,
    TRAIN,
    VALIDATE,
    Beat,
    node_name,
)

RECENT = 50  # the slowest of this many recent updates sets the allowance
COMPUTE_RECENT = 20  # the median of this many updates' own compute times (stragglers)


class Heartbeat:
    """One rank's heartbeat writer."""

    def __init__(self, directory: Path, rank: int, clock: Callable[[], float] = time.time) -> None:
        self.path = heartbeat_file(directory, rank)
        self.rank, self.node, self.pid = rank, node_name(), os.getpid()
        self.clock = clock
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.training_since: float | None = None  # when it went back to training
        self.update = 0
        self.computes: deque[float] = deque(maxlen=COMPUTE_RECENT)
        self._computing = 0.0  # this update's compute so far (``compute``)
        self.write_error: OSError | None = None  # the last beat's, until one is written again
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            self._failed(err)
        self._stacks: IO[str] | None = None

    def arm_stacks(self, directory: Path) -> None:
        """SIGUSR1 → this rank's Python stacks in ``rank-<r>.stacks`` (faulthandler, C level;
        to stderr, the task log, when that file cannot be made); then the first beat
        (``startup``: no update yet)."""
        try:
            self._stacks = open(stacks_file(directory, self.rank), "w")  # noqa: SIM115  kept open
        except OSError as err:
            self._failed(err)
        where = self._stacks if self._stacks is not None else sys.stderr
        faulthandler.register(STACKS_SIGNAL, file=where, all_threads=True, chain=False)
        self._write(STARTUP)  # a rank hung in start-up now has a pid to ask for its stacks

    def _failed(self, err: OSError) -> None:
        """A heartbeat file not written (the save dir's file system full or read-only): one
        line on stderr when it begins, never an exception that ends the rank."""
        if self.write_error is None:
            print(f"hpc-train: rank {self.rank}'s heartbeat not written ({type(err).__name__}: "
                  f"{err}); training goes on, its launcher sees no progress from it",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.write_error = err

    def _write(self, phase: str) -> None:
        slowest = max(self.recent) if self.recent else None
        compute = statistics.median(self.computes) if self.computes else None
        now = self.clock()
        beat = Beat(self.rank, self.node, self.pid, self.update, now, phase, slowest, compute)
        try:
            atomic_write(self.path, json.dumps(asdict(beat)), durable=False)
        except OSError as err:
            self._failed(err)
            return
        if self.write_error is not None:
            print(f"hpc-train: rank {self.rank}'s heartbeat written again", file=sys.stderr)
            self.write_error = None

    def stepped(self, update: int) -> None:
        """Update ``update`` trained (its optimizer step is done and fairseq has logged it), before
        the ranks agree on a notice: the beat says so at once, phase ``train`` (a rank blocked in
        that agreement is still in training's collectives). A rank whose peer stops right after
        the step has trained this update; if the run resumes below it, it is trained twice."""
        if update <= self.update:
            return
        now = self.clock()
        if self.training_since is not None:
            self.recent.append(now - self.training_since)
        if self._computing > 0:
            self.computes.append(self._computing)
            self._computing = 0.0
        self.update = update
        self._write(TRAIN)

    def completed(self, update: int) -> None:
        """Update ``update`` is done and the ranks agreed on it; validate-and-save follows."""
        self.stepped(update)
        self._write(CHECKPOINT)

    def validating(self) -> None:
        """Validation began, or one of its batches is done (phase ``validate``)."""
        self._write(VALIDATE)

    def saving(self) -> None:
        """A checkpoint save begins (phase ``checkpoint``): its allowance counts from now."""
        self._write(CHECKPOINT)

    def compute(self, seconds: float) -> None:
        """Add a micro-batch's own compute time (collectives excluded) to the current update's
        (``hpc_train.worker.compute_time`` calls it)."""
        self._computing += seconds

    def training(self, end_of_epoch: bool = False, stopping: bool = False) -> None:
        """Validate-and-save returned: back to training, to the next epoch, or (``stopping``:
        max-update reached) to the end of training and the workers' exit."""
        self._write(STOPPING if stopping else EPOCH if end_of_epoch else TRAIN)
        self.training_since = None if end_of_epoch or stopping else self.clock()
