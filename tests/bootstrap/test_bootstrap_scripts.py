"""bootstrap/: shellcheck, then the real OnNodeConfigured script against a temporary prefix.

What the run does for real: checks the source tarball's sha256 and unpacks it; creates a venv
(no system site-packages) and installs torch==2.13.0 (the CPU wheel pip finds on this machine's
disk; the test fails if anything else, e.g. a CUDA build, gets installed) and the project itself
with --no-deps; writes the EFA/NCCL profile from `python -m hpc_train.environment`; runs the
nccl-tests step: checksum, unpack, make.
What it does not: build fairseq (BOOTSTRAP_FAIRSEQ_SPEC is empty: minutes of C++ on 2 cores), and
the nccl-tests "source" is a stand-in tarball whose Makefile only records its arguments, built with
a stub nvcc and a stub NCCL (no GitHub, no GPU here). No GPU/EFA here: those checks must say
"skipped".

Two "nodes" (a compute node and the head node, each with its own log and profile directory) boot
together on one fresh prefix, then the compute node runs again: the second run must change nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# Builds real Python environments from the scripts (about a minute): not in `make test-fast`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "bootstrap"
ENTRY = BOOTSTRAP / "on-node-configured.sh"
SCRIPTS = sorted(BOOTSTRAP.glob("*.sh"))
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[[^]]+\] [\w-]+: ")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_tarball(path: Path, root: Path, names: list[str], prefix: str = "") -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            tar.add(root / name, arcname=prefix + name, recursive=False)
    return sha256(path)


def project_files() -> list[str]:
    """What `git archive HEAD` would ship once committed: tracked + untracked, not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [name for name in out if (REPO / name).is_file()]


