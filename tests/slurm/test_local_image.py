"""The local cluster's container pieces, without Slurm: slurm/local/build-image.sh (a real image,
built into a temporary directory and run with the real runc) and slurm/local/oci-run.sh (run
against a fake runc that records what it was given; Slurm's generated bundle is made by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.contract import IMAGE_MARKER
from hpc_train.job import container

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "slurm" / "local" / "build-image.sh"
OCI_RUN = REPO / "slurm" / "local" / "oci-run.sh"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("image") / "hpc-train"
    venv = Path(sys.prefix)
    done = subprocess.run(["bash", str(BUILD), "--venv", str(venv), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    return out


@pytest.mark.slow
def test_the_image_has_its_own_environment_and_marker_and_borrows_only_the_os(image):
    rootfs = image / "rootfs"
    marker = json.loads((rootfs / IMAGE_MARKER.lstrip("/")).read_text())
    assert marker["image"] == "hpc-train-local" and len(marker["key"]) == 16
    python = rootfs / container.IMAGE_PYTHON.lstrip("/")
    target = os.path.realpath(python)  # the base interpreter, never the project's venv
    assert not target.startswith(sys.prefix) and target.startswith(sys.base_prefix)
    site = next((rootfs / "opt/hpc-train/venv/lib").glob("python3*/site-packages"))
    assert (site / "hpc_train" / "worker" / "train.py").is_file()  # installed, not editable
    assert not list(site.glob("__editable__*")) and (site / "torch").is_dir()
    assert (
        (rootfs / "opt/hpc-train/venv/bin/torchrun")
        .read_text()
        .startswith(f"#!{container.IMAGE_PYTHON}\n")
    )
    spec = json.loads((image / "config.json").read_text())
    assert spec["linux"]["namespaces"] == [{"type": "mount"}]  # host network, pids, hostname
    assert spec["root"]["readonly"] is True and "hostname" not in spec
    binds = {m["destination"]: m["options"] for m in spec["mounts"] if m["type"] == "bind"}
    assert all("ro" in binds[d] for d in ("/usr", "/lib", "/bin", "/etc", sys.base_prefix))
    # the host's project tree is not in the image
    assert not any(m["source"].startswith(str(REPO)) for m in spec["mounts"])


@pytest.mark.slow
def test_runc_runs_the_images_python_with_the_project_from_the_image(image, tmp_path):
    """Real runc (root here), the run's bundle as submit writes it: the project imported inside
    is the image's copy, and the marker is there; no Slurm involved."""
    bundle = tmp_path / "bundle"
    container.write_bundle(bundle, image, (), Path("/"))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["args"] = [container.IMAGE_PYTHON, "-c", (
        "import hpc_train, json; from hpc_train.contract import image_marker; "
        "print(hpc_train.__file__); print(json.loads(image_marker())['image'])"
    )]  # fmt: skip
    (bundle / "config.json").write_text(json.dumps(spec))
    done = subprocess.run(
        ["runc", "--root", str(tmp_path / "state"), "run", "t", "-b", str(bundle)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    where, name = done.stdout.split()
    assert where.startswith("/opt/hpc-train/venv/") and name == "hpc-train-local"


@pytest.mark.slow
def test_a_second_build_with_nothing_changed_is_the_cached_image(image):
    before = (image / "rootfs" / IMAGE_MARKER.lstrip("/")).read_text()
    done = subprocess.run(
        ["bash", str(BUILD), "--venv", sys.prefix, "--out", str(image)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "up to date" in done.stderr, done.stderr
    assert (image / "rootfs" / IMAGE_MARKER.lstrip("/")).read_text() == before


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", str(BUILD), "--nope"], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run(["bash", str(BUILD), "--venv", str(tmp_path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "no Python environment" in done.stderr


def slurm_bundle(root: Path, env: dict[str, str]) -> Path:
    """A bundle as slurmstepd generates it per node: the step's environment, no task identity."""
    bundle = root / "spool" / "oci-job00007-00000"
    bundle.mkdir(parents=True)
    spec = {"process": {"args": ["true"], "env": [f"{k}={v}" for k, v in env.items()]},
            "root": {"path": str(root / "rootfs")}}  # fmt: skip
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@pytest.fixture
def fake_runc(tmp_path) -> Path:
    """Records its arguments and the environment of the spec it was pointed at (-b)."""
    runc = tmp_path / "runc"
    runc.write_text(
        "#!/usr/bin/env bash\n"
        'b=${@: -1}\necho "$@" > "$(dirname "$0")/runc.args"\n'
        'cp "$b/config.json" "$(dirname "$0")/runc.spec"\n'
    )
    runc.chmod(0o755)
    return runc


@pytest.mark.parametrize(
    ("node", "task", "per_node", "expected"),
    [
        ("n1", 0, "1(x3)", {"SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}),
        ("n3", 0, "1(x3)", {"SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}),
        ("n3", 1, "2,1,2", {"SLURM_NODEID": "2", "SLURM_PROCID": "4", "SLURM_LOCALID": "1"}),
    ],
)
def test_oci_run_gives_each_task_its_identity_then_runs_runc(
    tmp_path, fake_runc, node, task, per_node, expected
):
    """Slurm 22.05 leaves SLURM_PROCID/NODEID/LOCALID out of the container's environment (every
    task would be task 0); oci-run.sh derives them as slurmstepd does."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")  # enough for show hostnames
    env = {"SLURM_CONF": str(conf), "SLURM_STEP_NODELIST": "n[1-3]",
           "SLURM_STEP_TASKS_PER_NODE": per_node, "PATH": "/usr/bin:/bin"}  # fmt: skip
    bundle = slurm_bundle(tmp_path, env)
    cid = f"{node}.root.7.0.{task}"
    done = subprocess.run(
        ["bash", str(OCI_RUN), str(bundle), node, str(task), cid, str(fake_runc), "/state"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "runc.args").read_text().split()
    assert args == ["--root=/state", "run", cid, "-b", str(bundle / f"task-{task}")]
    got = dict(e.split("=", 1) for e in json.loads((tmp_path / "runc.spec").read_text())
               ["process"]["env"])  # fmt: skip
    assert {k: got[k] for k in expected} == expected and got["SLURMD_NODENAME"] == node
    assert got["SLURM_STEP_NODELIST"] == "n[1-3]"  # the step's own variables kept
    original = json.loads((bundle / "config.json").read_text())["process"]["env"]
    assert not any(e.startswith("SLURM_PROCID=") for e in original)  # Slurm's copy untouched
