"""bootstrap/container/{import,enable-pyxis}.sh: shellcheck, then each against a temporary prefix
with a stand-in enroot and scontrol (no enroot, pyxis or ParallelCluster AMI here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "bootstrap" / "container"
SCRIPTS = sorted(HERE.glob("*.sh"))
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(HERE / script), *args],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], **(env or {})},
        timeout=60,
    )


def stamped(stderr: str) -> None:
    for line in stderr.strip().splitlines():
        assert STAMP.match(line), f"log line without a UTC timestamp: {line!r}"


def test_scripts_pass_shellcheck_and_follow_the_house_rules():
    assert shutil.which("shellcheck"), "shellcheck is installed by `make install-system`"
    assert {s.name for s in SCRIPTS} == {"import.sh", "enable-pyxis.sh"}
    proc = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    for script in SCRIPTS:
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
        assert os.access(script, os.X_OK), script.name
        assert not re.search(r"curl[^\n|]*\|\s*(ba)?sh", text)
        assert "chmod 777" not in text


# --- import.sh -------------------------------------------------------------------------------

FAKE_ENROOT = """#!/bin/sh
# stand-in for `enroot import -o OUT IMAGE`: records its arguments, writes $FAKE_CONTENT
echo "$@" >> "$FAKE_LOG"
[ "$1" = import ] && [ "$2" = -o ] || exit 64
printf '%s' "$FAKE_CONTENT" > "$3"
exit "${FAKE_RC:-0}"
"""


@pytest.fixture
def enroot(tmp_path) -> dict[str, str]:
    fake = tmp_path / "enroot"
    fake.write_text(FAKE_ENROOT)
    fake.chmod(0o755)
    return {
        "ENROOT": str(fake),
        "IMPORT_OUTPUT_DIR": str(tmp_path / "images"),
        "FAKE_LOG": str(tmp_path / "enroot.log"),
        "FAKE_CONTENT": "hsqs and the rest of a squashfs",
    }


IMAGE = "docker://123456789012.dkr.ecr.us-east-1.amazonaws.com#hpc-train:abc123"


def test_import_writes_the_squashfs_under_its_final_name_only_when_whole(tmp_path, enroot):
    proc = run("import.sh", IMAGE, env=enroot)
    assert proc.returncode == 0, proc.stderr
    dest = tmp_path / "images" / "hpc-train+abc123.sqsh"
    assert dest.read_bytes().startswith(b"hsqs")
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no .part left
    call = (tmp_path / "enroot.log").read_text().split()
    assert call[:2] == ["import", "-o"] and call[2].startswith(f"{dest}.part.") and call[3] == IMAGE
    assert f"--container {dest}" in proc.stderr
    stamped(proc.stderr)
    again = run("import.sh", IMAGE, env=enroot)  # kept, enroot not run again
    assert again.returncode == 0 and "already there" in again.stderr
    assert len((tmp_path / "enroot.log").read_text().splitlines()) == 1
    forced = run("import.sh", "--force", "--name", "mine", IMAGE, env=enroot)
    assert forced.returncode == 0 and (tmp_path / "images" / "mine.sqsh").exists()


@pytest.mark.parametrize("content,rc", [("PK not a squashfs", "0"), ("hsqs", "1")])
def test_a_failed_or_wrong_import_leaves_nothing(tmp_path, enroot, content, rc):
    proc = run("import.sh", IMAGE, env={**enroot, "FAKE_CONTENT": content, "FAKE_RC": rc})
    assert proc.returncode == 1 and "FAILED" in proc.stderr
    assert not (tmp_path / "images").exists() or not list((tmp_path / "images").iterdir())


def test_import_dry_run_and_help_and_usage_errors(tmp_path, enroot):
    dry = run("import.sh", "--dry-run", "docker://ubuntu:22.04", env=enroot)
    assert dry.returncode == 0 and "would run" in dry.stderr and "ubuntu+22.04.sqsh" in dry.stderr
    assert not (tmp_path / "enroot.log").exists() and not (tmp_path / "images").exists()
    helped = run("import.sh", "--help")
    assert helped.returncode == 0 and "enroot import -o" in helped.stdout
    for args, needle in [
        ((), "which image"),
        (("ubuntu:22.04",), "expected docker://"),
        (("docker://nvcr.io/nvidia/pytorch:24.12-py3",), "docker://nvcr.io#nvidia/pytorch"),
        (("--bogus", IMAGE), "unknown option"),
        (("--name", "../x", IMAGE), "--name"),
    ]:
        proc = run("import.sh", *args, env=enroot)
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1


# --- enable-pyxis.sh -------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path) -> dict[str, str]:
    """A ParallelCluster >= 3.11.1 head node under tmp_path: the sample configurations in
    examples/, Slurm's etc without a plugstack.conf, a scontrol that records its calls."""
    etc = tmp_path / "opt-slurm-etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=test\n")
    examples = tmp_path / "examples"
    (examples / "spank").mkdir(parents=True)
    (examples / "pyxis").mkdir()
    (examples / "enroot").mkdir()
    (examples / "spank" / "plugstack.conf").write_text(
        f"# THIS IS AN EXAMPLE OF Spank config file\ninclude {etc}/plugstack.conf.d/*\n"
    )
    (examples / "pyxis" / "pyxis.conf").write_text(
        "required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis\n"
    )
    (examples / "enroot" / "enroot.conf").write_text(
        "ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n"
    )
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    scontrol.chmod(0o755)
    return {
        "PYXIS_SLURM_ETC": str(etc),
        "PYXIS_EXAMPLES": str(examples),
        "PYXIS_RUNTIME_DIR": str(tmp_path / "run" / "pyxis"),
        "ENROOT_CONF_DIR": str(tmp_path / "etc-enroot"),
        "ENROOT_PERSISTENT_DIR": str(tmp_path / "var" / "enroot"),
        "ENROOT_VOLATILE_DIR": str(tmp_path / "run" / "enroot"),
        "SCONTROL": str(scontrol),
    }


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.stat().st_mode)
        for p in sorted(root.rglob("*"))
    }


