"""``--container``'s input: the image reference or squashfs file, the mounts, pyxis's srun options."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from hpc_train.contract import IMAGE_MARKER, image_marker
from hpc_train.job import container
from hpc_train.job.container import ContainerError, Mount
from tests.hpc_train.conftest import oci_image


@pytest.mark.parametrize(
    "text",
    [
        "docker://nvcr.io#nvidia/pytorch:24.12-py3",
        "docker://ubuntu:22.04",
        "docker://ubuntu",
        "docker://me@123456789012.dkr.ecr.us-east-1.amazonaws.com#hpc-train:2024-06",
        "docker://registry.local:5000#team/hpc-train:v1",
        "nvidia/cuda:12.6.3-devel-ubuntu22.04",
        "nvcr.io#nvidia/pytorch:24.12-py3",
    ],
)
def test_registry_references_in_enroots_form_are_kept_as_given(text):
    assert container.parse_image(text) == text


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("docker://nvcr.io/nvidia/pytorch:24.12-py3", "docker://nvcr.io#nvidia/pytorch:24.12-py3"),
        ("localhost/img:1", "'#', not '/'"),
        ("registry.local:5000/team/img", "docker://registry.local:5000#team/img"),
        ("dockerd://hpc-train:latest", "only docker://"),
        ("https://example.com/img.tar", "only docker://"),
        ("docker://Ubuntu:22.04", "neither a registry reference"),
        ("docker://ubuntu:bad tag", "neither a registry reference"),
        ("docker://ubuntu::1", "neither a registry reference"),
    ],
)
def test_malformed_references_are_one_line_with_the_fix(text, needle):
    with pytest.raises(ContainerError) as err:
        container.parse_image(text)
    message = str(err.value)
    assert needle in message and "\n" not in message and message.startswith("--container ")


def test_a_file_image_is_made_absolute_and_must_be_a_squashfs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert container.parse_image("img.sqsh") == str(tmp_path / "img.sqsh")
    assert container.parse_image("./x/img") == str(tmp_path / "x" / "img")
    with pytest.raises(ContainerError, match="no such file"):
        container.check_image_file(str(tmp_path / "img.sqsh"))
    (tmp_path / "img.sqsh").write_bytes(b"PK\x03\x04 not a squashfs")
    with pytest.raises(ContainerError, match="not a squashfs image"):
        container.check_image_file(str(tmp_path / "img.sqsh"))
    (tmp_path / "dir.sqsh").mkdir()  # a directory is taken for an OCI image, and is not one
    with pytest.raises(ContainerError, match="not an OCI image"):
        container.check_image_file(str(tmp_path / "dir.sqsh"))
    (tmp_path / "img.sqsh").write_bytes(b"hsqs" + bytes(92))  # squashfs's superblock magic
    container.check_image_file(str(tmp_path / "img.sqsh"))
    container.check_image_file("docker://ubuntu:22.04")  # a registry's image: not checked here


def test_mounts_parse_with_flags_and_need_an_absolute_destination(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert container.parse_mounts("/a:/b,rel:/c:ro+rprivate") == (
        Mount(Path("/a"), Path("/b")),
        Mount(tmp_path / "rel", Path("/c"), "ro+rprivate"),
    )
    assert str(Mount(Path("/a"), Path("/b"), "ro")) == "/a:/b:ro"
    for bad, needle in [
        ("/a:b", "must be an absolute path"),
        ("/a", "expected SRC:DST"),
        ("/a:/b:ro:x", "expected SRC:DST"),
        (":/b", "expected SRC:DST"),
        ("/a:/b:RO!", "FLAGS"),
        (",", "expected SRC:DST"),
    ]:
        with pytest.raises(ContainerError, match=needle):
            container.parse_mounts(bad)


def test_a_mount_source_must_exist(tmp_path):
    container.check_mount_sources([Mount(tmp_path, Path("/x"))])
    with pytest.raises(ContainerError, match="no such source"):
        container.check_mount_sources([Mount(tmp_path / "gone", Path("/x"))])


def test_job_mounts_own_paths_first_each_once_and_no_two_on_one_destination():
    save, data, local = Path("/lustre/runs/r"), Path("/lustre/data"), Path("/scratch/hpc")
    user = (Mount(Path("/lustre/tok"), Path("/tok"), "ro"), Mount(data, data))
    pyxis = container.client_mounts("docker://ubuntu:22.04")  # ParallelCluster's Slurm client
    mounts = container.job_mounts(save, data, local, user, pyxis)
    assert [str(m) for m in mounts] == [
        "/lustre/runs/r:/lustre/runs/r",
        "/lustre/data:/lustre/data",
        "/scratch/hpc:/scratch/hpc",
        *container.SLURM_CLIENT_MOUNTS,
        "/lustre/tok:/tok:ro",
    ]
    assert len(container.job_mounts(save, data, None, (), pyxis)) == 2 + len(pyxis)
    assert [str(m) for m in pyxis] == list(container.SLURM_CLIENT_MOUNTS)
    with pytest.raises(ContainerError, match="already mounted"):
        container.job_mounts(save, data, None, (Mount(Path("/elsewhere"), save),))
    with pytest.raises(ContainerError, match="may not contain"):
        container.job_mounts(Path("/lustre/a,b"), data, None)
    with pytest.raises(ContainerError, match="may not contain"):
        container.job_mounts(save, Path("/lustre/x:y"), None)


def test_srun_args_are_pyxis_options():
    mounts = (Mount(Path("/s"), Path("/s")), Mount(Path("/d"), Path("/data"), "ro"))
    assert container.srun_args("docker://ubuntu:22.04", mounts, Path("/s"), Path("/b")) == [
        "--container-image=docker://ubuntu:22.04",
        "--container-mounts=/s:/s,/d:/data:ro",
        "--container-workdir=/s",
    ]


# --- an OCI image directory: Slurm's own --container (runc) ---------------------------------------


def test_a_directory_is_an_oci_image_run_by_slurm_itself(tmp_path, slurm_with_oci):
    image = oci_image(tmp_path)
    assert container.is_oci_image(str(image)) and not container.is_oci_image(str(tmp_path / "x"))
    container.check_image_file(str(image))  # spec, rootfs, the image's python, oci.conf
    bundle = tmp_path / "run" / ".hpc-train" / "oci"
    assert container.srun_args(str(image), (), tmp_path, bundle) == [f"--container={bundle}"]
    # this cluster's own Slurm client: slurm.conf's directory and munged's socket directory
    assert container.client_mounts(str(image)) == (
        Mount(slurm_with_oci.parent, slurm_with_oci.parent),
        Mount(tmp_path / "munge", tmp_path / "munge"),
    )


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("no spec", "without config.json: not an OCI image"),
        ("bad spec", "config.json is not JSON"),
        ("no process", "has no process"),
        ("no rootfs", "no rootfs/ directory"),
        ("no python", f"no {container.IMAGE_PYTHON}"),
        ("no oci.conf", "Slurm would run the job on the host"),
    ],
)
def test_what_is_not_a_runnable_oci_image_is_one_line(tmp_path, slurm_with_oci, damage, needle):
    image = oci_image(tmp_path, python=damage != "no python")
    if damage == "no spec":
        (image / "config.json").unlink()
    elif damage == "bad spec":
        (image / "config.json").write_text("{")
    elif damage == "no process":
        (image / "config.json").write_text("{}")
    elif damage == "no rootfs":
        shutil.rmtree(image / "rootfs")
    elif damage == "no oci.conf":
        (slurm_with_oci.parent / "oci.conf").unlink()
    with pytest.raises(ContainerError, match=re.escape(needle)) as err:
        container.check_image_file(str(image))
    assert len(str(err.value).splitlines()) == 1


def test_the_runs_bundle_binds_the_images_own_tree_then_the_jobs_mounts(tmp_path):
    image = oci_image(tmp_path)
    save = tmp_path / "run"
    mounts = (Mount(save, save), Mount(tmp_path / "tok", Path("/tok"), "ro"))
    bundle = save / ".hpc-train" / "oci"
    container.write_bundle(bundle, image, mounts, save)
    spec = json.loads((bundle / "config.json").read_text())
    assert (bundle / "rootfs").is_dir() and not any((bundle / "rootfs").iterdir())
    assert spec["root"] == {"path": "rootfs", "readonly": True}  # Slurm runs the bundle's rootfs
    assert spec["process"]["cwd"] == str(save)
    binds = [(m["source"], m["destination"], m["options"]) for m in spec["mounts"]]
    assert binds[0] == ("/usr", "/usr", ["rbind", "ro"])  # the image's spec, kept first
    # the image's own tree (not its empty mount points), read-only, then the job's mounts
    assert binds[1:] == [
        (str((image / "rootfs" / "opt").absolute()), "/opt", ["rbind", "nosuid", "ro"]),
        (str(save), str(save), ["rbind", "nosuid"]),
        (str(tmp_path / "tok"), "/tok", ["rbind", "nosuid", "ro"]),
    ]
    container.write_bundle(bundle, image, mounts[:1], save)  # a resubmit: written anew, whole
    assert len(json.loads((bundle / "config.json").read_text())["mounts"]) == 3


def test_the_image_marker_is_read_only_inside_an_image(tmp_path):
    assert image_marker(tmp_path) is None  # the host: no marker
    marker = tmp_path / IMAGE_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.write_text('{"image": "hpc-train-local"}\n')
    assert image_marker(tmp_path) == '{"image": "hpc-train-local"}'
