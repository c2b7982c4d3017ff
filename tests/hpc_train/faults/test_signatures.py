""" "The same error" by what it is: failure signatures without the parts that change between
starts (``faults.signatures``), on real messages: CUDA's out-of-memory text as PyTorch's
allocator formats it, torch's checkpoint writer on a full disk (made here, twice, on tmpfs file
systems of their own), the toolkit's own no-space refusal; and messages of other kinds, which
must still differ."""

from __future__ import annotations

import errno

import torch

from hpc_core import rundir
from hpc_train.faults import failures, signatures
from hpc_train.faults.failures import Failure
from hpc_train.worker import crash

# c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, main): the message of TORCH_CHECK_WITH(
# OutOfMemoryError, ...): "CUDA out of memory. Tried to allocate <size>. GPU <d> has a total
# capacity of <size> of which <size> is free. " + one "Process <pid> has <size> memory in use. "
# per other process ("Including non-PyTorch memory, this process has ..." for its own) + "Of the
# allocated memory <size> is allocated by PyTorch, and <size> is reserved by PyTorch but
# unallocated. If reserved but unallocated memory is large try setting ..."; format_size writes
# bytes, KiB, MiB or GiB with two decimals. Two starts' worth, other numbers and pids:
OOM = (
    "CUDA out of memory. Tried to allocate {ask}. GPU 0 has a total capacity of 79.11 GiB of "
    "which {free} is free. Process {pid} has {other} memory in use. Including non-PyTorch "
    "memory, this process has {mine} memory in use. Of the allocated memory {alloc} is allocated "
    "by PyTorch, and {res} is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
OOM_A = OOM.format(ask="1020.00 MiB", free="611.56 MiB", pid=3113, other="2.10 GiB",
                   mine="76.38 GiB", alloc="74.02 GiB", res="1.71 GiB")  # fmt: skip
OOM_B = OOM.format(ask="1.00 GiB", free="48.00 MiB", pid=77021, other="2.10 GiB",
                   mine="76.95 GiB", alloc="75.11 GiB", res="1.19 GiB")  # fmt: skip
# the allocator's message before torch 2.1 (the same file, then)
OLD_OOM = (
    "CUDA out of memory. Tried to allocate {} (GPU 0; 31.75 GiB total capacity; {} already "
    "allocated; {} free; 29.90 GiB reserved in total by PyTorch)"
)


def report(exc_type: str, message: str, update: int = 50) -> Failure:
    return Failure(0, update, exc_type, message[: crash.MESSAGE_MAX])


def torch_write_on_a_full_disk(small_fs, small: int) -> BaseException:
    """``small`` records of a few kB, then one of 4 MB onto a 1 MiB tmpfs: the write stops at a
    place that moves with ``small``."""
    fs = small_fs("1m")
    state = {"s": [torch.zeros(5000 + i) for i in range(small)], "w": torch.zeros(1 << 20)}
    try:
        with rundir.atomic_writer(fs.root / "checkpoint_1_50.pt") as fh:
            torch.save(state, fh)
    except BaseException as err:
        return err
    raise AssertionError("it fit")


def test_the_same_out_of_memory_with_other_figures_is_the_same_error():
    a, b = report("OutOfMemoryError", OOM_A), report("OutOfMemoryError", OOM_B)
    assert a.message != b.message and a.signature == b.signature
    assert failures.repeated([b], [a]) == b
    old = [report("OutOfMemoryError", OLD_OOM.format(*f)) for f in
           (("20.00 MiB", "29.61 GiB", "11.06 MiB"), ("2.00 GiB", "28.90 GiB", "1.13 GiB"))]  # fmt: skip
    assert old[0].signature == old[1].signature != a.signature


def test_torchs_full_disk_message_at_the_same_update_is_the_same_error(small_fs):
    """Made for real: two writes of different sizes stop at other positions on a 1 MiB tmpfs
    ("unexpected pos N vs M" with other numbers); the issue's two messages too."""
    first = torch_write_on_a_full_disk(small_fs, 3)
    second = torch_write_on_a_full_disk(small_fs, 7)
    a, b = (crash.from_exception(e, 0, 50) for e in (first, second))
    assert "unexpected pos" in a.message and a.message != b.message
    assert a.errno == b.errno == errno.ENOSPC
    assert Failure(**vars(a)).signature == Failure(**vars(b)).signature
    issue = [f"[enforce fail at inline_container.cc:672] . unexpected pos {p}" for p in
             ("2082368 vs 2082256", "1946688 vs 1946576")]  # fmt: skip
    wrapped = [f"a background checkpoint write failed: RuntimeError: {m}" for m in issue]
    assert (
        report("CheckpointWriteError", wrapped[0]).signature
        == report("CheckpointWriteError", wrapped[1]).signature
    )


def test_the_toolkits_no_space_refusal_with_other_figures_is_the_same_error():
    said = "[Errno 28] no space for checkpoint_1_50.pt: /lustre/runs/x: {} free, {} needed: '/lustre/runs/x/checkpoint_1_50.pt'"
    a = report("NoSpace", said.format("1.21 GB", "4.47 GB"))
    b = report("NoSpace", said.format("980.3 MB", "4.47 GB"))
    assert a.signature == b.signature
    assert (
        a.signature != report("NoSpace", said.replace("28", "122").format("1 GB", "4 GB")).signature
    )


def test_temporaries_addresses_and_pids_are_volatile_too():
    a = "OSError: [Errno 5] Input/output error: '/lustre/r/.checkpoint_1_5.pt.4242.tmp' at 0x7f3a9c0e1b20 (pid 4242)"
    b = "OSError: [Errno 5] Input/output error: '/lustre/r/.checkpoint_1_5.pt.977.tmp' at 0x55d0a1b2c3d4 (pid 977)"
    assert signatures.kind(a) == signatures.kind(b)
    assert signatures.kind("cannot open /tmp/tmpa1b2c3d4/x.bin") == signatures.kind(
        "cannot open /tmp/tmpzz9y8x7w/x.bin"
    )


KINDS = [
    ("OutOfMemoryError", OOM_A),
    ("OutOfMemoryError", OLD_OOM.format("20.00 MiB", "29.61 GiB", "11.06 MiB")),
    ("CheckpointWriteError", "a background checkpoint write failed: RuntimeError: "
     "[enforce fail at inline_container.cc:672] . unexpected pos 2082368 vs 2082256"),
    ("CheckpointWriteError", "a background checkpoint write failed: NoSpace: [Errno 28] no "
     "space for checkpoint_1_50.pt"),
    ("CheckpointWriteError", "a background checkpoint write failed: OSError: [Errno 122] "
     "Disk quota exceeded"),
    ("CheckpointWriteError", "a background checkpoint write failed: OSError: [Errno 30] "
     "Read-only file system"),
    ("CheckpointWriteError", "a background checkpoint write failed: OSError: [Errno 5] "
     "Input/output error"),
    ("RuntimeError", "CUDA error: an illegal memory access was encountered"),
    ("RuntimeError", "CUDA error: device-side assert triggered"),
    ("FloatingPointError", "Minimum loss scale reached (0.0001)."),
    ("FloatingPointError", "Fatal error: gradients are inconsistent between workers."),
    ("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
    ("KeyError", "'encoder.layers.12.weight'"),
    ("KeyError", "'decoder.embed_tokens.weight'"),
]  # fmt: skip


def test_errors_of_another_kind_still_differ():
    """Fourteen errors of distinct kinds: fourteen signatures (ENOSPC, EDQUOT, EROFS and EIO
    apart: the errno of ``[Errno N]`` is kept); the same error at another update differs too."""
    found = {report(exc_type, message).signature for exc_type, message in KINDS}
    assert len(found) == len(KINDS)
    exc_type, message = KINDS[0]
    assert report(exc_type, message, update=51).signature != report(exc_type, message).signature
