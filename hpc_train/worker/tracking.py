"""Rank 0's experiment tracking (``--tensorboard``, ``--wandb-project``): one TensorBoard series
per metric and one W&B run for the whole run, however often it is requeued, restarted in the
job, shrunk or grown.

The toolkit writes the curves itself rather than driving fairseq's own wrappers
(``fairseq/logging/progress_bar.py``: ``TensorboardProgressBarWrapper``,
``WandBProgressBarWrapper``), because those log every start afresh and the fixes would reach
into four of their private methods:

- fairseq's TensorBoard writer adds ``sys.argv`` as a text at step 0 each time it opens a folder:
  one more point at step 0 per start and folder, the duplicate step this module exists to avoid;
- its W&B wrapper opens the run with ``wandb.init(project, name)`` only (no id, no resume, no
  dir, no mode, no settings: each would have to come through ``WANDB_*`` variables set for rank
  0 alone, beside the user's own), and W&B drops a step below one it has with a warning
  rather than our filter saying what it kept;
- the step filter has to sit between the console bar (train.log keeps every line, the recomputed
  updates included: ``runs.logparse`` counts them) and the two writers, i.e. inside both
  wrappers' ``_log_to_*`` methods; and the toolkit's figures and restart points need writers of
  their own anyway.

So fairseq's progress-bar factory (``fairseq.logging.progress_bar.progress_bar``, which
``fairseq_cli.train`` looks up at every epoch and every validation) is wrapped on rank 0: the bar
it builds prints train.log's lines as before, and each of its ``log``/``print`` calls (tag
``train_inner``, ``train`` or the validation subset; step: fairseq's update) also reaches the
``Tracker``, which writes fairseq's layout (TensorBoard: a folder per tag; W&B: ``tag/metric``).
fairseq's ``--tensorboard-logdir`` and ``--wandb-*`` are refused at submit (``job.tracking``).

- **Nothing logged twice.** Each tag's last logged step is kept across starts
  (``contract.write_steps``), written before the writers are called, so a start killed mid-call
  loses a point rather than drawing one twice; a step at or below it is not logged again. After
  a resume from an older checkpoint the recomputed updates keep their first values.
- **Each restart at its update** (its own TensorBoard folder and W&B prefix, ``restarts``): at a
  start that is not the run's first, rank 0 reads the ledger (``planning.goodput``'s segments): the
  update it resumed at, the cause of the previous start's end (the ``stopped`` event's
  ``cause``, as ``goodput.segments`` reads it), that end in the launcher's words, and the
  updates recomputed. In W&B the point goes with the next log call, on its own x-axis
  (``restarts/update``): W&B takes no step below one it has.
- **The toolkit's figures** (folder and prefix ``hpc-train``), at every ``train_inner`` step:
  ETTR and the seconds by cause (``planning.goodput.account``), restarts, recomputed updates, this
  start's nodes and world, the last save's stall and size; words/s is fairseq's ``wps``.

- **Written before the start ends.** TensorBoard's files are flushed at every call. W&B writes
  through a service process of its own, which the requeue after a notice kills with rank 0: so
  the save on notice finishes W&B's run (rank 0 waits for its service to write it; online, the
  run is marked preempting instead and not waited for) before the stop marker lets the launcher
  requeue. A rank killed without a notice (a peer's crash, a lost node) loses what W&B had not
  yet written, never a TensorBoard point; the steps record still says it was logged, so W&B's
  curve has a gap there, not a second value.

A writer that fails (a full disk, W&B unreachable online) is said once and left off for the rest
of the start: training never stops for a curve.
"""

from __future__ import annotations

import atexit
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Number
from pathlib import Path
from typing import Any

from hpc_core import ledger
from hpc_core.ledger import Event, Kind
from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.contract import TrackingRecord, WandbRun, WorkerEnv
from hpc_train.planning import goodput
from hpc_train.worker import preemption

log = logging.getLogger(__name__)

TRAIN_INNER = "train_inner"  # fairseq's tag for each log interval's figures
TOOLKIT = "hpc-train"  # the toolkit's figures: a TensorBoard folder, a W&B prefix
RESTARTS = "restarts"  # one point per restart: a TensorBoard folder, a W&B prefix


