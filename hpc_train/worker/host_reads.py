"""Count the rank's device-to-host reads (host syncs), by call site (issue 36).

A read of a tensor's value on the host (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``,
``.tolist()``, ``.numpy()``, ``.nonzero()``) makes the Python thread wait until the device has
computed it: on a GPU the queue of launched kernels drains, and the GPU idles while Python
launches the next ones. This module counts those reads while a ``Counter`` is active, by the
file and line that asked (the first frame outside torch), so that a profile can say how many a
training update makes and where.

Which reads count: on a GPU rank, reads of tensors that live on the GPU (a read of a CPU tensor
waits for nothing). On a CPU rank every tensor lives on the compute device, so every read inside
the counted region counts; that is the proxy this development machine can measure. What a GPU
run measures instead is ``torch.cuda.set_sync_debug_mode`` (``profile`` turns it on there too),
which sees the syncs torch itself makes in C++ (a ``nonzero`` inside an op, a blocking copy).
A read that code here makes on purpose on host data (a batch still in the loader's memory,
before its copy to the GPU) is made inside ``host_side()``, which this counter leaves out.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

# Reads counted on a CPU rank that a GPU rank does not make (fairseq-fixed 0.12.3.1's lines; a
# test checks each line's text): left out of ``gpu_path`` counts.
CPU_ONLY_SITES = {
    # `elif masked_tokens.device == torch.device("cpu"): if not masked_tokens.any():` - on a
    # GPU the criterion takes torch.where instead, without a read
    "fairseq/criterions/masked_lm.py:50": "if not masked_tokens.any():",
    # `torch.tensor(src_tokens.device.type == "xla") or ...`: a tensor made on the host
    "fairseq/models/transformer/transformer_encoder.py:206": 'torch.tensor(src_tokens.device.type == "xla")',
}
# torch.Tensor methods that return a value on the host
READS = ("item", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")
_TORCH_DIR = str(Path(torch.__file__).parent)
_ROOT = Path(__file__).resolve().parents[2]  # the repository (hpc_train/worker/host_reads.py)
_state = threading.local()


def gpu_path(sites: Mapping[str, float]) -> float:
    """The reads of ``sites`` (a CPU rank's count by site) that a GPU rank makes too."""
    return sum(n for site, n in sites.items() if site not in CPU_ONLY_SITES)


def site_of(frame: Any) -> str:
    """``file:line`` of the first caller outside torch (and outside this module)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != __file__:
            return f"{_short(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _short(path: str) -> str:
    """A site's file: after the last ``site-packages``, else relative to the repository."""
    parts = Path(path).parts
    if "site-packages" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("site-packages") :])
    return str(Path(path).relative_to(_ROOT)) if Path(path).is_relative_to(_ROOT) else path


class Counter:
    """Reads per call site while active (``with Counter() as c``); ``gpu_only``: count only
    reads of tensors not on the CPU (a GPU rank)."""

    def __init__(self, gpu_only: bool = False) -> None:
        self.gpu_only = gpu_only
        self.sites: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def note(self, tensor: torch.Tensor) -> None:
        if getattr(_state, "host_side", 0) or (self.gpu_only and tensor.device.type == "cpu"):
            return
        self.sites[site_of(sys._getframe(2))] += 1

    def __enter__(self) -> Counter:
        _install()
        _state.counters = [*getattr(_state, "counters", []), self]
        return self

    def __exit__(self, *exc: object) -> None:
        _state.counters = [c for c in _state.counters if c is not self]


@contextlib.contextmanager
def host_side() -> Iterator[None]:
    """Reads made here are of host data on purpose (not counted)."""
    _state.host_side = getattr(_state, "host_side", 0) + 1
    try:
        yield
    finally:
        _state.host_side -= 1


def _counted(original: Callable[..., Any]) -> Callable[..., Any]:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for counter in getattr(_state, "counters", ()):
            counter.note(self)
        return original(self, *args, **kwargs)

    read.hpc_counted = True  # type: ignore[attr-defined]
    return read


def _install() -> None:
    """Wrap ``READS`` on torch.Tensor once per process (a wrapped read costs a thread-local
    lookup while no counter is active)."""
    for name in READS:
        original = getattr(torch.Tensor, name)
        if not getattr(original, "hpc_counted", False):
            setattr(torch.Tensor, name, _counted(original))