def manifest(*roots: Path) -> dict[str, tuple[int, int, int]]:
    """Every file, directory and link under the roots: (mtime_ns, size, mode)."""
    seen: dict[str, tuple[int, int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames, ""]:
                path = Path(dirpath, name)
                st = path.lstat()
                seen[str(path)] = (st.st_mtime_ns, st.st_size, st.st_mode)
    return seen


FAKE_MAKEFILE = """\
# Stand-in for nccl-tests' Makefile: records the variables the bootstrap passes.
all:
\tmkdir -p build
\tprintf '#!/bin/sh\\necho stand-in all_reduce_perf\\n' > build/all_reduce_perf
\tchmod 755 build/all_reduce_perf
\techo "CUDA_HOME=$(CUDA_HOME) NCCL_HOME=$(NCCL_HOME) MPI=$(MPI)" > build/make-args
"""


@dataclass
class Setup:
    root: Path
    prefix: Path
    tarball: Path
    sha: str
    env: dict[str, str]

    def node(self, name: str) -> dict[str, str]:
        """Environment of one 'node': shared prefix, its own log and profile directory."""
        return {
            **self.env,
            "BOOTSTRAP_LOG_DIR": str(self.root / name / "log"),
            "BOOTSTRAP_PROFILE_DIR": str(self.root / name / "profile.d"),
        }

    def log(self, name: str) -> str:
        return (self.root / name / "log" / "bootstrap.log").read_text()


def entry(env: dict[str, str], *args: str, wait: bool = True):
    cmd = ["bash", str(ENTRY), *args]
    if not wait:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("bootstrap")
    tarball = root / "hpc-train-src.tar.gz"
    sha = make_tarball(tarball, REPO, project_files())

    # stand-ins for the CUDA toolkit, NCCL and the nccl-tests source (see module docstring)
    cuda = root / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    nccl = root / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("/* stand-in */\n")
    (nccl / "lib" / "libnccl.so").write_text("")
    fake_src = root / "fake-nccl-tests"
    fake_src.mkdir()
    (fake_src / "Makefile").write_text(FAKE_MAKEFILE)
    fake_tar = root / "nccl-tests-fake.tar.gz"
    fake_sha = make_tarball(fake_tar, fake_src, ["Makefile"], prefix="nccl-tests-fake/")

    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(root)),
        "BOOTSTRAP_PREFIX": str(root / "prefix"),
        "BOOTSTRAP_PYTHON": sys._base_executable,  # the interpreter behind the test venv
        "BOOTSTRAP_TORCH_SPEC": "torch==2.13.0",
        "BOOTSTRAP_TORCH_INDEX_URL": "",  # pip's own config: the CPU wheel in /opt/wheels
        "BOOTSTRAP_FAIRSEQ_SPEC": "",
        "BOOTSTRAP_PROJECT_PIP_ARGS": "--no-deps",
        "CUDA_HOME": str(cuda),
        "BOOTSTRAP_NCCL_HOME": str(nccl),
        "BOOTSTRAP_MPI_HOME": str(root / "no-mpi"),
        "BOOTSTRAP_NCCL_TESTS_VERSION": "fake",
        "BOOTSTRAP_NCCL_TESTS_URL": str(fake_tar),
        "BOOTSTRAP_NCCL_TESTS_SHA256": fake_sha,
    }
    for key in ("PIP_CONFIG_FILE", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if key in os.environ:
            env[key] = os.environ[key]
    return Setup(root, root / "prefix", tarball, sha, env)


@pytest.fixture(scope="module")
def runs(setup: Setup) -> dict[str, object]:
    """Compute node and head node boot together; then the compute node runs once more."""
    args = ["--source", str(setup.tarball), "--sha256", setup.sha]
    cfnconfig = setup.root / "cfnconfig"
    cfnconfig.write_text("stack_name=hpc-train\ncfn_node_type=ComputeFleet\ncfn_region=us-east-1\n")
    compute_env = {**setup.node("compute"), "BOOTSTRAP_CFNCONFIG": str(cfnconfig)}
    head_env = {**setup.node("head"), "BOOTSTRAP_NODE_TYPE": "HeadNode"}
    compute = entry(compute_env, *args, "--instance-type", "p3dn.24xlarge", wait=False)
    head = entry(head_env, *args, wait=False)
    first = {}
    for name, proc in (("compute", compute), ("head", head)):
        _out, err = proc.communicate(timeout=900)
        first[name] = (proc.returncode, err)
    nodes = [setup.root / n / "profile.d" for n in ("compute", "head")]
    before = manifest(setup.prefix, *[n for n in nodes if n.exists()])
    compute_log_before = setup.log("compute")
    again = entry(compute_env, *args, "--instance-type", "p3dn.24xlarge")
    after = manifest(setup.prefix, *[n for n in nodes if n.exists()])
    return {
        "first": first,
        "again": again,
        "before": before,
        "after": after,
        "second_log": setup.log("compute")[len(compute_log_before) :],
    }


def test_scripts_pass_shellcheck_and_follow_the_house_rules() -> None:
    assert shutil.which("shellcheck"), "shellcheck is installed by `make install-system`"
    proc = subprocess.run(
        ["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout
    assert {s.name for s in SCRIPTS} >= {
        "on-node-configured.sh",
        "lib.sh",
        "python-env.sh",
        "node-checks.sh",
        "nccl-profile.sh",
        "nccl-tests.sh",
    }
    for script in SCRIPTS:
        text = script.read_text()
        if script.name != "lib.sh":  # sourced, not run
            assert text.startswith("#!/usr/bin/env bash\n"), script.name
            assert "\nset -euo pipefail\n" in text, script.name
            assert os.access(script, os.X_OK), script.name
        assert not re.search(r"curl[^\n|]*\|\s*(ba)?sh", text), script.name
        assert "chmod 777" not in text and "chmod -R 777" not in text, script.name


def test_both_nodes_succeed_and_exactly_one_builds_the_environment(setup, runs) -> None:
    for name, (code, err) in runs["first"].items():
        assert code == 0, f"{name} node failed:\n{err}"
    logs = {n: setup.log(n) for n in ("compute", "head")}
    builders = [n for n, text in logs.items() if "building Python environment" in text]
    assert len(builders) == 1, logs
    other = "head" if builders == ["compute"] else "compute"
    assert "(built by another node)" in logs[other]
    assert len(list((setup.prefix / "envs").iterdir())) == 1


def test_python_environment_really_installed(setup, runs) -> None:
    python = setup.prefix / "venv" / "bin" / "python"
    assert (setup.prefix / "venv").is_symlink()
    proc = subprocess.run(
        [str(python), "-c", "import sys, torch, hpc_train; print(torch.__version__, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    version, venv_prefix = proc.stdout.split()
    assert version == "2.13.0+cpu"  # the CPU wheel from disk, never a CUDA build
    assert Path(venv_prefix).resolve() == (setup.prefix / "venv").resolve()
    cfg = (setup.prefix / "venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    pip_list = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    assert "hpc-train==0.1.0" in pip_list
    assert "fairseq" not in pip_list  # skipped on purpose here (see module docstring)


def test_gpu_and_efa_steps_say_they_were_skipped(setup, runs) -> None:
    log = setup.log("compute")
    if shutil.which("nvidia-smi") is None:
        assert "skipped: GPU check: no NVIDIA driver on this node" in log
    assert "skipped: EFA check: no EFA software on this node (fi_info not found)" in log
    head = setup.log("head")
    assert "skipped: GPU/EFA checks: not a compute node" in head
    assert "skipped: EFA/NCCL profile: no --instance-type (HeadNode node)" in head


def test_profile_comes_from_hpc_train_environment(setup, runs) -> None:
    profile = (setup.root / "compute" / "profile.d" / "hpc-train-nccl.sh").read_text()
    expected = subprocess.run(
        [sys.executable, "-m", "hpc_train.environment", "--instance-type", "p3dn.24xlarge"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert profile.endswith(expected)
    assert "export FI_PROVIDER=efa" in profile
    assert "FI_EFA_USE_DEVICE_RDMA" not in profile  # p3dn has no RDMA read
    assert not (setup.root / "head" / "profile.d").exists()


def test_nccl_tests_step_verifies_unpacks_and_builds_once(setup, runs) -> None:
    build = setup.prefix / "nccl-tests" / "fake" / "build"
    assert (build / "all_reduce_perf").exists()
    args = (build / "make-args").read_text()
    assert f"NCCL_HOME={setup.env['BOOTSTRAP_NCCL_HOME']}" in args
    assert f"CUDA_HOME={setup.env['CUDA_HOME']}" in args
    assert args.rstrip().endswith("MPI=")  # no MPI here: built without it
    both = setup.log("compute") + setup.log("head")
    assert both.count("nccl-tests: downloaded") == 1
    assert "(sha256 ok)" in both


def test_every_log_line_is_timestamped(setup, runs) -> None:
    for node in ("compute", "head"):
        lines = [line for line in setup.log(node).splitlines() if STAMP.match(line)]
        steps = {line.split("] ", 1)[1].split(":", 1)[0] for line in lines}
        assert steps >= {"on-node-configured", "python-env", "nccl-tests"}
    # command output (pip's) goes to the log as well, unstamped, between stamped step lines
    assert "Successfully installed" in setup.log("compute") + setup.log("head")


def test_second_run_changes_nothing_and_says_already_done(setup, runs) -> None:
    again = runs["again"]
    assert again.returncode == 0, again.stderr
    assert runs["after"] == runs["before"]
    log = runs["second_log"]
    for what in ("source: already done", "already done: Python environment", "unchanged"):
        assert what in log
    assert "already done: nccl-tests fake" in log
    assert "building" not in log and "+ " not in log  # no command ran the second time


def test_wrong_checksum_is_refused_and_leaves_nothing(setup, tmp_path: Path) -> None:
    env = {
        **setup.node("bad"),
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_NODE_TYPE": "HeadNode",
    }
    proc = entry(env, "--source", str(setup.tarball), "--sha256", "0" * 64)
    assert proc.returncode == 1
    assert f"sha256 mismatch for {setup.tarball}" in proc.stderr
    assert list((tmp_path / "prefix" / "src").iterdir()) == []


@pytest.mark.parametrize(
    ("cfnconfig", "message"),
    [
        (None, "cannot tell the node type: no"),
        ("cfn_node_type=Toaster\n", "unknown node type 'Toaster'"),
    ],
)
def test_node_type_must_be_known(setup, tmp_path: Path, cfnconfig, message) -> None:
    path = tmp_path / "cfnconfig"
    if cfnconfig is not None:
        path.write_text(cfnconfig)
    env = {
        **setup.node("x"),
        "BOOTSTRAP_PREFIX": str(tmp_path / "p"),
        "BOOTSTRAP_CFNCONFIG": str(path),
    }
    proc = entry(env, "--source", str(setup.tarball), "--sha256", setup.sha)
    assert proc.returncode == 1
    assert message in proc.stderr


def test_usage_errors_exit_2(setup) -> None:
    assert entry(setup.env, "--source", "x").returncode == 2
    proc = entry(setup.env, "--bogus")
    assert proc.returncode == 2 and "unknown argument '--bogus'" in proc.stderr


def _lib(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_LOG_FILE": str(tmp_path / "lib.log"),
    }
    code = f"set -euo pipefail; source {BOOTSTRAP / 'lib.sh'}; {script}"
    return subprocess.run(["bash", "-c", code], env=env, capture_output=True, text=True)


def test_fetch_verified_accepts_the_right_file_once(tmp_path: Path) -> None:
    src = tmp_path / "payload"
    src.write_text("payload\n")
    dest = tmp_path / "dl" / "payload"
    ok = _lib(
        tmp_path,
        f"fetch_verified {src} {sha256(src)} {dest}; fetch_verified {src} {sha256(src)} {dest}",
    )
    assert ok.returncode == 0, ok.stderr
    assert dest.read_text() == "payload\n"
    assert "already done" in ok.stderr


def test_fetch_verified_refuses_a_wrong_checksum_and_plain_http(tmp_path: Path) -> None:
    src = tmp_path / "payload"
    src.write_text("tampered\n")
    dest = tmp_path / "dl" / "payload"
    bad = _lib(tmp_path, f"fetch_verified {src} {'a' * 64} {dest}")
    assert bad.returncode == 1
    assert f"sha256 mismatch for {src}: expected {'a' * 64}, got {sha256(src)}" in bad.stderr
    assert list(dest.parent.iterdir()) == []  # no partial file left behind
    http = _lib(tmp_path, f"fetch_verified http://example.com/x {'a' * 64} {dest}")
    assert http.returncode == 1 and "refusing an unencrypted download" in http.stderr
