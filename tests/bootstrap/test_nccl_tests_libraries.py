"""all_reduce_perf, as bootstrap/nccl-tests.sh builds it, starts with no LD_LIBRARY_PATH.

nccl-tests links libcudart and libnccl (and libmpi) dynamically, and on a p3dn neither the CUDA 12
toolchain's lib folder nor the NCCL that pip installed with torch is on the loader's path. What
this proves (marker `slow`: PyPI's NCCL wheel and a real nvcc build, seconds once cached):
- the real step (bootstrap/nccl-tests.sh: its choice of NCCL, its make call, its checks) builds a
  binary whose RUNPATH names the toolkit's lib64 and the NCCL home it found (torch's wheel, through
  the Python environment, as on a node), whose every library resolves with LD_LIBRARY_PATH unset
  (ldd: none "not found"), and which starts and answers from that NCCL (ncclGetVersion);
- bad input stays one line and exit 2: a build linking a library the loader cannot find is
  refused, and leaves no finished build behind.

Stood in, and why: NVIDIA's site (the CUDA 12.6 toolchain, nccl-tests' GitHub archive) is not
reachable here and this machine's nvcc is CUDA 13, which has no sm_70. So the toolkit is this
machine's CUDA 13 (BOOTSTRAP_COMPUTE_CAP=8.0: the path that builds with CUDA_HOME; the sm_70 path
passes the same make call and RUNPATH, with CUDA_HOME the toolchain's), and the source is a small
stand-in with nccl-tests 2.17.6's link recipe (src/common.mk's NVLDFLAGS := -L$(CUDA_LIB)
-l$(CUDARTLIB) -lrt, src/Makefile's -L$(NCCL_HOME)/lib -lnccl, linked by $(NVCC) with no -rpath).
NCCL is nvidia-nccl-cu12 2.29.7 (cuda12-headers-requirements.txt says why that version). Without
MPI (no Open MPI here). Skipped where there is no nvcc.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.bootstrap import wheels

REPO = Path(__file__).resolve().parents[2]
STEP = REPO / "bootstrap" / "nccl-tests.sh"
REQUIREMENTS = Path(__file__).with_name("cuda12-headers-requirements.txt")
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
STANDIN = {
    "Makefile": """\
BUILDDIR ?= build
override BUILDDIR := $(abspath $(BUILDDIR))
default: src.build
%.build:
\t${MAKE} -C $* build BUILDDIR=${BUILDDIR}
""",
    "src/common.mk": """\
CUDA_HOME ?= /usr/local/cuda
CUDA_LIB ?= $(CUDA_HOME)/lib64
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDARTLIB ?= cudart
NVCC_GENCODE ?= -gencode=arch=compute_80,code=sm_80
NVCUFLAGS  := -ccbin $(CXX) $(NVCC_GENCODE) -std=c++17
NVLDFLAGS  := -L${CUDA_LIB} -l${CUDARTLIB} -lrt
""",
    "src/Makefile": """\
include common.mk
NVCUFLAGS += -I$(NCCL_HOME)/include/
NVLDFLAGS += -L$(NCCL_HOME)/lib
LIBRARIES += nccl
NVLDFLAGS += $(LIBRARIES:%=-l%) $(STANDIN_EXTRA_LDFLAGS)
build: $(BUILDDIR)/all_reduce_perf
$(BUILDDIR)/all_reduce.o: all_reduce.cu
\t@mkdir -p $(BUILDDIR)
\t$(NVCC) -o $@ $(NVCUFLAGS) -c $<
$(BUILDDIR)/all_reduce_perf: $(BUILDDIR)/all_reduce.o
\t$(NVCC) -o $@ $(NVCUFLAGS) $^ ${NVLDFLAGS}
""",
    "src/all_reduce.cu": """\
