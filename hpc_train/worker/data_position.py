"""Sample-exact resume at any width, and the per-epoch audit of the samples each rank consumed.

fairseq's ``EpochBatchIterator`` shuffles the epoch's batch plan (``frozen_batches``, seeded by
seed + epoch, the same whatever the width) and deals it round-robin to the ranks
(``ShardedIterator``: rank ``s`` of ``W`` takes batches ``s, s + W, s + 2W, …``). It saves
``iterations_in_epoch``, the batches *one* shard consumed, and a resume skips that many batches of
each shard of the *new* world. At the same width that is exact; at another width it is not: the
ranks step together, so after ``k`` batches each the world has consumed exactly the first
``k x W`` batches of the plan, and the new world must skip ``k x W / W'`` batches per shard, not
``k`` (fewer ranks: samples trained twice; more: samples never seen in that epoch).

Here (``install``):
- each save records the saving world next to fairseq's position (``KEY`` in
  ``extra_state["train_iterator"]``): its shards and a fingerprint of the epoch's batch plan;
- a load at another width converts the offset (``convert``): ``k x W`` global batches, dealt
  again over ``W'`` shards. With the global batch kept by ``--update-freq`` and the same batch per
  device, ``W x update_freq`` batches make one update at every width, and saves happen between
  updates, so ``k x W`` is a multiple of ``W'``: exact. Otherwise (a changed batch per device
  changes the plan itself; grouped shuffling deals by width; a global batch not a multiple of
  the new world) the resume is *not* sample-exact and says so by name in the log, at WARNING;
- the same width keeps fairseq's offset untouched: bit-for-bit what it was.

The audit (``--audit-samples``, ``WorkerEnv.audit_samples``): every rank appends, after each of
its training steps, the epoch, the global position reached and the sample ids it trained to
``RunDir.audit_file`` (``contract.AuditLine``); a first line says where the start resumed.
``hpc_train.runs.audit`` reads them back. See docs/data-position.md.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_core.rundir import RunDir, atomic_write
from hpc_train.contract import AuditLine

logger = logging.getLogger(__name__)

KEY = "hpc_train_position"  # our entry in fairseq's iterator state (extra_state.train_iterator)
FINGERPRINT_BATCHES = 16  # batches of the plan hashed into its fingerprint (cheap at any size)


# --- pure: the conversion ------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochPlan:
    """The world that consumed an epoch: how its batches were dealt."""

    num_shards: int  # the ranks (fairseq's shards)
    epoch_batches: int  # batches in the epoch's plan
    fingerprint: int  # crc32 of the plan's first batches: the batch size and the data
    grouped: bool = False  # fairseq's --grouped-shuffling: the order depends on num_shards

    @classmethod
    def from_state(cls, state: Any) -> EpochPlan | None:
        """The plan a save recorded; None for a checkpoint saved without this module."""
        if not isinstance(state, dict):
            return None
        try:
            return cls(**state)
        except TypeError:
            return None


@dataclass(frozen=True)
class EpochResume:
    """Where each shard of the new world starts in the epoch."""

    offset: int  # batches each new shard skips (fairseq's iterations_in_epoch)
    exact: bool  # every sample of the epoch trained exactly once
    why: str  # one line for the log
    blank_below: int = 0  # shards below this one find their next batch trained: an empty one


def fingerprint(batches: Sequence[Sequence[int]]) -> int:
    """crc32 of the first ``FINGERPRINT_BATCHES`` batches' sample ids (their sizes included)."""
    crc = 0
    for batch in batches[:FINGERPRINT_BATCHES]:
        ids = [int(i) for i in batch]
        crc = zlib.crc32(f"{len(ids)}:{ids}".encode(), crc)
    return crc


