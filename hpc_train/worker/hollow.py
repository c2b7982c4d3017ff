"""A hollow rank: a STAND-IN FOR THE MODEL, for measuring the control plane at scale only
(``submit --hollow``; ``make bench-scale``). No training figure ever comes from it.

One machine cannot train fairseq on 64 emulated nodes (a rank imports torch and fairseq and holds
a model: about 460 MB), but what changes with the node count is not the model: it is torchrun's
rendezvous with many agents, one launcher per node asking Slurm, every node's heartbeats, ledger
lines and failure files on the shared file system, the hang monitor, blame and the spares. So a
hollow rank keeps everything of the rank's contract (``contract.py``) and leaves fairseq out:

- started by the real launcher through the real torchrun, with the same fairseq arguments (it
  reads ``--max-update``, ``--save-interval-updates``, ``--log-interval``, ``--continue-once``,
  ``--seed`` and ignores the rest) and the same ``contract.WorkerEnv``;
- a small real state (``STATE_SIZE`` floats) trained by gradient descent towards a fixed target,
  its gradient averaged across every rank by one gloo all-reduce per update (``dist.all_reduce``:
  what DDP does), so a lost or stopped rank stops every rank as in training;
- the per-update steps of ``worker.train``'s extensions in their order: the chaos pace
  (``worker.pace``), an injected crash (``worker.crash``), rank 0's ledger events
  (``worker.ledger_hooks.recorder``: ``first_update``, ``checkpoint``), the heartbeat
  (``worker.heartbeat``: stepped, the notice agreed, completed, back to training; stacks on
  SIGUSR1), save on notice (``worker.preemption``: the handler, the launcher's record, the
  all-reduced agreement, the stop marker written by rank 0 after the save is durable);
- checkpoints through the toolkit's save path (``worker.async_save.AsyncSaver``, whose writes are
  ``worker.checkpoints.atomic_save``), in the layout fairseq's checkpoints have
  (``model``, ``optimizer_history[-1]["num_updates"]``), so that task 0's
  ``checkpoints.choose_resume`` verifies and resumes them as any other; rank 0 loads the resume
  point and broadcasts it (fairseq's default: one read per start, not one per rank);
- fairseq's log lines where the toolkit reads them (``runs.logparse``): a ``train_inner`` JSON
  line every ``--log-interval`` updates, ``Loaded checkpoint``, ``Saved checkpoint``, ``saved on
  notice``, ``Stopping training``; a crash report (``worker.crash.report``) when it dies.

Its memory is measured in ``benchmarks/scale.py`` (PSS per process: the launcher, the torchrun
agent and the rank), and ``--hang-*`` floors for a hollow run are sized there.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import LauncherBell, StopMarker, WorkerEnv, rank_of, write_stop
from hpc_train.worker import async_save, checkpoints, crash, ledger_hooks, pace, preemption
from hpc_train.worker.heartbeat import Heartbeat
from hpc_train.worker.train import heartbeat_of, log_to_file, save_dir_of, stop_marker

STATE_SIZE = 4096  # floats in the stand-in state (16 KiB): small, real, checkpointed
# The stand-in's compute per update: a sleep, as a GPU's work costs the host's CPU next to
# nothing; without it 64 hollow ranks on 2 cores would spin through all-reduces and starve the
# launchers whose behaviour is being measured. ``chaos JOB pace`` may ask for more.
COMPUTE_S = 0.25
LR = 0.1
NOISE = 0.01
SAY = "HOLLOW RANK: a stand-in for the model (submit --hollow); no training figure comes from it"
logger = logging.getLogger("hpc_train.worker.hollow")
metrics_log = logging.getLogger("train_inner")  # the tag logparse reads a log interval by


def arguments(argv: list[str]) -> argparse.Namespace:
    """The few fairseq arguments a hollow rank reads (the launcher passes all of them)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--save-dir")
    p.add_argument("--max-update", type=int, required=True)
    p.add_argument("--save-interval-updates", type=int, default=0)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--continue-once")
    p.add_argument("--seed", type=int, default=1)
    known, _ = p.parse_known_args(argv)
    return known


