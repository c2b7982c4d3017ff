"""Every header nccl-tests includes compiles from the CUDA 12 components the bootstrap's lock holds.

What this proves, without NVIDIA's download site (marker `slow` where it compiles: PyPI, in `make
test`, not in `make test-fast`):
- the header set: every CUDA and NCCL header that nccl-tests 2.17.6's sources include (HEADERS,
  read from its src/ and verifiable/ at that tag) compiles with this machine's g++, using only the
  include folders of the lock's components (bootstrap/cuda12-sm70.lock, read through
  `cuda12-toolchain.sh --list`) and of the NCCL headers the build uses. The components come from
  PyPI's wheels of the same versions (cuda12-headers-requirements.txt, hash-pinned, cached): NVIDIA
  ships the same headers there. Take a component out of the lock and its folder is no longer
  given: the compile fails (without cuda_cccl: "nv/target: No such file or directory");
- that the check can see that failure: the same compile without cuda_cccl's folder fails on
  exactly <nv/target>. (The NVRTC test cannot: NVRTC provides <nv/target> itself.)
- that the pins follow the lock: the wheels' versions are the lock's (seconds, no network).

Stood in: the compile is g++ -fsyntax-only with ``-include cuda_runtime.h`` and C++14, what nvcc
12's host pass does (nvcc -v shows both; nccl-tests' common.mk uses -std=c++14 below CUDA 13), not
nvcc itself (PyPI has no CUDA 12 nvcc); device code is not compiled. mpi.h (MPI=1 builds) comes
from the node's Open MPI, not from the lock.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.bootstrap import wheels

REPO = Path(__file__).resolve().parents[2]
TOOLCHAIN = REPO / "bootstrap" / "cuda12-toolchain.sh"
REQUIREMENTS = Path(__file__).with_name("cuda12-headers-requirements.txt")
NCCL_TESTS_VERSION = "2.17.6"  # the headers below were read at this tag
# The CUDA and NCCL headers nccl-tests 2.17.6 includes (src/*.cu, src/*.h, verifiable/*), in the
# order a translation unit meets them; nccl_device.h only with NCCL >= 2.28 (common.h).
HEADERS = ("cuda_runtime.h", "cuda.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "nccl.h",
           "nccl_device.h")  # fmt: skip
# Lock component -> (PyPI distribution, folder under nvidia/ holding its include/).
WHEELS = {
    "cuda_nvcc": ("nvidia-cuda-nvcc-cu12", "cuda_nvcc"),
    "cuda_cudart": ("nvidia-cuda-runtime-cu12", "cuda_runtime"),
    "cuda_cccl": ("nvidia-cuda-cccl-cu12", "cuda_cccl"),
}
HEADERLESS = {"cuda_cuobjdump"}  # a tool: no headers
NCCL = ("nvidia-nccl-cu12", "nccl")


def lock_components(env: dict[str, str]) -> list[tuple[str, str]]:
    """(component, version) of the lock, as cuda12-toolchain.sh reads it (checked there)."""
    done = subprocess.run(
        ["bash", str(TOOLCHAIN), "--list"], env=env, capture_output=True, text=True, check=True
    )
    return [(c, v) for c, v in (line.split() for line in done.stdout.splitlines())]


@pytest.fixture
def toolchain_env(tmp_path: Path) -> dict[str, str]:
    return {"BOOTSTRAP_PREFIX": str(tmp_path), "BOOTSTRAP_LOG_FILE": str(tmp_path / "log"),
            "PATH": "/usr/bin:/bin"}  # fmt: skip


def test_the_pinned_wheels_are_the_lock_components_at_the_lock_versions(toolchain_env) -> None:
    pinned = wheels.pins(REQUIREMENTS)
    components = lock_components(toolchain_env)
    for component, version in components:
        assert component in WHEELS or component in HEADERLESS, component
        if component in WHEELS:
            assert pinned[WHEELS[component][0]] == version, component
    assert NCCL[0] in pinned


def test_the_header_list_is_the_one_of_the_nccl_tests_the_bootstrap_builds() -> None:
    script = (REPO / "bootstrap" / "nccl-tests.sh").read_text()
    assert f"BOOTSTRAP_NCCL_TESTS_VERSION:-{NCCL_TESTS_VERSION}" in script


def syntax_check(includes: list[Path], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "headers.cc"
    source.write_text("".join(f"#include <{h}>\n" for h in HEADERS))
    flags = ["-std=c++14", "-fsyntax-only", "-include", "cuda_runtime.h"]
    return subprocess.run(
        ["g++", *flags, *(f"-I{d}" for d in includes), str(source)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site() -> Path:
    if shutil.which("g++") is None:
        pytest.skip("no g++: the host compiler nvcc would use")
    return wheels.installed(REQUIREMENTS, "cuda12-headers") / "nvidia"


@pytest.mark.slow
def test_every_nccl_tests_header_compiles_from_the_lock_components(
    site: Path, toolchain_env: dict[str, str], tmp_path: Path
) -> None:
    includes = [site / WHEELS[c][1] / "include" for c, _ in lock_components(toolchain_env)
                if c in WHEELS] + [site / NCCL[1] / "include"]  # fmt: skip
    done = syntax_check(includes, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / NCCL[1] / "include" / "nccl_device.h").is_file()  # NCCL >= 2.28: in the set


@pytest.mark.slow
def test_without_cuda_cccl_the_fp16_header_misses_nv_target(site: Path, tmp_path: Path) -> None:
    includes = [site / WHEELS[c][1] / "include" for c in ("cuda_nvcc", "cuda_cudart")]
    done = syntax_check([*includes, site / NCCL[1] / "include"], tmp_path)
    assert done.returncode != 0
    assert re.search(r"cuda_fp16\.h:\d+:\d+: fatal error: nv/target: No such file", done.stderr)
