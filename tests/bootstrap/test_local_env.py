"""bootstrap/: compute nodes import from a copy of the release on their own disk (lib.sh
install_local_release, on-node-updated.sh --node-type ComputeFleet). Real venvs, tiny: each
"release" is a venv (python -m venv, ~3 s) with a one-module wheel holding a console script,
installed by pip at the shared path; the copy is made into a temporary node-local prefix and
imported from, with the shared release moved away to prove nothing comes from it."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# Real venvs built and copied (~20 s in all): the full suite, not the fast tier.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "bootstrap"
UPDATED = BOOTSTRAP / "on-node-updated.sh"


def wheel(tmp: Path, version: str) -> Path:
    """A minimal wheel: module tinypkg (its version) and a console script tiny-where."""
    files = {
        "tinypkg/__init__.py": f"VERSION = {version!r}\n",
        "tinypkg/cli.py": "import sys, tinypkg\n\ndef main():\n"
        "    print(sys.prefix, tinypkg.__file__, tinypkg.VERSION)\n",
        f"tinypkg-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n",
        f"tinypkg-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"tinypkg-{version}.dist-info/entry_points.txt": "[console_scripts]\ntiny-where = tinypkg.cli:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"tinypkg-{version}.dist-info/RECORD,,")
    path = tmp / f"tinypkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"tinypkg-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp)),
        "BOOTSTRAP_PREFIX": str(tmp / "shared"),
        "BOOTSTRAP_LOCAL_PREFIX": str(tmp / "local"),
        "BOOTSTRAP_LOG_DIR": str(tmp / "log"),
        "BOOTSTRAP_LOG_FILE": str(tmp / "log" / "bootstrap.log"),
        **extra,
    }


def lib(tmp: Path, script: str) -> subprocess.CompletedProcess[str]:
    code = f"set -euo pipefail; source {BOOTSTRAP / 'lib.sh'}; {script}"
    (tmp / "log").mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", code], env=env(tmp), capture_output=True, text=True)


def release(tmp: Path, name: str) -> Path:
    """What the head node makes: releases/NAME/{src,venv-k1,venv}, the venv built at its shared
    path by python -m venv + pip, then make_current (which writes the manifest)."""
    rel = tmp / "shared" / "releases" / name
    shutil.copytree(BOOTSTRAP, rel / "src" / "bootstrap")
    venv = rel / "venv-k1"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel(tmp, name.lstrip("r") + ".0")),
        ],
        check=True,
    )
    (venv / ".complete").write_text("test\n")
    os.symlink("venv-k1", rel / "venv")
    (rel / ".stamp").write_text("")
    made = lib(tmp, f"make_current {rel}")
    assert made.returncode == 0, made.stderr
    return rel


def follow(tmp: Path) -> subprocess.CompletedProcess[str]:
    """One run of the compute node's timer: the current release's on-node-updated.sh."""
    script = tmp / "shared" / "current" / "src" / "bootstrap" / UPDATED.name
    return subprocess.run(
        ["bash", str(script), "--node-type", "ComputeFleet"],
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )


def where(tmp: Path) -> list[str]:
    """sys.prefix, the module's file and version, from the console script and from python -c."""
    local = tmp / "local" / "venv" / "bin"
    script = subprocess.run([str(local / "tiny-where")], capture_output=True, text=True, check=True)
    code = "import sys, tinypkg; print(sys.prefix, tinypkg.__file__, tinypkg.VERSION)"
    python = subprocess.run(
        [str(local / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    # the script's shebang names the copy itself (releases/<sha16>/venv-<key>), python -c the link
    ours, theirs = script.stdout.split(), python.stdout.split()
    assert [os.path.realpath(p) for p in ours[:2]] == [os.path.realpath(p) for p in theirs[:2]]
    assert ours[2] == theirs[2]
    return theirs


@pytest.fixture
def node(tmp_path: Path) -> Path:
    release(tmp_path, "r1")
    return tmp_path


def test_the_copy_imports_without_the_shared_release(node: Path) -> None:
    first = follow(node)
    assert first.returncode == 0, first.stderr
    local = node / "local"
    copy = local / "releases" / "r1" / "venv-k1"
    assert "node-local copy ready" in first.stderr and "manifest ok" in first.stderr
    assert os.readlink(local / "current") == "releases/r1"
    assert os.readlink(local / "venv") == "current/venv"
    assert not list((local / "releases").glob(".copy.*"))
    # the shared release out of the way: the copy needs nothing from it
    shared = node / "shared" / "releases" / "r1"
    shared.rename(shared.with_name("away"))
    try:
        prefix, module, version = where(node)
    finally:
        shared.with_name("away").rename(shared)
    assert prefix == str(local / "venv") and version == "1.0"
    assert Path(module).resolve().is_relative_to(copy)
    assert (copy / "bin" / "tiny-where").read_text().startswith(f"#!{copy}/bin/python")
    assert f'"{copy}"' in (copy / "bin" / "activate").read_text()
    # mtimes kept: the .pyc files pip compiled are still valid for the copied sources
    pyc = list((copy / "lib").glob("python3.*/site-packages/tinypkg/__pycache__/*.pyc"))
    assert pyc and all(
        p.stat().st_mtime == (shared / p.relative_to(local / "releases" / "r1")).stat().st_mtime
        for p in pyc
    )
    again = follow(node)  # the timer's usual run: nothing new, nothing said
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_updates_are_followed_and_old_copies_pruned_never_current(node: Path) -> None:
    assert follow(node).returncode == 0
    release(node, "r2")
    to_r2 = follow(node)
    assert to_r2.returncode == 0, to_r2.stderr
    assert where(node)[2] == "2.0"
    assert sorted(p.name for p in (node / "local" / "releases").iterdir()) == ["r1", "r2"]
    release(node, "r3")
    to_r3 = follow(node)
    assert where(node)[2] == "3.0"
    assert f"pruned {node}/local/releases/r1" in to_r3.stderr
    assert sorted(p.name for p in (node / "local" / "releases").iterdir()) == ["r2", "r3"]
    # rolled back to r2 on the head node: the copy there is reused, r3 kept (newest two)
    lib(node, f"make_current {node}/shared/releases/r2")
    back = follow(node)
    assert back.returncode == 0 and "already done: node-local copy" in back.stderr
    assert where(node)[2] == "2.0"


def test_a_copy_that_does_not_match_the_manifest_is_refused(node: Path) -> None:
    assert follow(node).returncode == 0
    rel = release(node, "r2")
    init = next((rel / "venv-k1" / "lib").glob("python3.*/site-packages/tinypkg/__init__.py"))
    init.write_text("VERSION = 'tampered'\n")  # the tree changed after its manifest
    bad = follow(node)
    assert bad.returncode == 1 and "does not match its .manifest" in bad.stderr
    assert os.readlink(node / "local" / "current") == "releases/r1"  # untouched
    assert not (node / "local" / "releases" / "r2" / "venv-k1").exists()
    assert not list((node / "local" / "releases").glob(".copy.*"))
    assert where(node)[2] == "1.0"


def test_head_node_links_the_shared_env_and_compute_refuses_a_source(tmp_path: Path) -> None:
    assert lib(tmp_path, "link_shared_env").returncode == 0
    assert os.readlink(tmp_path / "local" / "venv") == str(tmp_path / "shared" / "venv")
    proc = subprocess.run(
        [
            "bash",
            str(UPDATED),
            "--node-type",
            "ComputeFleet",
            "--source",
            "x",
            "--sha256",
            "ab" * 32,
        ],
        env=env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "a compute node installs no release" in proc.stderr


def test_follow_timer_units_are_written_once(tmp_path: Path) -> None:
    stub = tmp_path / "systemctl"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    stub.chmod(0o755)
    script = (
        f"HPC_TRAIN_SYSTEMD_DIR={tmp_path}/units HPC_TRAIN_SYSTEMCTL={stub} install_follow_timer"
    )
    assert lib(tmp_path, script).returncode == 0
    assert lib(tmp_path, script).returncode == 0
    assert (tmp_path / "calls").read_text().splitlines() == [
        "daemon-reload",
        "enable --now hpc-train-follow.timer",
    ]
    service = (tmp_path / "units" / "hpc-train-follow.service").read_text()
    assert f"BOOTSTRAP_LOCAL_PREFIX={tmp_path}/local" in service
    assert (
        f"{tmp_path}/shared/current/src/bootstrap/on-node-updated.sh --node-type ComputeFleet"
        in service
    )