def convert(saved: EpochPlan, iterations: int, now: EpochPlan) -> EpochResume:
    """The offset for ``now``'s shards of a position saved as ``iterations`` batches per shard of
    ``saved``'s: exact when the epoch's batch plan is the same (the same batch per device).

    ``C = iterations x saved.num_shards`` batches of the plan were consumed: exactly its first
    ``C`` (the shards stepped together). Shard ``s`` of ``W'`` holds batches ``s, s + W', …``;
    skipping ``C // W'`` each leaves the first ``C % W'`` shards one batch already trained, which
    they take as an empty batch (fairseq's dummy, no gradient) so that all stay in step."""
    if saved.num_shards == now.num_shards:
        if saved.fingerprint != now.fingerprint or saved.epoch_batches != now.epoch_batches:
            return EpochResume(iterations, False, f"same width, but {_plan_changed(saved, now)}")
        return EpochResume(iterations, True, "same width: fairseq's offset as saved")
    consumed = iterations * saved.num_shards
    if saved.fingerprint != now.fingerprint or saved.epoch_batches != now.epoch_batches:
        offset = consumed * now.epoch_batches // (saved.epoch_batches * now.num_shards)
        return EpochResume(
            offset, False, f"{_plan_changed(saved, now)}: resumed at the same fraction of the epoch"
        )
    if saved.grouped or now.grouped:
        return EpochResume(
            consumed // now.num_shards,
            False,
            "grouped shuffling orders the epoch by width: the position is not exact",
        )
    offset, left = divmod(consumed, now.num_shards)
    said = (
        f"{saved.num_shards} shards x {iterations} batches = {consumed} batches of the epoch "
        f"consumed -> {now.num_shards} shards skip {offset} each"
    )
    if left:
        said += f"; the first {left} shard(s) start with an empty batch (their next was trained)"
    return EpochResume(offset, True, said, blank_below=left)


def _plan_changed(saved: EpochPlan, now: EpochPlan) -> str:
    return (
        f"the epoch's batch plan changed ({saved.epoch_batches} -> {now.epoch_batches} batches; "
        "batch per device or data changed): samples may repeat or be missed in this epoch"
    )


# --- pure: the audit's records -------------------------------------------------------------------


def audit_label(start: tuple[str, int] | None, world: int, resumed_update: int) -> str:
    """The directory of one start's audit files: the launcher's start (``<job>-<restart>``), or
    for ranks started by hand the width and the update resumed from."""
    if start is not None:
        return f"{start[0]}-{start[1]}"
    return f"local-w{world}-u{resumed_update}"


def header(epoch: int, update: int, position: int, world: int) -> AuditLine:
    """A start's first line: it resumed from the save at ``update`` (``position`` of ``epoch``)."""
    return AuditLine(epoch, update, position, time.time(), resumed=True, world=world)


def step_line(epoch: int, update: int, position: int, ids: Sequence[int]) -> AuditLine:
    """After a step: the update reached, the epoch's global batches consumed, the ids trained."""
    return AuditLine(epoch, update, position, time.time(), ids=list(ids))


def end_line(epoch: int, update: int, position: int) -> AuditLine:
    return AuditLine(epoch, update, position, time.time(), end=True)


# --- fairseq ---------------------------------------------------------------------------------------


def plan_of(itr: Any) -> EpochPlan:
    """The plan of a fairseq ``EpochBatchIterator`` for its current epoch."""
    batches = itr.frozen_batches
    return EpochPlan(
        num_shards=int(itr.num_shards),
        epoch_batches=len(batches),
        fingerprint=fingerprint(batches),
        grouped=bool(getattr(itr, "grouped_shuffling", False)),
    )


def install_conversion() -> None:
    """Record the saving world in each iterator state; convert the offset on a load."""
    from fairseq.data import iterators

    cls = iterators.EpochBatchIterator
    state_dict = getattr(cls.state_dict, "__wrapped__", cls.state_dict)
    load_state_dict = getattr(cls.load_state_dict, "__wrapped__", cls.load_state_dict)

    def recorded(self: Any) -> dict[str, Any]:
        state: dict[str, Any] = state_dict(self)
        if type(self) is cls:  # subclasses (multi-corpus) deal batches their own way
            state[KEY] = asdict(plan_of(self))
        return state

    def converted(self: Any, state: dict[str, Any]) -> None:
        saved = EpochPlan.from_state(state.get(KEY))
        iterations = int(state.get("iterations_in_epoch", 0))
        if iterations > 0 and type(self) is cls:
            if saved is None:
                logger.warning(
                    "data position: the checkpoint does not say its width; fairseq's per-shard "
                    "offset (%d) as is: not sample-exact if the width changed",
                    iterations,
                )
            else:
                resume = convert(saved, iterations, plan_of(self))
                log = logger.info if resume.exact else logger.warning
                log("data position (epoch %s): %s", state.get("epoch"), resume.why)
                state = {**state, "iterations_in_epoch": resume.offset}
                if self.shard_id < resume.blank_below:
                    blank_once(self, resume.offset)
        load_state_dict(self, state)

    recorded.__wrapped__ = state_dict  # type: ignore[attr-defined]
    converted.__wrapped__ = load_state_dict  # type: ignore[attr-defined]
    cls.state_dict = recorded
    cls.load_state_dict = converted