class State:
    """The stand-in model: ``w`` trained towards ``target`` (loss: the squared distance)."""

    def __init__(self, seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.target = torch.randn(STATE_SIZE, generator=gen)
        self.w = torch.zeros(STATE_SIZE)
        self.update = 0

    def loss(self) -> float:
        return float(((self.w - self.target) ** 2).mean())

    def checkpoint(self) -> dict[str, Any]:
        """fairseq's layout (``model``, ``optimizer_history``), what choose_resume verifies."""
        history = [{"num_updates": self.update, "stand_in": "hpc_train.worker.hollow"}]
        return {"model": {"w": self.w.clone()}, "optimizer_history": history,
                "extra_state": {"hollow": True}, "args": None}  # fmt: skip

    def step(self, rank: int, world: int) -> float:
        """One update: a noisy gradient on each rank (at least ``COMPUTE_S``), averaged by one
        all-reduce; the seconds of this rank's own compute (the all-reduce excluded)."""
        import torch
        import torch.distributed as dist

        began = time.monotonic()
        gen = torch.Generator().manual_seed(self.update * 100_003 + rank)
        grad = (self.w - self.target) + NOISE * torch.randn(STATE_SIZE, generator=gen)
        time.sleep(max(0.0, COMPUTE_S - (time.monotonic() - began)))
        computed = time.monotonic() - began
        if world > 1:
            dist.all_reduce(grad)
            grad /= world
        self.w -= LR * grad
        self.update += 1
        return computed


def resume(state: State, run: RunDir, continue_from: str | None) -> None:
    """Rank 0 loads the resume point (``checkpoint_last.pt``, or the interval checkpoint task 0
    chose, ``--continue-once``) and every rank gets it by one broadcast."""
    import torch
    import torch.distributed as dist

    path = Path(continue_from) if continue_from else run.checkpoint_last
    found = torch.zeros(1, dtype=torch.int64)
    if rank_of(os.environ) == 0 and path.exists():
        saved = checkpoints.load(path)
        state.w.copy_(saved["model"]["w"])
        found[0] = checkpoints.num_updates(saved)
        logger.info(f"Loaded checkpoint {path} (epoch 1 @ {int(found[0])} updates)")
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(found, 0)
        dist.broadcast(state.w, 0)
    state.update = int(found[0])


class HollowSaves:
    """Rank 0's checkpoints through ``AsyncSaver`` (one in flight; ``checkpoints.atomic_save``),
    each recorded in the ledger once durable (``ledger_hooks.recorder``)."""

    def __init__(self, run: RunDir, note: Any) -> None:
        self.run, self.note = run, note
        self.saver = async_save.AsyncSaver(run=run)

    def save(self, state: State, notice: bool) -> None:
        began = time.monotonic()
        path, update = self.run.checkpoint_last, state.update
        snapshot_s = self.saver.save(state.checkpoint(), str(path), direct=True)
        stall = time.monotonic() - began

        def record() -> None:
            last = self.saver.last
            logger.info(f"Saved checkpoint {path} (epoch 1 @ {update} updates, score None) "
                        f"(writing took {last.write_s if last else 0:.3f} seconds)")  # fmt: skip
            if self.note is not None:
                timing = {"snapshot_s": round(snapshot_s, 3)}
                if last is not None:
                    timing["write_s"] = round(last.write_s, 3)
                self.note(Kind.CHECKPOINT, update=update, seconds=round(stall, 3),
                          bytes=path.stat().st_size, notice=notice, **timing)  # fmt: skip

        self.saver.after_writes(record, "the ledger's checkpoint event", critical=False)

    def flush(self) -> None:
        self.saver.flush()


def save_and_stop(state: State, saves: HollowSaves | None, marker: Path, rank: int,
                  bell: LauncherBell | None = None) -> None:  # fmt: skip
    """The agreed notice: rank 0 saves (durable), writes the stop marker (``bell`` rung); a
    barrier."""
    import torch.distributed as dist

    began = time.monotonic()
    logger.info(f"notice: saving at update {state.update} and stopping")
    if saves is not None:
        saves.save(state, notice=True)
        saves.flush()
        logger.info(f"saved on notice at update {state.update} in "
                    f"{time.monotonic() - began:.1f} s")  # fmt: skip
    if rank == 0:
        write_stop(marker, StopMarker(state.update, preemption.NOTICE_SIGNAL.name), bell)
    if dist.is_initialized():
        dist.barrier()


def log_interval(state: State, began: float, updates: int) -> None:
    """fairseq's ``train_inner`` JSON line (rank 0), with a ``stand_in`` mark."""
    import json

    ups = updates / max(time.monotonic() - began, 1e-6)
    line = {"epoch": 1, "update": state.update, "loss": f"{state.loss():.4f}",
            "ups": f"{ups:.2f}", "num_updates": str(state.update), "stand_in": "hollow"}  # fmt: skip
    metrics_log.info(json.dumps(line))


def train(args: argparse.Namespace, worker: WorkerEnv, run: RunDir, rank: int) -> None:
    """The updates from the resume point to ``--max-update`` (or a notice); a crash reported."""
    state = State(args.seed)
    resume(state, run, args.continue_once)
    try:
        updates(args, worker, run, rank, state)
    except BaseException as err:  # the launcher reads why (and at which update) this rank died
        crash.report(run, worker.start, rank, err, state.update)
        raise


def updates(args: argparse.Namespace, worker: WorkerEnv, run: RunDir, rank: int,
            state: State) -> None:  # fmt: skip
    """Each update as ``worker.train``'s extensions order it (see the module docstring)."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    beat: Heartbeat | None = heartbeat_of(worker, rank)
    note = ledger_hooks.recorder(run, worker.start, rank)
    saves = HollowSaves(run, note) if rank == 0 else None
    marker, paced, first = stop_marker(worker, run), pace.Pace(run), True
    since, logged_at = time.monotonic(), state.update
    while state.update < args.max_update:
        computed = state.step(rank, world)
        if beat is not None:
            beat.compute(computed)
        crash.crash_if_asked(run, state.update, rank)
        paced()
        done = state.update >= args.max_update
        if rank == 0 and (state.update - logged_at >= args.log_interval or done):
            log_interval(state, since, state.update - logged_at)  # as fairseq: after the step
            since, logged_at = time.monotonic(), state.update
        if first and note is not None:
            note(Kind.FIRST_UPDATE, update=state.update)
        first = False
        if beat is not None:
            beat.stepped(state.update)
        preemption.notice_recorded(worker.notice_pending)
        notice, _ = preemption.agree("cpu")
        if beat is not None:
            beat.completed(state.update)
        if notice:
            save_and_stop(state, saves, marker, rank, worker.bell)
            return
        every = args.save_interval_updates
        if saves is not None and (done or (every > 0 and state.update % every == 0)):
            saves.save(state, notice=False)
        if beat is not None:
            beat.training(stopping=done)
    logger.info(f"Stopping training due to num_updates: {state.update} >= "
                f"max_update: {args.max_update}")  # fmt: skip
    if saves is not None:
        saves.flush()


def main(argv: list[str] | None = None) -> None:
    """torchrun's entry for a hollow rank (``python -m hpc_train.worker.hollow ARGS``)."""
    preemption.install_handler()  # first; a notice before it: the launcher's record
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO, stream=sys.stdout)  # fmt: skip
    given = sys.argv[1:] if argv is None else argv
    worker, rank = WorkerEnv.from_env(os.environ), rank_of(os.environ)
    args = arguments(given)
    run = RunDir(save_dir_of(worker, given))
    if rank == 0:
        log_to_file(run.train_log)
    else:
        logging.getLogger().setLevel(logging.WARNING)
    if rank == 0:
        logger.warning(SAY)
    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    try:
        train(args, worker, run, rank)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
