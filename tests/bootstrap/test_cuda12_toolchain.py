"""bootstrap/cuda12-toolchain.sh and nccl-tests.sh's choice of compiler by compute capability.

What this proves:
- the choice: a node whose GPU is below compute capability 7.5 (the p3dn's V100 is 7.0; CUDA 13
  has no sm_70) builds nccl-tests with the CUDA 12.6 toolchain of cuda12-sm70.lock into
  nccl-tests/<version>-sm_70; a 8.0 node (p4d) uses the image's CUDA_HOME as before (seconds);
- the trust decision: an archive whose bytes differ from the lock's sha256 is refused and leaves
  no toolchain behind (seconds, no network: a local "redist" with a wrong archive);
- the toolchain itself (marker `slow`, needs NVIDIA's download site): the pinned archives, fetched
  and checked by the real script, compile a small CUDA source for sm_70 with this machine's gcc,
  and the binary's cuobjdump lists an sm_70 cubin. The ~51 MB of archives are cached in
  ~/.cache/hpc-train-tests/cuda12 (checked again on every run), so a rerun takes seconds.
  Skipped, saying so, where developer.download.nvidia.com cannot be reached (this development
  machine reaches only PyPI and Debian; PyPI has no CUDA 12 nvcc: its nvidia-cuda-nvcc-cu12
  wheels hold ptxas and libnvvm only). No GPU is needed anywhere. Where it skips, the same CUDA
  12.6.3 compiler is still proven for sm_70 through its NVRTC from PyPI: test_nvrtc_sm70.py.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "bootstrap"
LOCK = BOOTSTRAP / "cuda12-sm70.lock"
REDIST_HOST = "developer.download.nvidia.com"
CACHE = Path.home() / ".cache" / "hpc-train-tests" / "cuda12"
KERNEL = """
__global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
int main() { axpy<<<1, 32>>>(2.0f, nullptr, nullptr, 0); return 0; }
"""


def lock_entries() -> list[list[str]]:
    lines = [line.split() for line in LOCK.read_text().splitlines()]
    return [fields for fields in lines if fields and not fields[0].startswith("#")]


def env_for(tmp_path: Path, prefix: Path, **extra: str) -> dict[str, str]:
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return {
        **os.environ,
        "BOOTSTRAP_PREFIX": str(prefix),
        "BOOTSTRAP_LOG_FILE": str(log / "bootstrap.log"),
        "BOOTSTRAP_LOG_DIR": str(log),
        **extra,
    }


def test_the_lock_pins_what_nccl_tests_needs_of_one_cuda_12_release() -> None:
    entries = lock_entries()
    assert [e[0] for e in entries] == ["cuda_nvcc", "cuda_cudart", "cuda_cccl", "cuda_cuobjdump"]
    for component, version, path, sha256, size in entries:
        assert version.startswith("12.6."), (component, version)
        assert path == f"{component}/linux-x86_64/{component}-linux-x86_64-{version}-archive.tar.xz"
        assert re.fullmatch(r"[0-9a-f]{64}", sha256) and int(size) > 0


def line_of(component: str) -> int:
    lines = LOCK.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(f"{component} "))


def with_lock(tmp_path: Path, edit) -> Path:
    """A copy of bootstrap/ whose lock's lines went through ``edit``; its toolchain script."""
    copy = tmp_path / "bootstrap"
    shutil.copytree(BOOTSTRAP, copy)
    lock = copy / LOCK.name
    lock.write_text("".join(edit(line) for line in LOCK.read_text().splitlines(keepends=True)))
    return copy / "cuda12-toolchain.sh"


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda line: "" if line.startswith("cuda_cccl ") else line,
         "cuda12-sm70.lock has no cuda_cccl: nccl-tests needs cuda_nvcc cuda_cudart cuda_cccl "
         "cuda_cuobjdump"),
        (lambda line: line.replace(" 1126072", "") if line.startswith("cuda_cudart ") else line,
         f"cuda12-sm70.lock:{line_of('cuda_cudart')} does not parse (component version path "
         "sha256 bytes): cuda_cudart "),
        (lambda line: line.replace("12.6.85 ", "12.6.86 ", 1), f"cuda12-sm70.lock:{line_of('cuda_nvcc')} does not parse"),
    ],
    ids=["missing-component", "short-line", "path-not-its-version"],
)  # fmt: skip
def test_a_lock_without_a_needed_component_or_that_does_not_parse_is_one_line_and_exit_2(
    tmp_path: Path, edit, said: str
) -> None:
    script = with_lock(tmp_path, edit)
    for args in (["--list"], [str(tmp_path / "prefix" / "cuda-12.6.3")]):
        done = subprocess.run(["bash", str(script), *args], env=env_for(tmp_path, tmp_path / "prefix"),
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.startswith("error: ") and said in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "prefix" / "cuda-12.6.3").exists()


