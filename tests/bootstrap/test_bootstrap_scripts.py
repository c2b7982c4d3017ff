"""bootstrap/: shellcheck, then the real OnNodeConfigured / OnNodeUpdated scripts against a
temporary prefix.

What the run does for real: checks the source tarball's sha256 and unpacks it into
releases/<sha16>; creates a venv (no system site-packages) and installs torch==2.13.0 (the CPU
wheel pip finds on this machine's disk; the test fails if anything else, e.g. a CUDA build, gets
installed) and the project itself with --no-deps; swaps the `current` link; writes the versions
file and the EFA/NCCL profile from `python -m hpc_train.environment`; runs the nccl-tests step:
checksum, unpack, make; installs the head node's systemd units (into a temp dir, systemctl a stub).
What it does not: build fairseq (BOOTSTRAP_FAIRSEQ_SPEC is empty: minutes of C++ on 2 cores), and
the nccl-tests "source" is a stand-in tarball whose Makefile only records its arguments, built with
a stub nvcc and a stub NCCL (no GitHub, no GPU here). No GPU/EFA here: those checks must say
"skipped".

Three "nodes" (each with its own log, profile, versions file and systemd directory) boot together
on one fresh prefix with the templates' arguments: the head node and a login node with --source
(exactly one builds), a compute node without (it waits for the head node's `current`). Then the
head and compute nodes run again: the second run must change nothing. The update tests use their
own prefix and no torch (seconds per release): new code through on-node-updated.sh, pruning, and
the creation-time arguments never moving `current` back.
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
UPDATED = BOOTSTRAP / "on-node-updated.sh"
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
        node = self.root / name
        stub = node / "systemctl"
        if not stub.exists():
            node.mkdir(parents=True)
            stub.write_text(f'#!/bin/sh\necho "$*" >> {node}/systemctl.calls\n')
            stub.chmod(0o755)
        return {
            **self.env,
            "BOOTSTRAP_LOG_DIR": str(node / "log"),
            "BOOTSTRAP_LOCAL_PREFIX": str(node / "local"),
            "BOOTSTRAP_PROFILE_DIR": str(node / "profile.d"),
            "BOOTSTRAP_VERSIONS_FILE": str(node / "etc" / "efa-versions"),
            "HPC_TRAIN_SYSTEMD_DIR": str(node / "units"),
            "HPC_TRAIN_ENV_FILE": str(node / "etc" / "head-node.env"),
            "HPC_TRAIN_SYSTEMCTL": str(stub),
        }

    def calls(self, name: str) -> list[str]:
        path = self.root / name / "systemctl.calls"
        return path.read_text().splitlines() if path.exists() else []

    def log(self, name: str) -> str:
        return (self.root / name / "log" / "bootstrap.log").read_text()


def entry(env: dict[str, str], *args: str, wait: bool = True, script: Path = ENTRY):
    cmd = ["bash", str(script), *args]
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
        # with --no-deps the tracking extra's packages would not come: none asked (the suite
        # tests them in the project's venv, tests/hpc_train/worker/test_tracking.py)
        "BOOTSTRAP_PROJECT_EXTRAS": "",
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
    """The templates' arguments: head and login node with the tarball, a compute node without
    (started first: it must wait for `current`). Then the head and compute nodes run again."""
    source = ["--source", str(setup.tarball), "--sha256", setup.sha]
    compute_args = ["--node-type", "ComputeFleet", "--instance-type", "p3dn.24xlarge"]
    head_args = ["--node-type", "HeadNode", *source]
    compute = entry(setup.node("compute"), *compute_args, wait=False)
    head = entry(setup.node("head"), *head_args, wait=False)
    login = entry(setup.node("login"), "--node-type", "LoginNode", *source, wait=False)
    first = {}
    for name, proc in (("compute", compute), ("head", head), ("login", login)):
        _out, err = proc.communicate(timeout=900)
        first[name] = (proc.returncode, err)
    nodes = [setup.root / n / d for n in NODES for d in ("profile.d", "etc", "units", "local")]
    before = manifest(setup.prefix, *[n for n in nodes if n.exists()])
    logs_before = {n: setup.log(n) for n in ("compute", "head")}
    again = {
        "compute": entry(setup.node("compute"), *compute_args),
        "head": entry(setup.node("head"), *head_args),
    }
    after = manifest(setup.prefix, *[n for n in nodes if n.exists()])
    return {
        "first": first,
        "again": again,
        "before": before,
        "after": after,
        "second_log": {n: setup.log(n)[len(logs_before[n]) :] for n in logs_before},
    }


NODES = ("compute", "head", "login")


def test_scripts_pass_shellcheck_and_follow_the_house_rules() -> None:
    assert shutil.which("shellcheck"), "shellcheck is installed by `make install-system`"
    proc = subprocess.run(
        ["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout
    assert {s.name for s in SCRIPTS} >= {
        "on-node-configured.sh",
        "on-node-updated.sh",
        "head-node-services.sh",
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


def test_all_nodes_succeed_and_exactly_one_builds_the_environment(setup, runs) -> None:
    for name, (code, err) in runs["first"].items():
        assert code == 0, f"{name} node failed:\n{err}"
    logs = {n: setup.log(n) for n in NODES}
    builders = [n for n, text in logs.items() if "building Python environment" in text]
    assert len(builders) == 1 and builders[0] in ("head", "login"), logs
    other = "login" if builders == ["head"] else "head"
    assert "(built by another node)" in logs[other]
    # the source unpacked once, too, by whichever node took the lock first (not always the
    # builder: seen in CI, the head node unpacked and the login node built)
    assert sum("source: already done" in logs[n] for n in ("head", "login")) == 1, logs
    assert "waiting for the head node to install a release" in logs["compute"]
    assert "building" not in logs["compute"] and "source:" not in logs["compute"]
    release = f"releases/{setup.sha[:16]}"
    assert f"using {setup.prefix}/current -> {release}" in logs["compute"]
    assert os.readlink(setup.prefix / "current") == release
    assert os.readlink(setup.prefix / "venv") == "current/venv"
    assert [p.name for p in (setup.prefix / "releases").iterdir()] == [setup.sha[:16]]
    envs = list((setup.prefix / release).glob("venv-*"))
    assert len(envs) == 1 and os.readlink(setup.prefix / release / "venv") == envs[0].name


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
    assert (setup.prefix / "venv").resolve().parent.parent == setup.prefix / "releases"
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
    versions = setup.root / "compute" / "etc" / "efa-versions"
    expected = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train.environment",
            "--instance-type",
            "p3dn.24xlarge",
            "--versions",
            str(versions),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert profile.endswith(expected)
    # no EFA software here: the versions file names none, and the profile says so
    versions = (setup.root / "compute" / "etc" / "efa-versions").read_text()
    assert not [line for line in versions.splitlines() if not line.startswith("#")]
    assert "export FI_PROVIDER=efa  # aws-ofi-nccl version unknown: " in profile
    assert "FI_EFA_USE_DEVICE_RDMA" not in profile  # p3dn has no RDMA read
    assert not (setup.root / "head" / "profile.d").exists()


def test_nccl_tests_step_verifies_unpacks_and_builds_once(setup, runs) -> None:
    build = setup.prefix / "nccl-tests" / "fake" / "build"
    assert (build / "all_reduce_perf").exists()
    args = (build / "make-args").read_text()
    assert f"NCCL_HOME={setup.env['BOOTSTRAP_NCCL_HOME']}" in args
    assert f"CUDA_HOME={setup.env['CUDA_HOME']}" in args
    assert args.rstrip().endswith("MPI=")  # no MPI here: built without it
    both = "".join(setup.log(n) for n in NODES)
    assert both.count("nccl-tests: downloaded") == 1
    assert "(sha256 ok)" in both


def test_every_log_line_is_timestamped(setup, runs) -> None:
    steps = {}
    for node in NODES:
        lines = [line for line in setup.log(node).splitlines() if STAMP.match(line)]
        steps[node] = {line.split("] ", 1)[1].split(":", 1)[0] for line in lines}
    assert steps["compute"] >= {"on-node-configured", "node-checks", "nccl-profile", "nccl-tests"}
    assert steps["head"] >= {"on-node-configured", "python-env", "head-node-services"}
    # command output (pip's) goes to the log as well, unstamped, between stamped step lines
    assert "Successfully installed" in setup.log("head") + setup.log("login")


def test_head_node_installs_its_services_and_only_it(setup, runs) -> None:
    units = setup.root / "head" / "units"
    assert sorted(p.name for p in units.iterdir()) == [
        "hpc-train-doctor.service",
        "hpc-train-doctor.timer",
        "hpc-train-metrics.service",
    ]
    metrics = (units / "hpc-train-metrics.service").read_text()
    assert f"ExecStart={setup.prefix}/venv/bin/hpc-train metrics serve" in metrics
    # the docs through `current`: still there when an update prunes this release
    assert f"file://{setup.prefix}/current/src/docs/" in metrics
    assert setup.calls("head")[:2] == [
        "daemon-reload",
        "enable --now hpc-train-metrics.service hpc-train-doctor.timer",
    ]
    assert not (setup.root / "login" / "units").exists() and setup.calls("login") == []
    # a compute node gets only the timer that follows `current` onto its own disk
    assert sorted(p.name for p in (setup.root / "compute" / "units").iterdir()) == [
        "hpc-train-follow.service",
        "hpc-train-follow.timer",
    ]
    assert setup.calls("compute") == ["daemon-reload", "enable --now hpc-train-follow.timer"]


def test_compute_node_imports_from_its_own_copy(setup, runs) -> None:
    """The compute node's venv is a copy on its disk; the head and login nodes' names /shared's."""
    release, local = setup.sha[:16], setup.root / "compute" / "local"
    assert os.readlink(local / "current") == f"releases/{release}"
    assert os.readlink(local / "venv") == "current/venv"
    code = "import sys, torch, hpc_train; print(sys.prefix, hpc_train.__file__, torch.__file__)"
    out = subprocess.run(
        [str(local / "venv" / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=setup.root,  # not the repository: its hpc_train would shadow the installed one
    ).stdout.split()
    assert out[0] == str(local / "venv")
    for path in out[1:]:  # the modules come from the copy, not from the shared prefix
        assert Path(path).resolve().is_relative_to(local / "releases" / release), path
    env = Path(os.path.realpath(local / "venv"))
    assert (env / ".manifest").is_file() and f"#!{env}/bin/python" in (
        env / "bin" / "pip"
    ).read_text()
    assert "node-local copy ready" in setup.log("compute")
    for node in ("head", "login"):
        link = setup.root / node / "local" / "venv"
        assert os.readlink(link) == str(setup.prefix / "venv"), node


def test_second_run_changes_nothing_and_says_already_done(setup, runs) -> None:
    for node, proc in runs["again"].items():
        assert proc.returncode == 0, f"{node}:\n{proc.stderr}"
    assert runs["after"] == runs["before"]
    assert len(setup.calls("head")) == 2  # nothing reloaded or restarted
    compute, head = runs["second_log"]["compute"], runs["second_log"]["head"]
    for log in (compute, head):
        assert "unchanged" in log and "already done: nccl-tests fake" in log
        assert "building" not in log and "+ " not in log  # no command ran the second time
    assert f"source: {setup.prefix}/current -> releases/{setup.sha[:16]} already" in head
    assert "already done: head-node services" in head
    assert "already done: prune" in head


def test_wrong_checksum_is_refused_and_leaves_nothing(setup, tmp_path: Path) -> None:
    env = {**setup.node("bad"), "BOOTSTRAP_PREFIX": str(tmp_path / "prefix")}
    for script in (ENTRY, UPDATED):
        proc = entry(env, "--node-type", "HeadNode", "--source", str(setup.tarball),
                     "--sha256", "0" * 64, script=script)  # fmt: skip
        assert proc.returncode == 1
        assert f"sha256 mismatch for {setup.tarball}: expected {'0' * 64}" in proc.stderr
        assert list((tmp_path / "prefix" / "releases").iterdir()) == []
        assert not (tmp_path / "prefix" / "current").exists()


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


# --- new code: on-node-updated.sh (its own prefix, no torch: a few seconds per release) ---


def variant(setup: Setup, tag: str) -> tuple[Path, str]:
    """The project tarball plus a file naming the release: another sha256, another release."""
    path = setup.root / f"hpc-train-src-{tag}.tar.gz"
    marker = setup.root / f"RELEASE-{tag}"
    marker.write_text(f"{tag}\n")
    with tarfile.open(path, "w:gz") as tar:
        for name in project_files():
            tar.add(REPO / name, arcname=name, recursive=False)
        tar.add(marker, arcname="RELEASE")
    return path, sha256(path)


@pytest.fixture(scope="module")
def updates(setup: Setup) -> dict[str, object]:
    """Create with release A; update to B, B again, C; then the head node's creation-time action
    (release A's args) runs again, and a compute node boots."""
    env = {
        **setup.node("uhead"),
        "BOOTSTRAP_PREFIX": str(setup.root / "uprefix"),
        "BOOTSTRAP_TORCH_SPEC": "",
    }
    compute_env = {**setup.node("ucompute"), **{k: env[k] for k in ("BOOTSTRAP_PREFIX",)}}
    tarballs = {"A": (setup.tarball, setup.sha), "B": variant(setup, "B"), "C": variant(setup, "C")}

    def args(tag: str) -> list[str]:
        path, sha = tarballs[tag]
        return ["--node-type", "HeadNode", "--source", str(path), "--sha256", sha]

    prefix = setup.root / "uprefix"
    out: dict[str, object] = {"prefix": prefix, "sha": {t: s for t, (_p, s) in tarballs.items()}}
    out["create"] = entry(env, *args("A"))
    out["to_B"] = entry(env, *args("B"), script=UPDATED)
    out["calls_B"] = setup.calls("uhead")
    out["releases_B"] = sorted(p.name for p in (prefix / "releases").iterdir())
    before = manifest(prefix, setup.root / "uhead" / "units")
    out["B_again"] = entry(env, *args("B"), script=UPDATED)
    out["B_again_same"] = manifest(prefix, setup.root / "uhead" / "units") == before
    out["calls_B_again"] = setup.calls("uhead")
    out["to_C"] = entry(env, *args("C"), script=UPDATED)
    out["releases_C"] = sorted(p.name for p in (prefix / "releases").iterdir())
    out["recreate"] = entry(env, *args("A"))
    out["compute"] = entry(
        compute_env, "--node-type", "ComputeFleet", "--instance-type", "p4d.24xlarge"
    )
    return out


def _release(updates, tag: str) -> str:
    return updates["sha"][tag][:16]


def test_update_installs_the_new_release_and_swaps_current(setup, updates) -> None:
    for key in ("create", "to_B", "B_again", "to_C", "recreate", "compute"):
        assert updates[key].returncode == 0, f"{key}:\n{updates[key].stderr}"
    prefix = updates["prefix"]
    assert updates["releases_B"] == sorted([_release(updates, "A"), _release(updates, "B")])
    assert f"current -> releases/{_release(updates, 'B')}" in updates["to_B"].stderr
    # the running metrics service restarts to run the new code; the units did not change
    assert updates["calls_B"][2:] == ["try-restart hpc-train-metrics.service"]
    assert (prefix / "current" / "src" / "RELEASE").read_text() == "C\n"
    assert os.readlink(prefix / "venv") == "current/venv"
    python = prefix / "venv" / "bin" / "python"
    code = "import hpc_train, sys; print(sys.prefix)"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    assert Path(proc.stdout.strip()).resolve().parent == prefix / "releases" / _release(
        updates, "C"
    )


def test_update_run_twice_changes_nothing(updates) -> None:
    again = updates["B_again"].stderr
    assert updates["B_again_same"]
    assert "source: already done" in again and "already done: Python environment" in again
    assert f"already done: current -> releases/{_release(updates, 'B')}" in again
    assert "building" not in again and "+ " not in again
    assert updates["calls_B_again"] == updates["calls_B"]  # no restart the second time


def test_update_prunes_to_the_newest_two_releases(updates) -> None:
    # KEEP_ENVS defaults to 2: C (current) and B stay, A (the creation's) goes
    assert updates["releases_C"] == sorted([_release(updates, "B"), _release(updates, "C")])
    assert f"pruned {updates['prefix']}/releases/{_release(updates, 'A')}" in updates["to_C"].stderr


def test_creation_args_never_move_current_back(updates) -> None:
    prefix = updates["prefix"]
    recreate = updates["recreate"].stderr
    assert f"current -> releases/{_release(updates, 'C')} already" in recreate
    assert "source: unpacked" not in recreate and "building" not in recreate
    assert os.readlink(prefix / "current") == f"releases/{_release(updates, 'C')}"
    assert _release(updates, "A") not in {p.name for p in (prefix / "releases").iterdir()}
    compute = updates["compute"].stderr
    assert f"using {prefix}/current -> releases/{_release(updates, 'C')}" in compute