def numbers(stats: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of one fairseq log call, as fairseq's own writers take them: numbers, an
    ``AverageMeter``'s last value, a one-element tensor; ``num_updates`` is the step."""
    out = {}
    for key, value in stats.items():
        value = getattr(value, "val", value)
        if key == "num_updates" or isinstance(value, bool):
            continue
        if isinstance(value, Number):
            out[key] = float(value)  # type: ignore[arg-type]
        elif getattr(value, "numel", lambda: 0)() == 1:
            out[key] = float(value.item())
    return out


class TensorBoard:
    """One event writer per folder of the logdir (fairseq's layout: a folder per tag)."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir, self.new = logdir, SummaryWriter
        self.writers: dict[str, Any] = {}

    def write(
        self, folder: str, step: int, scalars: Mapping[str, float], texts: Mapping[str, str]
    ) -> None:
        writer = self.writers.get(folder)
        if writer is None:
            writer = self.writers[folder] = self.new(str(self.logdir / folder))
        for key, value in scalars.items():
            writer.add_scalar(key, value, step)
        for key, text in texts.items():
            writer.add_text(key, text, step)
        writer.flush()  # on disk before the next update: a killed rank loses nothing written

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


class WandB:
    """The run's one W&B run, opened again at every start (the same id, resumed)."""

    def __init__(self, said: WandbRun, root: Path) -> None:
        import wandb

        self.said = said
        self.run = wandb.init(
            project=said.project, entity=said.entity, id=said.run_id, name=said.name,
            resume="allow", mode="online" if said.mode == "online" else "offline", dir=str(root),
            # train.log is the log (and W&B would wrap rank 0's stdout for a copy of it)
            settings=wandb.Settings(console="off", quiet=True),
        )  # fmt: skip
        self.run.define_metric(f"{RESTARTS}/update")
        self.run.define_metric(f"{RESTARTS}/*", step_metric=f"{RESTARTS}/update")
        self.configured = False

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        self.run.log(dict(values), step=step)

    def config(self, config: Mapping[str, Any]) -> None:
        """fairseq's flattened config, once a start (fairseq sends it every epoch)."""
        if not self.configured:
            self.configured = True
            self.run.config.update(dict(config), allow_val_change=True)

    def record(self) -> tuple[str | None, str]:
        """(the run's URL: online only, this start's folder)."""
        url = self.run.url if self.said.mode == "online" else None
        return url, str(Path(self.run.dir).parent)

    def close(self, notice: bool = False) -> None:
        """Finish the run and wait for W&B's service to have written it (offline: its file,
        milliseconds; online at the end of training: the upload). On a notice online, the run
        is marked preempting (W&B's word: it resumes later) and not waited for: the notice's
        window is the save's."""
        import wandb

        online = self.said.mode == "online"
        if notice and online:
            self.run.mark_preempting()
        self.run.finish()
        if not (notice and online):
            wandb.teardown()


@dataclass(frozen=True)
class Restart:
    """A start that is not the run's first, from the ledger."""

    number: int  # restarts so far, this one included
    update: int  # the update it resumed at
    cause: str  # the previous start's end: its ``stopped`` event's cause (goodput.segments)
    why: str  # that end in the launcher's words (the ``started`` event's ``previous``)
    recomputed: int  # updates the previous start reached past ``update``: trained again

    def text(self) -> str:
        redone = self.recomputed
        again = (
            f"; updates {self.update + 1}-{self.update + redone} recomputed, their first values "
            "kept" if redone else ""
        )  # fmt: skip
        return f"restart {self.number} at update {self.update}: {self.cause}; {self.why}{again}"


def restart_of(
    events: list[Event], start: tuple[str, int] | None, now: float, logged: int = 0
) -> Restart | None:
    """This start's ``Restart`` (``start``: its (round, restart) as the launcher told the
    ranks; the ledger's last ``started`` event is its own; ``logged``: the last ``train_inner``
    step earlier starts logged); None for the run's first start, a rank started by hand, or a
    ledger without this start."""
    starts = [e for e in events if e.kind == Kind.STARTED]
    if start is None or len(starts) < 2:
        return None
    if (starts[-1].job, starts[-1].restart) != (contract.job_of(start[0]), start[1]):
        return None  # the launcher names the job, the ranks are told the round: 41 and 41.1
    segs = goodput.segments(events, now)
    before, this = segs[-2], segs[-1]
    update = this.resume_at or 0
    # trained before: the launcher's word (the heartbeats') or, past it, what rank 0 logged (an
    # update logged, then a crash in its validate-and-save step before its heartbeat)
    reached = max(before.reached or 0, logged, update)
    why = goodput.restarts(events)[-1][1]
    return Restart(len(segs) - 1, update, before.cause, why, reached - update)


class LedgerView:
    """The run's ledger as rank 0 last read it, read again only when it has grown."""

    def __init__(self, path: Path) -> None:
        self.path, self.size, self.cached = path, -1, list[Event]()

    def events(self) -> list[Event]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.cached
        if size != self.size:
            self.cached, self.size = ledger.read(self.path), size
        return self.cached


def figures(events: list[Event], now: float) -> dict[str, float]:
    """The toolkit's figures from the ledger: goodput (ETTR, seconds by cause), restarts and
    recomputed updates, the nodes and world of the last start, the last save's stall and size;
    none for a rank started by hand (no start in the ledger)."""
    started = [e for e in events if e.kind == Kind.STARTED]
    if not started:
        return {}
    g = goodput.account(events, now)
    out = {f"seconds/{part.replace(' ', '_').replace('-', '_')}": s for part, s in g.parts.items()}
    if g.ettr is not None:
        out["goodput/ettr"] = g.ettr
    out["run/restarts"], out["run/recomputed_updates"] = g.restarts, g.recomputed_updates
    out["run/nodes"] = len(started[-1].get("nodes") or ())
    out["run/world"] = float(started[-1].get("world") or 0)
    saves = [e for e in events if e.kind == Kind.CHECKPOINT]
    if saves:
        out["checkpoint/last_stall_s"] = float(saves[-1].get("seconds") or 0)
        out["checkpoint/last_gb"] = float(saves[-1].get("bytes") or 0) / 1e9
    return out


class Tracker:
    """Rank 0's curves for one start: the step filter, the toolkit's figures and restart point,
    and the writers (either may be None: not asked, or failed and left off)."""

    def __init__(
        self,
        run: RunDir,
        tensorboard: TensorBoard | None,
        wandb: WandB | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run, self.tensorboard, self.wandb, self.clock = run, tensorboard, wandb, clock
        self.steps = contract.read_steps(run)  # what every earlier start logged, by tag
        self.ledger = LedgerView(run.ledger)
        self.pending: dict[str, Any] = {}  # W&B: the restart point, sent with the next log
        self.skipped = 0  # log calls not logged again (a recomputed update's)

    def log(self, tag: str | None, step: int | None, stats: Mapping[str, Any]) -> bool:
        """One fairseq log call; False when its step was logged before under its tag."""
        tag = tag or ""
        step = int(stats["num_updates"] if step is None else step)
        if step <= self.steps.get(tag, -1):
            self.skipped += 1
            return False
        self.claim({tag: step, **({TOOLKIT: step} if tag == TRAIN_INNER else {})})
        scalars = numbers(stats)
        ours = figures(self.ledger.events(), self.clock()) if tag == TRAIN_INNER else {}
        self.to_tensorboard(tag, step, scalars)
        if ours:
            self.to_tensorboard(TOOLKIT, step, ours)
        values = {f"{tag}/{k}": v for k, v in scalars.items()}
        values.update({f"{TOOLKIT}/{k}": v for k, v in ours.items()})
        self.to_wandb(step, {**values, **self.pending})
        self.pending = {}
        return True

    def mark_restart(self, restart: Restart) -> None:
        """The restart's point: TensorBoard's ``restarts`` folder at its update (one past the
        previous restart's point, should that be there already: a restart that made no
        progress); W&B's with the next log call."""
        step = max(restart.update, self.steps.get(RESTARTS, -1) + 1)
        self.claim({RESTARTS: step})
        counts = {"restarts": restart.number, "recomputed_updates": restart.recomputed}
        self.to_tensorboard(RESTARTS, step, counts, {"cause": restart.text()})
        self.pending = {f"{RESTARTS}/update": restart.update, f"{RESTARTS}/cause": restart.cause}
        self.pending.update({f"{RESTARTS}/{k}": v for k, v in counts.items()})

    def claim(self, steps: Mapping[str, int]) -> None:
        """Record ``steps`` as logged, before any writer is called."""
        self.steps.update(steps)
        self.guard("the record of logged steps", lambda: contract.write_steps(self.run, self.steps))

    def to_tensorboard(
        self, folder: str, step: int, scalars: Mapping[str, float], texts: Mapping[str, str] = {}
    ) -> None:
        sink = self.tensorboard
        if sink is not None and not self.guard(
            "TensorBoard", lambda: sink.write(folder, step, scalars, texts)
        ):
            self.tensorboard = None

    def to_wandb(self, step: int, values: Mapping[str, Any]) -> None:
        sink = self.wandb
        if sink is not None and not self.guard("W&B", lambda: sink.write(step, values)):
            self.wandb = None

    def config(self, config: Mapping[str, Any]) -> None:
        sink = self.wandb
        if sink is not None:
            self.guard("W&B's config", lambda: sink.config(config))

    @staticmethod
    def guard(what: str, call: Callable[[], Any]) -> bool:
        """``call``, or (it raised) a warning: training goes on without it."""
        try:
            call()
        except Exception as err:  # any writer's failure: never the training's
            log.warning(f"tracking: {what} failed, left off for this start: {err!r}")
            return False
        return True

    def on_notice(self) -> None:
        """The save on notice is written and this start is about to end: W&B's run finished
        now, before the stop marker (after it, the requeue may kill rank 0 and W&B's service at
        any moment, and what W&B has not written is lost); TensorBoard's files are flushed at
        every call. The end-of-epoch line fairseq still logs goes to TensorBoard only."""
        sink, self.wandb = self.wandb, None
        if sink is not None:
            self.guard("finishing W&B's run on the notice", lambda: sink.close(notice=True))

    def close(self) -> None:
        tensorboard, wandb = self.tensorboard, self.wandb
        self.tensorboard = self.wandb = None
        if tensorboard is not None:
            self.guard("closing TensorBoard's files", tensorboard.close)
        if wandb is not None:
            self.guard("finishing W&B's run", wandb.close)


class TrackedBar:
    """A fairseq progress bar whose log and print calls also reach the tracker."""

    def __init__(self, bar: Any, tracker: Tracker) -> None:
        self.bar, self.tracker = bar, tracker

    def __iter__(self) -> Any:
        return iter(self.bar)

    def __len__(self) -> int:
        return len(self.bar)

    def __enter__(self) -> TrackedBar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self.bar.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bar, name)

    def log(
        self, stats: Mapping[str, Any], tag: str | None = None, step: int | None = None
    ) -> None:
        self.bar.log(stats, tag=tag, step=step)
        self.tracker.log(tag, step, stats)

    def print(
        self, stats: Mapping[str, Any], tag: str | None = None, step: int | None = None
    ) -> None:
        self.bar.print(stats, tag=tag, step=step)
        self.tracker.log(tag, step, stats)

    def update_config(self, config: Mapping[str, Any]) -> None:
        self.bar.update_config(config)
        self.tracker.config(config)


def opened(make: Callable[[], Any], what: str) -> Any:
    """``make()``, or None with a warning (a package missing on the node, W&B unreachable
    online): this start trains without that writer."""
    try:
        return make()
    except Exception as err:  # any writer's failure: never the training's
        log.warning(f"tracking: {what} could not open, left off for this start: {err!r}")
        return None


def open_tracker(run: RunDir, worker: WorkerEnv, clock: Callable[[], float] = time.time) -> Tracker:
    """The writers ``worker`` asks for (one that cannot open is said and left off), this
    start's ``TrackingRecord``, and its restart point."""
    tensorboard = wandb = None
    if worker.tensorboard is not None:
        logdir = worker.tensorboard
        tensorboard = opened(lambda: TensorBoard(logdir), "TensorBoard")
    if worker.wandb is not None:
        said = worker.wandb
        wandb = opened(lambda: WandB(said, run.root), "W&B")
    tracker = Tracker(run, tensorboard, wandb, clock)
    url, folder = wandb.record() if wandb is not None else (None, None)
    logdir_text = str(worker.tensorboard) if tensorboard is not None else None
    record = TrackingRecord(logdir_text, worker.wandb if wandb else None, url, folder)
    Tracker.guard("the tracking record", lambda: contract.write_tracking(run, record))
    logged = tracker.steps.get(TRAIN_INNER, 0)
    restart = restart_of(tracker.ledger.events(), worker.start, clock(), logged)
    if restart is not None:
        tracker.mark_restart(restart)
    return tracker


def install(run: RunDir, worker: WorkerEnv, rank: int) -> Tracker | None:
    """Rank 0 with tracking asked for: open the tracker, wrap fairseq's progress-bar factory
    so that every bar also logs to it, and its checkpoint save so that the save on notice ends
    W&B's run before the stop marker; None elsewhere (nothing changed)."""
    if rank != 0 or (worker.tensorboard is None and worker.wandb is None):
        return None
    from fairseq import checkpoint_utils
    from fairseq.logging import progress_bar

    tracker = open_tracker(run, worker)
    make = progress_bar.progress_bar

    @functools.wraps(make)
    def tracked(*args: Any, **kwargs: Any) -> TrackedBar:
        return TrackedBar(make(*args, **kwargs), tracker)

    progress_bar.progress_bar = tracked
    save = checkpoint_utils.save_checkpoint

    @functools.wraps(save)
    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        out = save(*args, **kwargs)
        if preemption.saving_on_notice():  # the notice's save: the stop marker comes next
            tracker.on_notice()
        return out

    checkpoint_utils.save_checkpoint = save_checkpoint
    atexit.register(tracker.close)  # W&B's last records and the event files, at any exit
    return tracker
