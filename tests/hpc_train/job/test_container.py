"""``--container``'s input: the image reference or squashfs file, the mounts, pyxis's srun options."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.job import container
from hpc_train.job.container import ContainerError, Mount


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
    (tmp_path / "dir.sqsh").mkdir()
    with pytest.raises(ContainerError, match="no such file"):
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
    mounts = container.job_mounts(save, data, local, user)
    assert [str(m) for m in mounts] == [
        "/lustre/runs/r:/lustre/runs/r",
        "/lustre/data:/lustre/data",
        "/scratch/hpc:/scratch/hpc",
        *container.SLURM_CLIENT_MOUNTS,
        "/lustre/tok:/tok:ro",
    ]
    assert len(container.job_mounts(save, data, None)) == 2 + len(container.SLURM_CLIENT_MOUNTS)
    with pytest.raises(ContainerError, match="already mounted"):
        container.job_mounts(save, data, None, (Mount(Path("/elsewhere"), save),))
    with pytest.raises(ContainerError, match="may not contain"):
        container.job_mounts(Path("/lustre/a,b"), data, None)
    with pytest.raises(ContainerError, match="may not contain"):
        container.job_mounts(save, Path("/lustre/x:y"), None)


def test_srun_args_are_pyxis_options():
    mounts = (Mount(Path("/s"), Path("/s")), Mount(Path("/d"), Path("/data"), "ro"))
    assert container.srun_args("docker://ubuntu:22.04", mounts, Path("/s")) == [
        "--container-image=docker://ubuntu:22.04",
        "--container-mounts=/s:/s,/d:/data:ro",
        "--container-workdir=/s",
    ]
