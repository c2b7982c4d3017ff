"""Stop the rank's data-loader processes at once when training is over (issue 29).

fairseq's loaders are torch DataLoaders with ``persistent_workers`` and ``pin_memory``. With both
(pin memory is on only where there is a GPU), torch registers an exit hook that shuts each
loader down the slow way: it joins every worker with a 5 s timeout, one after the other, and
the workers of a loader stopped mid-epoch do not leave in time (pytorch/pytorch#81794, open).
Measured on an H100 (docs/gpu.md): 42 s from "done training" to exit with 4 loader processes per
loader (a train and a valid loader: 2 x 4 x 5 s), 12 s with 1, under 1 s with none. A rank
stopped by a notice held its nodes that long after its checkpoint was written.

``stop_all`` runs the moment fairseq's step says training is over (``install``): every live
loader's workers are sent SIGTERM (torch's worker handler exits at once on its parent's SIGTERM),
waited for against one shared deadline, killed if still there, and the loader is marked shut
down, so torch's own hook has nothing left to join. Not later: once fairseq's ``main`` returns,
its loaders are garbage in reference cycles, and a garbage collection (any allocation may start
one, e.g. while the last background save is flushed) shuts them down through torch's
``__del__``: the same slow joins (seen in CI, 2026-11-27: a 20 s flush, and 1 of 2 loaders gone
before ``stop_all`` could stop it). The worker calls ``stop_all`` once more after the flush, for
loaders of a run that ended otherwise (its last epoch).
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("hpc_train.worker.loaders")

DEADLINE_S = 2.0  # all loader processes of a rank together, before SIGKILL


@dataclass(frozen=True)
class Stopped:
    loaders: int
    processes: int
    killed: int  # still alive at the deadline: SIGKILLed
    seconds: float


def live_loaders() -> list[Any]:
    """Every multi-process DataLoader iterator of this process not yet shut down (fairseq keeps
    them in its epoch iterators and its tasks' caches; a loader stopped mid-epoch is also held
    by fairseq's BufferedIterator thread)."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    # type(), not isinstance(): the latter reads __class__, which some lazy module proxies
    # answer with a deprecation warning
    return [
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), _MultiProcessingDataLoaderIter) and not obj._shutdown
    ]


def _release(loader: Any) -> list[Any]:
    """Mark ``loader`` shut down for torch and tell its threads and workers to stop; returns
    its worker processes (signalled, not yet waited for)."""
    from torch.utils.data import _utils

    loader._shutdown = True  # torch's __del__ and exit hook: nothing left to do
    if loader._worker_pids_set:  # before any worker dies: torch's SIGCHLD check must not raise
        _utils.signal_handling._remove_worker_pids(id(loader))
        loader._worker_pids_set = False
    if hasattr(loader, "_pin_memory_thread"):
        loader._pin_memory_thread_done_event.set()  # a daemon; leaves at its next poll
    loader._workers_done_event.set()
    workers = [w for w in loader._workers if w.is_alive()]
    for w in workers:
        w.terminate()
    for q in loader._index_queues:  # their readers are gone: never wait on their feeders
        q.cancel_join_thread()
        q.close()
    return workers


def stop_all(deadline_s: float = DEADLINE_S) -> Stopped:
    """Stop every data-loader process of this rank: SIGTERM, one shared wait of at most
    ``deadline_s``, SIGKILL for what is left. Run it only once training is over: the loaders'
    prefetched batches are dropped (the checkpoint holds the data position, not the batches)."""
    began = time.monotonic()
    loaders = live_loaders()
    workers = [w for loader in loaders for w in _release(loader)]
    end = began + deadline_s
    for w in workers:
        w.join(timeout=max(0.0, end - time.monotonic()))
    left = [w for w in workers if w.is_alive()]
    for w in left:
        w.kill()
        w.join(timeout=1.0)
    stopped = Stopped(len(loaders), len(workers), len(left), time.monotonic() - began)
    if workers:
        logger.info(
            f"stopped {stopped.processes} data-loader process(es) of {stopped.loaders} "
            f"loader(s) in {stopped.seconds:.2f} s ({stopped.killed} killed)"
        )
    return stopped


def install() -> None:
    """Stop the loaders once fairseq's validate-and-save step says stop (``max_update``, a save on
    notice, ...): after it nothing draws a batch, and the loaders are still reachable from
    fairseq's ``main``, so ``stop_all`` finds every one of them."""
    import fairseq_cli.train as fairseq_train

    step = fairseq_train.validate_and_save

    def validate_and_save(*args: Any, **kwargs: Any) -> Any:
        valid_losses, should_stop = step(*args, **kwargs)
        if should_stop:
            stop_all()
        return valid_losses, should_stop

    fairseq_train.validate_and_save = validate_and_save