def blank_once(itr: Any, index: int) -> None:
    """The next epoch plan ``itr`` deals this shard (the one its load builds) has batch ``index``
    emptied; later epochs' plans (the data loader keeps the function) are fairseq's own."""
    ordered = itr.ordered_batches
    pending = [True]

    def blanked(*args: Any, **kwargs: Any) -> Any:
        batches = ordered(*args, **kwargs)
        if pending:
            pending.clear()
            batches[index] = []
        return batches

    itr.ordered_batches = blanked
    if getattr(itr, "dataloader", None) is not None:  # a reused loader re-plans with its own
        itr.epoch_batch_sampler.ordered_batches = blanked


class AuditWriter:
    """One rank's audit file: a header per start, a line per training step, an end per epoch."""

    def __init__(self, run: RunDir, start: tuple[str, int] | None, rank: int) -> None:
        self.run, self.start, self.rank = run, start, rank
        self.path: Path | None = None
        self.itr: Any = None  # fairseq's training EpochBatchIterator, set by each train() call
        self.planned: set[int] = set()  # epochs whose plan this rank wrote

    def position(self) -> int:
        return int(self.itr.iterations_in_epoch) * int(self.itr.num_shards)

    def begin(self, itr: Any, update: int) -> None:
        """fairseq's train() is about to run an epoch of ``itr``, from ``update``."""
        self.itr = itr
        if self.path is None:  # this start's first epoch: where it resumed
            world = int(itr.num_shards)
            label = audit_label(self.start, world, update)
            self.path = self.run.audit_file(label, self.rank)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.append(header(itr.next_epoch_idx, update, self.position(), world))

    def step(self, samples: Sequence[Any], update: int) -> None:
        """After a training step: the ids of the (non-dummy) samples it trained."""
        if self.itr is None:
            return
        epoch = int(self.itr.epoch)
        if self.rank == 0 and epoch not in self.planned:
            self.planned.add(epoch)
            ids = sorted({int(i) for batch in self.itr.frozen_batches for i in batch})
            atomic_write(self.run.audit_plan(epoch), json.dumps(ids), durable=False)
        ids = [
            int(i)
            for sample in samples
            if isinstance(sample, dict) and "id" in sample
            for i in sample["id"].tolist()
        ]
        self.append(step_line(epoch, update, self.position(), ids))

    def end(self, update: int) -> None:
        """fairseq's train() returned: an end line if the epoch's batches are all consumed."""
        if self.itr is not None and self.itr.end_of_epoch():
            self.append(end_line(int(self.itr.epoch), update, self.position()))

    def append(self, line: AuditLine) -> None:
        assert self.path is not None
        with open(self.path, "a") as out:
            out.write(json.dumps(asdict(line)) + "\n")


def install_audit(run: RunDir, start: tuple[str, int] | None, rank: int) -> AuditWriter:
    """Write this rank's audit: fairseq's train() (one epoch) and Trainer.train_step wrapped."""
    import fairseq_cli.train as fairseq_train
    from fairseq.trainer import Trainer

    writer = AuditWriter(run, start, rank)
    train = fairseq_train.train
    train_step = Trainer.train_step

    def audited_train(cfg: Any, trainer: Any, task: Any, epoch_itr: Any) -> Any:
        writer.begin(epoch_itr, trainer.get_num_updates())
        result = train(cfg, trainer, task, epoch_itr)
        writer.end(trainer.get_num_updates())
        return result

    def audited_step(self: Any, samples: Any, *args: Any, **kwargs: Any) -> Any:
        out = train_step(self, samples, *args, **kwargs)
        writer.step(samples, self.get_num_updates())
        return out

    fairseq_train.train = audited_train
    Trainer.train_step = audited_step
    return writer


def install(run: RunDir, start: tuple[str, int] | None, rank: int, audit: bool) -> None:
    """Sample-exact resume at any width; with ``audit``, this rank's audit file as well."""
    install_conversion()
    if audit:
        install_audit(run, start, rank)
