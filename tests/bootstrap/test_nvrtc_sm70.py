"""CUDA 12.6 compiles Volta (sm_70) code here: NVRTC from PyPI, pinned beside the bootstrap's lock.

What this proves (marker `slow` where NVRTC runs: in `make test`, not in `make test-fast`):
- CUDA 12.6's compiler, as NVIDIA ships it in NVRTC 12.6.85 (the release of
  bootstrap/cuda12-sm70.lock's nvcc 12.6.85: the same NVVM front end and ptxas back end), lists
  sm_70 among its targets and compiles a small kernel using a warp shuffle (__shfl_down_sync, a
  *_sync primitive as in NCCL-style reductions) to a CUDA ELF whose header says sm_70
  (e_machine 190 EM_CUDA; ELF ABI version 7, where e_flags holds the SM in bits 0-7 and the
  virtual SM in bits 16-23: 0x460546 for sm_70, 0x500550 for sm_80); the same source for sm_80
  gives 80 there, so the field follows the target asked for;
- the target is honoured, not ignored: an sm_80-only intrinsic (__reduce_add_sync) is refused
  for sm_70 and accepted for sm_80.
The wheel (nvrtc-cu12-requirements.txt, installed with --require-hashes) is cached in
~/.cache/hpc-train-tests/nvrtc-<hash of that file>, so a rerun takes a second or two; the first
run needs PyPI (about 24 MB). No GPU, no CUDA driver: NVRTC compiles without either.

What this does not prove: nvcc itself (the redist archives cuda12-toolchain.sh fetches) and the
nccl-tests build for sm_70. Those are proven by test_cuda12_toolchain.py's slow test, only where
developer.download.nvidia.com is reachable (this development machine and CI reach only PyPI and
Debian, so there it skips). Nor that the cubin runs on a V100: nothing here has one.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

from tests.bootstrap import wheels
from tests.bootstrap.test_cuda12_toolchain import lock_entries

REQUIREMENTS = Path(__file__).with_name("nvrtc-cu12-requirements.txt")
LIBRARY = Path("nvidia") / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
EM_CUDA = 190
ELF_ABI_VERSION_LEGACY = 7  # CUDA 12.6's cubins; a later ABI version encodes the SM elsewhere
WARP_SUM = b"""
extern "C" __global__ void warp_sum(const float *x, float *out) {
    float v = x[threadIdx.x];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) *out = v;
}
"""
SM80_ONLY = b"""
extern "C" __global__ void warp_total(const unsigned *x, unsigned *out) {
    *out = __reduce_add_sync(0xffffffffu, x[threadIdx.x]);
}
"""


class CompileError(RuntimeError):
    pass


def pinned_version() -> str:
    [version] = wheels.pins(REQUIREMENTS).values()
    return version


@pytest.fixture(scope="module")
def nvrtc() -> ctypes.CDLL:
    return ctypes.CDLL(str(wheels.installed(REQUIREMENTS, "nvrtc") / LIBRARY))


def check(status: int, call: str) -> None:
    assert status == 0, f"{call}: nvrtcResult {status}"


def compile_cubin(lib: ctypes.CDLL, source: bytes, sm: int) -> bytes:
    program = ctypes.c_void_p()
    check(lib.nvrtcCreateProgram(ctypes.byref(program), source, b"k.cu", 0, None, None), "create")
    try:
        options = (ctypes.c_char_p * 1)(f"--gpu-architecture=sm_{sm}".encode())
        if lib.nvrtcCompileProgram(program, 1, options) != 0:
            size = ctypes.c_size_t()
            check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "log size")
            log = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetProgramLog(program, log), "log")
            raise CompileError(log.value.decode())
        size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(program, cubin), "cubin")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def cuda_elf_sms(cubin: bytes) -> tuple[int, int]:
    """(SM, virtual SM) from a CUDA ELF header, after checking it is one (64-bit, EM_CUDA)."""
    assert cubin[:4] == b"\x7fELF", cubin[:16]
    assert cubin[4] == 2 and cubin[5] == 1, "not a 64-bit little-endian ELF"
    assert cubin[8] == ELF_ABI_VERSION_LEGACY, f"ELF ABI version {cubin[8]}"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    assert machine == EM_CUDA, machine
    (flags,) = struct.unpack_from("<I", cubin, 48)
    return flags & 0xFF, (flags >> 16) & 0xFF


def test_the_nvrtc_pin_is_the_release_of_the_bootstrap_nvcc() -> None:
    nvcc_version = next(e[1] for e in lock_entries() if e[0] == "cuda_nvcc")
    assert pinned_version() == nvcc_version


@pytest.mark.slow
def test_nvrtc_12_6_lists_sm_70(nvrtc: ctypes.CDLL) -> None:
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
    assert (major.value, minor.value) == (12, 6)
    count = ctypes.c_int()
    check(nvrtc.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "arch count")
    archs = (ctypes.c_int * count.value)()
    check(nvrtc.nvrtcGetSupportedArchs(archs), "archs")
    assert 70 in list(archs), list(archs)  # CUDA 13 has no 70: the reason for this toolchain


@pytest.mark.slow
@pytest.mark.parametrize("sm", [70, 80])
def test_a_warp_shuffle_kernel_compiles_to_a_cubin_for_that_sm(nvrtc: ctypes.CDLL, sm: int) -> None:
    cubin = compile_cubin(nvrtc, WARP_SUM, sm)
    assert cuda_elf_sms(cubin) == (sm, sm)
    assert b".text.warp_sum" in cubin  # the kernel's code section, not an empty module


@pytest.mark.slow
def test_an_sm_80_intrinsic_is_refused_for_sm_70_and_compiled_for_sm_80(nvrtc: ctypes.CDLL) -> None:
    with pytest.raises(CompileError, match="__reduce_add_sync"):
        compile_cubin(nvrtc, SM80_ONLY, 70)
    assert cuda_elf_sms(compile_cubin(nvrtc, SM80_ONLY, 80)) == (80, 80)