def reconfigures(tmp_path: Path) -> int:
    log = tmp_path / "scontrol.log"
    return log.read_text().splitlines().count("reconfigure") if log.exists() else 0


def test_enable_pyxis_on_the_head_node_then_a_second_run_changes_nothing(tmp_path, node):
    proc = run("enable-pyxis.sh", "--head", env=node)
    assert proc.returncode == 0, proc.stderr
    stamped(proc.stderr)
    etc = Path(node["PYXIS_SLURM_ETC"])
    assert f"include {etc}/plugstack.conf.d/*" in (etc / "plugstack.conf").read_text().splitlines()
    assert "spank_pyxis.so" in (etc / "plugstack.conf.d" / "pyxis.conf").read_text()
    assert (Path(node["ENROOT_CONF_DIR"]) / "enroot.conf").exists()
    for key in ("PYXIS_RUNTIME_DIR", "ENROOT_PERSISTENT_DIR", "ENROOT_VOLATILE_DIR"):
        assert oct(Path(node[key]).stat().st_mode & 0o7777) == "0o1777", key
    assert (Path(node["PYXIS_EXAMPLES"]) / "pyxis" / "pyxis.conf").exists()  # copied, not moved
    assert reconfigures(tmp_path) == 1
    before = tree(tmp_path)
    again = run("enable-pyxis.sh", env=node)
    assert again.returncode == 0, again.stderr
    assert "already enabled" in again.stderr and reconfigures(tmp_path) == 1
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if "scontrol.log" not in k} == {
        k: v for k, v in before.items() if "scontrol.log" not in k
    }


def test_an_existing_plugstack_gets_the_include_once(tmp_path, node):
    etc = Path(node["PYXIS_SLURM_ETC"])
    (etc / "plugstack.conf").write_text("required /usr/lib/slurm/other.so\n")
    assert run("enable-pyxis.sh", env=node).returncode == 0
    assert run("enable-pyxis.sh", env=node).returncode == 0
    lines = (etc / "plugstack.conf").read_text().splitlines()
    assert lines == ["required /usr/lib/slurm/other.so", f"include {etc}/plugstack.conf.d/*"]
    assert reconfigures(tmp_path) == 1


def test_compute_mode_prepares_directories_only(tmp_path, node):
    proc = run("enable-pyxis.sh", "--compute", env=node)
    assert proc.returncode == 0, proc.stderr
    assert (Path(node["ENROOT_CONF_DIR"]) / "enroot.conf").exists()
    assert not (Path(node["PYXIS_SLURM_ETC"]) / "plugstack.conf").exists()
    assert reconfigures(tmp_path) == 0


def test_dry_run_writes_nothing_and_an_old_ami_is_refused(tmp_path, node):
    before = tree(tmp_path)
    dry = run("enable-pyxis.sh", "--dry-run", env=node)
    assert dry.returncode == 0 and "would" in dry.stderr
    assert tree(tmp_path) == before
    shutil.rmtree(node["PYXIS_EXAMPLES"])
    old = run("enable-pyxis.sh", env=node)
    assert old.returncode == 1 and "ParallelCluster >= 3.11.1" in old.stderr
    assert run("enable-pyxis.sh", "--bogus", env=node).returncode == 2
    helped = run("enable-pyxis.sh", "--help")
    assert helped.returncode == 0 and "plugstack.conf.d" in helped.stdout
