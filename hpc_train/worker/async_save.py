"""Async checkpoint saves: snapshot to host memory at the save point, write in the background.

At a save point rank 0 waits for the previous save to be durable, copies the training state to
host memory (a true copy: on a CPU rank ``utils.move_to_cpu`` would return the very tensors the
next update changes in place; on a GPU rank the copy goes to pinned buffers reused from save to
save), then returns to training. One writer thread writes the snapshot with the atomic protocol
(``checkpoints.atomic_save``: temp, fsync, rename, dir fsync) and then, in the same order, makes
the other names fairseq gives the save (``checkpoint_last.pt`` …: ``PathManager.copy`` calls on a
file still being written are deferred behind it). The training stall per save is the wait for the
previous save plus the snapshot.

- One save in flight: the next save, a notice-save (``flush`` before the stop marker) and the end
  of training (``flush``) wait for it.
- A failed background write is logged when it happens and raised by the next save or flush
  (``CheckpointWriteError``); what was queued behind it (its copies) is skipped.
- fairseq's own ``--write-checkpoints-asynchronously`` writes tensors that training keeps
  changing and skips the copy to ``checkpoint_last.pt``; it is not used.
- ``--sync-save`` (``contract.WorkerEnv.sync_save``) keeps fairseq's synchronous save.

Tiered saves (``--local-save-dir``): with a local tier the writer thread hands a periodic save
to ``hpc_train.worker.local_tier`` (written to node-local disk, then copied to the save dir, older local
files pruned; a failing local disk falls back to direct saves); "durable" still means the save
dir's copy, and a save on notice (``direct``) skips the tier. See that module for the trade-off.

Rehearsal of a slow FSx (``chaos JOB slow-save --seconds S``: ``contract.ask_slow_saves``): every
background write of that run first sleeps S seconds (counted in its write seconds, as a slow
file system's would be), so a preemption can be made to land while a write is in flight. The
writer looks for ``RunDir.chaos_slow_save`` once per save: one stat() when it is absent.

Nothing here imports torch or fairseq at module level.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.worker import checkpoints, local_tier

logger = logging.getLogger("hpc_train.worker.async_save")

# Set to "1" by the launcher in each worker's environment for ``--sync-save``.


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed; raised by the next save or flush."""


@dataclass(frozen=True)
class SaveStats:
    """One async save: the file, its bytes, the snapshot (training stall) and write seconds;
    tiered: ``write_s`` is the local write and ``copy_s`` the copy to the save dir."""

    path: str
    bytes: int
    snapshot_s: float
    write_s: float
    copy_s: float | None = None


# --- the snapshot -----------------------------------------------------------------------------


