"""``hpc_core.procs``: a /proc laid out in a temporary folder (environments and command lines
as the kernel writes them: NUL-separated), then this host's real /proc with a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpc_core import procs


def fake_proc(root: Path, pid: int, env: dict[str, str] | None, argv: list[str]) -> None:
    entry = root / str(pid)
    entry.mkdir()
    if env is not None:  # None: an environment this user may not read
        (entry / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))


def test_every_value_must_be_there_whole_and_another_nodes_process_is_left_out(tmp_path):
    job = {"SLURM_JOB_ID": "41"}
    fake_proc(tmp_path, 10, {**job, "SLURMD_NODENAME": "n2"}, ["python", "-m", "rank"])
    fake_proc(tmp_path, 11, {**job, "SLURMD_NODENAME": "n1"}, ["python"])  # another node's
    fake_proc(tmp_path, 12, {"SLURM_JOB_ID": "410"}, ["python"])  # 41 is not 410
    fake_proc(tmp_path, 13, {"A": "1", **job}, ["python"])  # no node: any node's
    fake_proc(tmp_path, 14, None, ["python"])  # unreadable
    (tmp_path / "self").mkdir()  # not a pid

    def pids(**kwargs) -> list[int]:
        return sorted(p.pid for p in procs.carrying(job, proc=tmp_path, **kwargs))

    assert pids() == [10, 11, 13]
    assert pids(node="n2") == [10, 13]
    assert pids(node="n2", skip={13}) == [10]
    assert sorted(p.pid for p in procs.carrying({**job, "A": "1"}, proc=tmp_path)) == [13]
    (found,) = procs.carrying(job, "n2", skip={13}, proc=tmp_path)
    assert found.environ["SLURMD_NODENAME"] == "n2" and found.cmdline() == "python -m rank "
    (tmp_path / "10" / "cmdline").unlink()  # exited meanwhile
    assert found.cmdline() is None


def test_a_real_child_is_found_by_its_environment_and_gone_once_reaped():
    env = {**os.environ, "HPC_TRAIN_PROBE": f"procs-{os.getpid()}"}
    want = {"HPC_TRAIN_PROBE": env["HPC_TRAIN_PROBE"]}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert [p.pid for p in procs.carrying(want)] == [child.pid]
        assert [p.pid for p in procs.carrying(want, skip={child.pid})] == []
    finally:
        child.kill()
        child.wait()
    assert list(procs.carrying(want)) == []
