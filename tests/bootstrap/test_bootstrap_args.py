"""bootstrap/: the entry scripts' arguments (as the cluster templates pass them), lib.sh's
release pruning, and nccl-profile.sh's version recording with fake EFA tools. Seconds, no venv
built: the scripts run for real against temporary directories."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "bootstrap"
CONFIGURED = BOOTSTRAP / "on-node-configured.sh"
UPDATED = BOOTSTRAP / "on-node-updated.sh"
SHA = "ab" * 32


def run(script: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ["PATH"],
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_LOG_DIR": str(tmp_path / "log"),
        "BOOTSTRAP_LOCAL_PREFIX": str(tmp_path / "local"),  # never this machine's /opt
        **env,
    }
    return subprocess.run(
        ["bash", str(script), *args], env=full, capture_output=True, text=True, timeout=120
    )


def shared_block(script: Path) -> str:
    text = script.read_text()
    return text[text.index("# >>> shared") : text.index("# <<< shared")]


def test_entry_scripts_hold_the_same_shared_block() -> None:
    # ParallelCluster downloads each entry script alone: their common part is a copy, kept equal
    assert "unpack_release()" in shared_block(CONFIGURED)
    assert shared_block(CONFIGURED) == shared_block(UPDATED)


@pytest.mark.parametrize("script", [CONFIGURED, UPDATED], ids=lambda p: p.name)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--node-type is missing"),
        (
            ["--node-type", "Toaster"],
            "--node-type 'Toaster' is not HeadNode, ComputeFleet or LoginNode",
        ),
        (["--node-type"], "--node-type needs a value"),
        (["--node-type", "HeadNode", "--bogus"], "unknown argument '--bogus'"),
        (["--node-type", "LoginNode", "--sha256", SHA], "--source and --sha256 go together"),
        (["--node-type", "HeadNode", "--source", "x", "--sha256", "12"], "is not a sha256"),
        (
            ["--node-type", "HeadNode", "--source", "http://example.com/x", "--sha256", SHA],
            "refusing an unencrypted download",
        ),
        (["--node-type", "ComputeFleet", "--instance-type", "p3dn"], "is not an instance type"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(script, args, message, tmp_path) -> None:
    proc = run(script, tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"{script.stem}.sh: ")
    assert not (tmp_path / "prefix").exists() and not (tmp_path / "log").exists()


def test_node_type_is_no_longer_read_from_cfnconfig(tmp_path) -> None:
    # ParallelCluster's docs call /etc/parallelcluster/cfnconfig unsupported: only --node-type
    cfnconfig = tmp_path / "cfnconfig"
    cfnconfig.write_text("cfn_node_type=ComputeFleet\n")
    proc = run(
        CONFIGURED, tmp_path, BOOTSTRAP_CFNCONFIG=str(cfnconfig), BOOTSTRAP_NODE_TYPE="ComputeFleet"
    )
    assert proc.returncode == 2 and "--node-type is missing" in proc.stderr
    for script in (CONFIGURED, UPDATED):
        assert "cfnconfig" not in script.read_text()


def test_who_needs_a_source(tmp_path) -> None:
    head = run(CONFIGURED, tmp_path, "--node-type", "HeadNode")
    assert head.returncode == 2 and "the head node needs --source and --sha256" in head.stderr
    update = run(UPDATED, tmp_path, "--node-type", "HeadNode")
    assert update.returncode == 2 and "--source and --sha256 are required" in update.stderr


def test_a_node_without_source_waits_for_current_then_gives_up(tmp_path) -> None:
    proc = run(
        CONFIGURED,
        tmp_path,
        "--node-type",
        "ComputeFleet",
        "--instance-type",
        "p3dn.24xlarge",
        BOOTSTRAP_WAIT_CURRENT="0",
    )
    assert proc.returncode == 1
    assert (
        f"no release in {tmp_path}/prefix/current after 0 s: the head node installs it"
        in proc.stderr
    )


def template_actions() -> list[tuple[str, str, str, list[str]]]:
    """(template, where, action, Args) for every custom action in pcluster_configs/*.yaml."""
    found = []
    for path in sorted((REPO / "pcluster_configs").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        places = [("HeadNode", config["HeadNode"])]
        places += [(f"queue {q['Name']}", q) for q in config["Scheduling"]["SlurmQueues"]]
        for where, place in places:
            for action, spec in (place.get("CustomActions") or {}).items():
                found.append((path.name, where, action, [str(a) for a in spec.get("Args", [])]))
    return found


def test_every_template_passes_arguments_the_scripts_accept(tmp_path) -> None:
    """The templates' Args, placeholders filled, get past argument checking (exit 1 here: no
    tarball, no head node), never a usage error; each names a node type and a script we ship."""
    actions = template_actions()
    assert {a for _t, _w, a, _args in actions} == {"OnNodeConfigured", "OnNodeUpdated"}
    fill = {
        "${BUCKET}": "bucket",
        "${SOURCE_SHA256}": SHA,
        "${UPDATE_SHA256}": SHA,
        "${UPDATE_SHA16}": SHA[:16],
    }
    for template, where, action, args in actions:
        args = [fill.get(a, a) for a in args]
        for key, value in fill.items():
            args = [a.replace(key, value) for a in args]
        assert "--node-type" in args, (template, where)
        node_type = args[args.index("--node-type") + 1]
        assert node_type == ("HeadNode" if where == "HeadNode" else "ComputeFleet"), template
        if "--source" in args:  # no AWS here: point it at a path that does not exist
            args[args.index("--source") + 1] = str(tmp_path / "missing.tar.gz")
        script = CONFIGURED if action == "OnNodeConfigured" else UPDATED
        proc = run(script, tmp_path / template / where, *args, BOOTSTRAP_WAIT_CURRENT="0")
        assert proc.returncode == 1, (template, where, action, proc.stderr)
        assert "cannot read" in proc.stderr or "no release in" in proc.stderr, proc.stderr


# --- lib.sh: prune_releases ---


def lib(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ["PATH"],
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_LOG_FILE": str(tmp_path / "lib.log"),
        "BOOTSTRAP_LOCAL_PREFIX": str(tmp_path / "local"),
        **env,
    }
    code = f"set -euo pipefail; source {BOOTSTRAP / 'lib.sh'}; {script}"
    return subprocess.run(["bash", "-c", code], env=full, capture_output=True, text=True)


def make_release(prefix: Path, name: str, mtime: int, envs: tuple[str, ...] = ("k1",)) -> Path:
    release = prefix / "releases" / name
    (release / "src").mkdir(parents=True)
    for key in envs:
        (release / f"venv-{key}").mkdir()
        (release / f"venv-{key}" / ".complete").write_text("")
    os.symlink(f"venv-{envs[-1]}", release / "venv")
    (release / ".stamp").write_text("")
    os.utime(release / ".stamp", (mtime, mtime))
    return release


def test_prune_keeps_the_newest_n_and_always_current(tmp_path) -> None:
    prefix = tmp_path / "prefix"
    for name, mtime in (("r1", 1000), ("r2", 2000), ("r3", 3000), ("r4", 4000)):
        make_release(prefix, name, mtime)
    make_release(prefix, "r5", 5000, envs=("old", "new"))  # a rebuilt env: venv -> venv-new
    (prefix / "releases" / ".unpack.abc123").mkdir()  # an interrupted download
    os.symlink("releases/r1", prefix / "current")  # rolled back to the oldest
    proc = lib(tmp_path, "prune_releases", BOOTSTRAP_KEEP_ENVS="2")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (prefix / "releases").iterdir()) == ["r1", "r4", "r5"]
    assert sorted(p.name for p in (prefix / "releases" / "r5").iterdir()) == [
        ".stamp",
        "src",
        "venv",
        "venv-new",
    ]
    assert (prefix / "current" / "src").is_dir()
    for gone in ("r2", "r3", ".unpack.abc123", "r5/venv-old"):
        assert f"pruned {prefix}/releases/{gone}" in proc.stderr
    again = lib(tmp_path, "prune_releases", BOOTSTRAP_KEEP_ENVS="2")
    assert "already done: prune: nothing beyond the newest 2 releases and current" in again.stderr
    one = lib(tmp_path, "prune_releases", BOOTSTRAP_KEEP_ENVS="1")
    assert sorted(p.name for p in (prefix / "releases").iterdir()) == ["r1", "r5"], one.stderr
    bad = lib(tmp_path, "prune_releases", BOOTSTRAP_KEEP_ENVS="0")
    assert (
        bad.returncode == 1 and "BOOTSTRAP_KEEP_ENVS=0: must be a whole number >= 1" in bad.stderr
    )


def test_make_current_swaps_one_link_and_first_never_moves_it(tmp_path) -> None:
    prefix = tmp_path / "prefix"
    a = make_release(prefix, "a", 1000)
    b = make_release(prefix, "b", 2000)
    assert lib(tmp_path, f"make_current {a} --first").returncode == 0
    assert os.readlink(prefix / "current") == "releases/a"
    assert os.readlink(prefix / "venv") == "current/venv"
    first = lib(tmp_path, f"make_current {b} --first; echo changed=$CURRENT_CHANGED")
    assert "current stays -> releases/a" in first.stderr and "changed=0" in first.stdout
    moved = lib(tmp_path, f"make_current {b}; echo changed=$CURRENT_CHANGED")
    assert os.readlink(prefix / "current") == "releases/b" and "changed=1" in moved.stdout
    assert not list(prefix.glob("*.new.*"))  # the temporary link was renamed, not left
    (b / "venv-k1" / ".complete").unlink()
    broken = lib(tmp_path, f"make_current {b}")
    assert broken.returncode == 1 and "has no complete Python environment" in broken.stderr


def test_make_current_hashes_the_environment_only_while_holding_the_shared_lock(tmp_path) -> None:
    """The head and a login node, both given --source at creation, reach make_current together.
    Each once hashed the environment before taking the lock, and one's `find` tripped over the
    other's vanishing .manifest.* folder (CI run 9: "cannot hash"). Here the test holds the lock:
    when make_current says it waits, nothing of the manifest exists yet; released, it is whole."""
    prefix = tmp_path / "prefix"
    release = make_release(prefix, "a", 1000)
    (release / "venv-k1" / "lib.py").write_text("x = 1\n")
    (prefix / ".bootstrap.lock").touch()
    with (prefix / ".bootstrap.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code = f"set -euo pipefail; source {BOOTSTRAP / 'lib.sh'}; make_current {release} --first"
        env = {"PATH": os.environ["PATH"], "BOOTSTRAP_PREFIX": str(prefix),
               "BOOTSTRAP_LOG_FILE": str(tmp_path / "lib.log"),
               "BOOTSTRAP_LOCAL_PREFIX": str(tmp_path / "local")}  # fmt: skip
        proc = subprocess.Popen(["bash", "-c", code], env=env, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        said = [proc.stderr.readline()]
        while "waiting for the shared lock" not in said[-1]:
            said.append(proc.stderr.readline())
            assert said[-1], said  # it ended without ever waiting
        assert not list((release / "venv-k1").glob(".manifest*")), said
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    hashed = (release / "venv-k1" / ".manifest").read_text().splitlines()
    assert sorted(line.split("  ", 1)[1] for line in hashed) == ["./.complete", "./lib.py"]
    assert not list((release / "venv-k1").glob(".manifest.*"))  # the temporary folder is gone


# --- nccl-profile.sh: versions recorded from fake EFA tools ---

FI_INFO = """#!/bin/sh
if [ "$1" = --version ]; then
    printf 'fi_info: {v}\\nlibfabric: {v}\\nlibfabric api: 1.22\\n'
fi
"""


def profile_node(
    tmp_path: Path, libfabric: str | None, plugin: str | None, nccl: str | None
) -> dict[str, str]:
    """A node: `venv` runs this interpreter (hpc_train from the repo); fake fi_info on PATH, a
    fake plugin library with aws-ofi-nccl's version string, a fake NCCL wheel's metadata."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if libfabric:
        (bin_dir / "fi_info").write_text(FI_INFO.replace("{v}", libfabric))
        (bin_dir / "fi_info").chmod(0o755)
    plugin_dir = tmp_path / "ofi-nccl" / "lib"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    if plugin:
        blob = (
            b"\x7fELF\x00\x02junk\x00NET/OFI Initializing aws-ofi-nccl "
            + plugin.encode()
            + b"\x00x\x00"
        )
        (plugin_dir / "libnccl-net-ofi.so").write_bytes(blob)
    site = tmp_path / "site"
    if nccl:
        dist = site / f"nvidia_nccl_cu12-{nccl}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: {nccl}\n"
        )
    venv_bin = tmp_path / "prefix" / "venv" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    (venv_bin / "python").write_text(
        f'#!/bin/sh\nPYTHONPATH="{site}:{REPO}" exec "{sys.executable}" "$@"\n'
    )
    (venv_bin / "python").chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_LOG_FILE": str(tmp_path / "bootstrap.log"),
        "BOOTSTRAP_FI_INFO": "",
        "BOOTSTRAP_OFI_NCCL_DIRS": str(plugin_dir),
        "BOOTSTRAP_PROFILE_DIR": str(tmp_path / "profile.d"),
        "BOOTSTRAP_VERSIONS_FILE": str(tmp_path / "etc" / "efa-versions"),
        "BOOTSTRAP_INSTANCE_TYPE": "p4d.24xlarge",
        "BOOTSTRAP_NODE_TYPE": "ComputeFleet",
    }


def nccl_profile(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BOOTSTRAP / "nccl-profile.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def exports(tmp_path: Path) -> dict[str, str]:
    text = (tmp_path / "profile.d" / "hpc-train-nccl.sh").read_text()
    return dict(re.findall(r"^export (\w+=\S+)  # (.*)$", text, flags=re.M))


@pytest.mark.skipif(sys.platform != "linux", reason="the bootstrap runs on Linux nodes")
def test_new_efa_software_is_recorded_and_needs_no_provider_or_rdma_variable(tmp_path) -> None:
    env = profile_node(tmp_path, "1.22.0amzn4.0", "1.13.2-aws", "2.27.3")
    proc = nccl_profile(env)
    assert proc.returncode == 0, proc.stderr
    versions = (tmp_path / "etc" / "efa-versions").read_text().splitlines()
    assert versions[1:] == ["libfabric=1.22.0amzn4.0", "aws-ofi-nccl=1.13.2-aws", "nccl=2.27.3"]
    names = {line.split("=")[0] for line in exports(tmp_path)}
    assert names == {"FI_EFA_USE_HUGE_PAGE", "NCCL_DEBUG"}  # p4d, new software: nothing else
    profile = (tmp_path / "profile.d" / "hpc-train-nccl.sh").read_text()
    assert "# versions: libfabric=1.22.0amzn4.0 aws-ofi-nccl=1.13.2-aws nccl=2.27.3" in profile
    again = nccl_profile(env)
    assert again.returncode == 0 and again.stderr.count("unchanged") == 2


def test_old_efa_software_gets_what_aws_ofi_nccl_documents_for_it(tmp_path) -> None:
    proc = nccl_profile(profile_node(tmp_path, "1.17.1", "1.5.0", None))
    assert proc.returncode == 0, proc.stderr
    versions = (tmp_path / "etc" / "efa-versions").read_text()
    assert "\naws-ofi-nccl=1.5.0\n" in versions and "\nnccl=" not in versions  # no NCCL wheel
    env = exports(tmp_path)
    rdma = next(why for key, why in env.items() if key.startswith("FI_EFA_USE_DEVICE_RDMA=1"))
    assert "libfabric 1.17.1, aws-ofi-nccl 1.5.0" in rdma
    assert {"FI_PROVIDER=efa", "NCCL_PROTO=simple"} <= set(env)


def test_no_efa_software_records_nothing_and_says_unknown(tmp_path) -> None:
    proc = nccl_profile(profile_node(tmp_path, None, None, None))
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "etc" / "efa-versions").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("# ")
    for name in ("libfabric", "aws-ofi-nccl", "nccl"):
        assert f"nccl-profile: {name}: not found on this node" in proc.stderr
    env = exports(tmp_path)
    assert env["FI_PROVIDER=efa"].startswith("aws-ofi-nccl version unknown")
    assert (
        "libfabric version unknown, aws-ofi-nccl version unknown" in env["FI_EFA_USE_DEVICE_RDMA=1"]
    )


def test_a_version_the_tool_garbles_is_not_recorded(tmp_path) -> None:
    proc = nccl_profile(profile_node(tmp_path, "unknown-build", None, None))
    assert proc.returncode == 0, proc.stderr
    assert 'libfabric: unrecognised version "unknown-build", not recorded' in proc.stderr
    assert "libfabric=" not in (tmp_path / "etc" / "efa-versions").read_text()


def test_an_unknown_instance_type_is_skipped_but_a_broken_table_is_not(tmp_path) -> None:
    env = profile_node(tmp_path, None, None, None)
    skipped = nccl_profile({**env, "BOOTSTRAP_INSTANCE_TYPE": "p9.huge"})
    assert skipped.returncode == 0
    assert (
        "skipped: EFA/NCCL profile: hpc_train.environment has no settings for p9.huge"
        in skipped.stderr
    )
    # any other refusal of the table (exit 2 too) stops the bootstrap instead
    stub = tmp_path / "prefix" / "venv" / "bin" / "python"
    stub.write_text('#!/bin/sh\necho "error: --versions x: line 1: bad" >&2\nexit 2\n')
    broken = nccl_profile(env)
    assert broken.returncode == 1
    assert (
        "python -m hpc_train.environment failed (exit 2): error: --versions x: line 1"
        in broken.stderr
    )