class HostPool:
    """Host buffers for the snapshot, kept between saves: pinned for GPU storages (pinning is
    slow), plain pages already faulted in for CPU ones (a fresh copy of a GB costs page faults).

    Only reused once the previous save is durable (``AsyncSaver.save`` waits first), so a buffer
    is never overwritten while a write reads it."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}

    def storage(self, key: tuple[Any, ...], nbytes: int, pinned: bool) -> Any:
        import torch

        found = self._buffers.get(key)
        if found is None or found[0].nbytes() != nbytes or found[1] != pinned:
            storage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
            found = self._buffers[key] = (storage, pinned)
        return found[0]


def _copy_tensor(t: Any, memo: dict[Any, Any], pool: HostPool | None, key: tuple[Any, ...]) -> Any:
    """A host copy of ``t``; tensors sharing a storage (tied weights) share the copy, as they
    would in ``torch.save``. The memo is keyed by the storages of ``state`` itself, which stay
    alive during the snapshot (never by a temporary's address: a freed one is reused)."""
    import torch

    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        # what fairseq's move_to_cpu does: a new fp32 tensor, shared by none
        converted = t.to(torch.float32)
        if not converted.is_cuda:
            return converted
        if pool is None:
            return converted.cpu()
        buffer = pool.storage(key, converted.untyped_storage().nbytes(), pinned=True)
        buffer.copy_(converted.untyped_storage(), non_blocking=True)
        return _view(buffer, converted)
    storage = t.untyped_storage()
    memo_key = (storage.data_ptr(), t.device)
    found = memo.get(memo_key)
    if found is None:
        if pool is not None:
            found = pool.storage(key, storage.nbytes(), pinned=t.is_cuda)
            found.copy_(storage, non_blocking=t.is_cuda)
        elif t.is_cuda:
            found = storage.cpu()
        else:
            found = storage.clone()
        memo[memo_key] = found
    return _view(found, t)


def _view(storage: Any, like: Any) -> Any:
    """A CPU tensor on ``storage`` with ``like``'s dtype, offset, shape and strides."""
    import torch

    out = torch.empty(0, dtype=like.dtype)
    out.set_(storage, like.storage_offset(), like.size(), like.stride())
    return out


def snapshot(state: Any, pool: HostPool | None = None) -> Any:
    """A copy of ``state`` in host memory that shares nothing mutable with it.

    Tensors as fairseq's ``move_to_cpu`` leaves them (fp16/bf16 → fp32, on the CPU) but always
    copied; containers rebuilt; any other object deep-copied. With a ``pool``, storages go to its
    buffers (GPU ones non-blocking to pinned memory, one synchronize at the end)."""
    import torch

    memo: dict[Any, Any] = {}

    def walk(value: Any, key: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return _copy_tensor(value, memo, pool, key)
        if isinstance(value, dict):
            out = copy.copy(value)  # keeps a subclass and its state (OrderedDict, defaultdict)
            out.clear()
            for k, v in value.items():
                out[k] = walk(v, (*key, k))
            return out
        if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
            return type(value)(walk(v, (*key, i)) for i, v in enumerate(value))
        return copy.deepcopy(value)

    result = walk(state, ())
    if pool is not None and torch.cuda.is_available():
        torch.cuda.synchronize()  # the pinned copies have landed
    return result


# --- the writer -------------------------------------------------------------------------------


# The writer thread's nice value. On a node whose cores the training keeps busy (a CPU rank) a
# write at the same priority halves the training's pace while it lasts (measured on 2 cores);
# niced, it takes the cycles training leaves idle, and the whole CPU whenever training waits for
# it (the next save, a notice-save, the end). A GPU node's host cores are mostly idle anyway.
WRITER_NICE = 10


def _lower_priority() -> None:
    try:  # Linux: a thread's nice value is its own (setpriority on its thread id)
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, max(WRITER_NICE, os.getpriority(os.PRIO_PROCESS, me)))
    except (AttributeError, OSError) as err:
        logger.warning(f"checkpoint writer keeps its priority ({err})")


def _default_write(state: Any, path: str) -> None:
    checkpoints.atomic_save(state, path)


class AsyncSaver:
    """One background writer thread; at most one save in flight (see the module docstring)."""

    def __init__(
        self,
        write: Callable[[Any, str], None] = _default_write,
        local_dir: Path | None = None,
        run: RunDir | None = None,
    ) -> None:
        self._write = write
        self.local_dir = local_dir  # the local tier (tiered saves); None: straight to the save dir
        self.run = run  # whose ``chaos JOB slow-save`` applies (None: not looked for)
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint-writer", initializer=_lower_priority
        )
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._writing: set[str] = set()  # absolute paths queued or being written
        self._pool = HostPool()
        self.last: SaveStats | None = None  # the most recent save that became durable

    # what runs on the writer thread
    def _failed(self, what: str) -> bool:
        """Has a write failed already (then ``what`` is skipped, and says so)?"""
        if self._error is not None:
            logger.error(f"skipped {what}: an earlier background checkpoint write failed")
        return self._error is not None

    def _run(self, task: Callable[[], None], what: str, critical: bool) -> None:
        if self._failed(what):
            return
        try:
            task()
        except BaseException as err:
            if not critical:
                logger.warning(f"{what} failed after a checkpoint save: {err}")
                return
            logger.exception(f"background checkpoint write failed: {what}")
            self._error = err

    def _enqueue(self, task: Callable[[], None], what: str, critical: bool = True) -> None:
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(self._executor.submit(self._run, task, what, critical))

    def busy(self) -> bool:
        with self._lock:
            return any(not f.done() for f in self._futures)

    def writing(self, path: str | os.PathLike[str]) -> bool:
        """Is ``path`` queued or being written (not yet durable)?"""
        return os.path.abspath(path) in self._writing

    def pending_in(self, directory: str | os.PathLike[str]) -> list[str]:
        """Names of files queued or being written in ``directory``."""
        here = os.path.abspath(directory)
        return [os.path.basename(p) for p in set(self._writing) if os.path.dirname(p) == here]

    def flush(self) -> None:
        """Wait until every queued write and copy is done; CheckpointWriteError if one failed."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.result()
        if self._error is not None:
            err = self._error
            raise CheckpointWriteError(
                f"a background checkpoint write failed: {type(err).__name__}: {err}"
            ) from err

    def save(
        self,
        state: Any,
        path: str,
        extra_state: Mapping[str, Any] | None = None,
        direct: bool = False,
    ) -> float:
        """Wait for the previous save, snapshot ``state`` (plus ``extra_state`` into its
        ``extra_state``), queue the write; returns the snapshot seconds. ``direct``: straight
        to ``path`` even with a local tier (the save on notice)."""
        self.flush()
        began = time.monotonic()
        snap = snapshot(state, self._pool)
        if extra_state:
            snap.setdefault("extra_state", {}).update(snapshot(dict(extra_state)))
        snapshot_s = time.monotonic() - began
        target = os.path.abspath(path)
        self._writing.add(target)
        held = [snap]  # dropped once written (locally or not): its memory goes back sooner
        del snap

        def write() -> None:
            started = time.monotonic()
            delay = contract.slow_save_s(self.run)
            if delay:  # the rehearsal of a slow FSx
                logger.info(f"chaos slow-save: writing {target} after {delay:g} s")
                time.sleep(delay)
            local = None if direct or self.local_dir is None else self.local_dir / Path(target).name
            tiered = None
            if local is not None:
                tiered = local_tier.write_then_copy(self._write, held, local, Path(target))
                if tiered is None:  # the local write failed: direct saves from now on
                    self.local_dir = None
            copy_s: float | None
            if tiered is not None:
                write_s, copy_s = tiered[0] + delay, tiered[1]
            else:
                self._write(held.pop(), target)
                copy_s, write_s = None, time.monotonic() - started
            self._writing.discard(
                target
            )  # a failed write stays "writing": its copies wait, skipped
            size = Path(target).stat().st_size
            self.last = SaveStats(target, size, snapshot_s, write_s, copy_s)
            if copy_s is None:
                logger.info(f"wrote {target} in the background in {write_s:.2f} s")
            else:
                logger.info(
                    f"wrote {local} in {write_s:.2f} s, copied it to {target} in {copy_s:.2f} s"
                )

        self._enqueue(write, f"write {target}")
        return snapshot_s

    def after_writes(self, task: Callable[[], None], what: str, critical: bool = True) -> None:
        """Run ``task`` behind the queued writes (on the writer thread), or now when idle;
        never behind a write that failed (idle because it has already failed, too)."""
        if self.busy():
            self._enqueue(task, what, critical)
        elif self._failed(what):
            pass
        elif critical:
            task()
        else:
            self._run(task, what, critical)


_saver: AsyncSaver | None = None


def active() -> AsyncSaver | None:
    """The saver ``install`` put in place in this process, if any."""
    return _saver


def flush() -> None:
    """Make every checkpoint save of this process durable (no-op with synchronous saves)."""
    if _saver is not None:
        _saver.flush()


def when_durable(task: Callable[[], None], what: str = "a record") -> None:
    """Run ``task`` once the queued saves are durable (now, with synchronous saves); its
    failure is logged, never fatal."""
    if _saver is None:
        task()
    else:
        _saver.after_writes(task, what, critical=False)


def install(
    run: RunDir | None = None,
    sync: bool = False,
    local_dir: Path | None = None,
    direct: Callable[[], bool] = lambda: False,
) -> AsyncSaver | None:
    """Route fairseq's Trainer.save_checkpoint through an AsyncSaver, unless ``sync``
    (``--sync-save``); with ``local_dir`` (a usable local tier), through node-local disk first.

    ``run``: the run whose ``chaos JOB slow-save`` the writer obeys. ``direct``: whether the save
    being made skips the local tier (``preemption.saving_on_notice``: the notice's save). Call
    after ``checkpoints.install_atomic_writes`` (the deferred copies are its atomic ones)."""
    global _saver
    if sync:
        logger.info("synchronous checkpoint saves (--sync-save)")
        return None
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    saver = AsyncSaver(local_dir=local_dir, run=run)
    copy_now = checkpoint_utils.PathManager.copy
    ls_now = checkpoint_utils.PathManager.ls

    def save_checkpoint(self: Any, filename: str, extra_state: dict[str, Any]) -> str | None:
        if not self.should_save_checkpoint_on_current_rank:
            return None
        snapshot_s = saver.save(self.state_dict(), filename, extra_state, direct=direct())
        logger.info(f"snapshot for {filename} in {snapshot_s:.2f} s; writing in the background")
        return os.path.abspath(filename)

    def deferred_copy(src: str, dst: str, overwrite: bool = False) -> bool:
        if saver.writing(src):  # fairseq's copy to checkpoint_last.pt etc. of the file just saved
            saver.after_writes(lambda: copy_now(src, dst, overwrite), f"copy to {dst}")
            return True
        return bool(copy_now(src, dst, overwrite))

    def listing(path: str) -> list[str]:
        # fairseq prunes old interval checkpoints from a listing right after the save: count
        # the one being written, or one checkpoint too many is kept
        names = list(ls_now(path))
        return names + [n for n in saver.pending_in(path) if n not in names]

    Trainer.save_checkpoint = save_checkpoint
    checkpoint_utils.PathManager.copy = staticmethod(deferred_copy)
    checkpoint_utils.PathManager.ls = staticmethod(listing)
    _saver = saver
    return saver