def test_an_archive_with_other_bytes_is_refused_and_leaves_no_toolchain(tmp_path: Path) -> None:
    redist = tmp_path / "redist"
    _, _, path, _, _ = lock_entries()[0]
    (redist / path).parent.mkdir(parents=True)
    (redist / path).write_bytes(b"not the archive NVIDIA published")
    dest = tmp_path / "prefix" / "cuda-12.6.3"
    env = env_for(tmp_path, tmp_path / "prefix", BOOTSTRAP_CUDA12_REDIST_URL=str(redist))
    done = subprocess.run(
        ["bash", str(BOOTSTRAP / "cuda12-toolchain.sh"), str(dest)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "sha256 mismatch" in done.stderr
    assert not dest.exists()
    assert list((tmp_path / "prefix").glob("cuda-12.6.3*")) == []  # no half-made toolchain


@pytest.mark.parametrize(
    ("cap", "folder", "expected_log"),
    [
        ("7.0", "2.17.6-sm_70", "compute capability 7.0: CUDA 13 has no sm_70"),
        ("8.0", "2.17.6", "no CUDA toolkit on this node"),
    ],
)
def test_nccl_tests_chooses_the_compiler_by_compute_capability(
    tmp_path: Path, cap: str, folder: str, expected_log: str
) -> None:
    """7.0 goes to the CUDA 12 toolchain (refused here: an empty redist), 8.0 to CUDA_HOME."""
    prefix = tmp_path / "prefix"
    env = env_for(
        tmp_path,
        prefix,
        BOOTSTRAP_COMPUTE_CAP=cap,
        BOOTSTRAP_CUDA12_REDIST_URL=str(tmp_path / "empty-redist"),
        CUDA_HOME=str(tmp_path / "no-cuda"),
    )
    done = subprocess.run(
        ["bash", str(BOOTSTRAP / "nccl-tests.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    log = (tmp_path / "log" / "bootstrap.log").read_text()
    assert expected_log in log
    if cap == "7.0":
        assert done.returncode != 0  # the toolchain's archive is not there: no build
        assert "cuda12-toolchain.sh" in log and str(prefix / "cuda-12.6.3") in log
    else:
        assert done.returncode == 0 and "cuda-12.6.3" not in log
    assert not (prefix / "nccl-tests" / folder / ".complete").exists()


def nvidia_reachable() -> bool:
    try:
        socket.create_connection((REDIST_HOST, 443), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
def test_the_pinned_cuda_12_toolchain_compiles_sm70_code_with_this_gcc(tmp_path: Path) -> None:
    if not nvidia_reachable():
        pytest.skip(f"{REDIST_HOST} not reachable: the pinned CUDA 12 archives cannot be fetched")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: nvcc needs a host compiler (CUDA 12.6 supports gcc up to 13.2)")
    CACHE.mkdir(parents=True, exist_ok=True)
    dest = tmp_path / "cuda-12.6.3"
    # the prefix's downloads/ is the cache: fetch_verified checks a cached archive's sha256 again
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "downloads").symlink_to(CACHE)
    subprocess.run(
        ["bash", str(BOOTSTRAP / "cuda12-toolchain.sh"), str(dest)],
        env=env_for(tmp_path, prefix),
        check=True,
        timeout=600,
    )
    nvcc = dest / "bin" / "nvcc"
    arches = subprocess.run(
        [str(nvcc), "--list-gpu-arch"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "compute_70" in arches
    source = tmp_path / "axpy.cu"
    source.write_text(KERNEL)
    binary = tmp_path / "axpy"
    subprocess.run(
        [str(nvcc), "-gencode=arch=compute_70,code=sm_70", str(source), "-o", str(binary)],
        check=True,
        timeout=300,
    )
    elves = subprocess.run(
        [str(dest / "bin" / "cuobjdump"), "--list-elf", str(binary)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"\.sm_70\.cubin", elves), elves