#include <cstdio>
#include "cuda_runtime.h"
#include "nccl.h"
int main() {
  int version = 0, devices = -1;
  ncclGetVersion(&version);
  cudaError_t err = cudaGetDeviceCount(&devices);
  printf("nccl %d cuda %s\\n", version, cudaGetErrorName(err));
  return version > 0 ? 0 : 1;
}
""",
}


@pytest.fixture(scope="module")
def nccl_site() -> Path:
    if not (CUDA_HOME / "bin" / "nvcc").exists():
        pytest.skip(f"no nvcc in {CUDA_HOME}: the stand-in build needs a CUDA toolkit")
    return wheels.installed(REQUIREMENTS, "cuda12-headers")


def standin_tarball(root: Path) -> tuple[Path, str]:
    for name, text in STANDIN.items():
        (root / "src-tree" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src-tree" / name).write_text(text)
    tarball = root / "nccl-tests-standin.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(root / "src-tree", arcname="nccl-tests-standin")
    return tarball, hashlib.sha256(tarball.read_bytes()).hexdigest()


def run_step(tmp_path: Path, site: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """nccl-tests.sh on a node whose Python environment holds torch's NCCL wheel (``site``)."""
    prefix = tmp_path / "prefix"
    python = prefix / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    tarball, sha256 = standin_tarball(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env |= {
        "BOOTSTRAP_PREFIX": str(prefix), "BOOTSTRAP_LOG_FILE": str(tmp_path / "bootstrap.log"),
        "BOOTSTRAP_COMPUTE_CAP": "8.0", "CUDA_HOME": str(CUDA_HOME),
        "BOOTSTRAP_NCCL_TESTS_VERSION": "standin", "BOOTSTRAP_NCCL_TESTS_URL": str(tarball),
        "BOOTSTRAP_NCCL_TESTS_SHA256": sha256, "BOOTSTRAP_MPI_HOME": str(tmp_path / "no-mpi"),
        **extra,
    }  # fmt: skip
    return subprocess.run(
        ["bash", str(STEP)], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def no_loader_path() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


@pytest.mark.slow
def test_all_reduce_perf_resolves_its_libraries_and_starts_without_ld_library_path(
    tmp_path: Path, nccl_site: Path
) -> None:
    done = run_step(tmp_path, nccl_site)
    assert done.returncode == 0, done.stderr[-3000:]
    dest = tmp_path / "prefix" / "nccl-tests" / "standin"
    binary, nccl_home = dest / "build" / "all_reduce_perf", Path(f"{dest}.nccl-home")
    assert f"NCCL from {nccl_home}" in (tmp_path / "bootstrap.log").read_text()  # torch's wheel
    dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True).stdout
    runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*)\]", dynamic)
    assert runpath, dynamic
    assert runpath.group(1).split(":")[:2] == [f"{CUDA_HOME}/lib64", f"{nccl_home}/lib"]
    ldd = subprocess.run(["ldd", str(binary)], env=no_loader_path(), capture_output=True, text=True)
    assert "not found" not in ldd.stdout, ldd.stdout
    assert re.search(rf"libnccl\.so\.2 => {re.escape(str(nccl_home))}/lib/", ldd.stdout), ldd.stdout
    started = subprocess.run([str(binary)], env=no_loader_path(), capture_output=True, text=True)
    assert started.returncode == 0 and started.stdout.startswith("nccl 22907 "), started  # 2.29.7
    assert (dest / ".complete").read_text().splitlines()[2] == f"RUNPATH={runpath.group(1)}"


@pytest.mark.slow
def test_a_build_whose_libraries_do_not_resolve_is_one_line_and_exit_2(
    tmp_path: Path, nccl_site: Path
) -> None:
    """The stand-in links one more library, from a folder neither its RUNPATH nor the system's
    path names (as a toolkit or NCCL elsewhere than the RUNPATH says would be)."""
    ghost = tmp_path / "ghost"
    ghost.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(ghost / "libghost.so")],
                   input="int ghost(void) { return 0; }\n", text=True, check=True)  # fmt: skip
    done = run_step(
        tmp_path, nccl_site, STANDIN_EXTRA_LDFLAGS=f"-L{ghost} -Xlinker --no-as-needed -lghost"
    )
    assert done.returncode == 2
    said = done.stderr.splitlines()  # the step's timestamped log lines, then the one error
    assert [line for line in said if line.startswith("error: ")] == said[-1:], said
    assert "all_reduce_perf: libghost.so not found (RUNPATH " in said[-1]
    assert not (tmp_path / "prefix" / "nccl-tests" / "standin" / ".complete").exists()
