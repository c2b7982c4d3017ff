"""Slurm's environment, one property per variable (``hpc_core.slurm_env``), and the code that
reads no ``SLURM_*`` variable but through it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpc_core import slurm_env
from hpc_core.slurm_env import SlurmEnv

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hpc_core", "hpc_train", "nccl_checks", "benchmarks")
A_NAME = re.compile(r"SLURMD?_[A-Z_]+")  # a variable's whole name (docstrings say more)

JOB = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_NODELIST": "n[1-3]",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "3",
    "SLURM_LOCALID": "0",
    "SLURM_CPUS_PER_TASK": "4",
    "SLURM_CPUS_ON_NODE": "8",
    "SLURMD_NODENAME": "n2",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
}


def test_each_property_reads_its_variable():
    env = SlurmEnv(JOB)
    assert (env.job_id, env.job_nodelist, env.job_num_nodes) == ("41", "n[1-3]", 3)
    assert (env.restart_count, env.procid, env.ntasks, env.localid) == (2, 1, 3, 0)
    assert (env.cpus_per_task, env.cpus_on_node) == (4, 8)
    assert (env.nodename, env.conf) == ("n2", "/etc/slurm/slurm.conf")


def test_unset_or_empty_reads_as_none_and_a_count_that_is_no_number_too():
    empty = SlurmEnv({})
    assert empty.job_id is None and empty.nodename is None and empty.conf is None
    assert empty.restart_count == 0  # a job's first start: Slurm sets no count yet
    assert empty.procid is None and empty.job_num_nodes is None
    odd = SlurmEnv({"SLURM_JOB_ID": "", "SLURM_CPUS_ON_NODE": "8(x2)", "SLURM_PROCID": "-1"})
    assert odd.job_id is None and odd.cpus_on_node is None and odd.procid is None


def test_it_reads_this_process_environment_at_each_read(monkeypatch):
    env = SlurmEnv()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert env.job_id is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert env.job_id == "7" and SlurmEnv().job_id == "7"


def test_the_environment_without_the_jobs_variables_or_without_slurms():
    env = SlurmEnv({**JOB, "SLURM_JOBID": "41", "PATH": "/bin", "SLURM_STEP_ID": "0"})
    assert env.outside_job() == {k: v for k, v in env.env.items() if "JOB" not in k}
    assert env.clients_only() == {"PATH": "/bin", "SLURMD_NODENAME": "n2",
                                  "SLURM_CONF": "/etc/slurm/slurm.conf"}  # fmt: skip


def names_outside() -> list[str]:
    """Every string in the code that is a Slurm variable's name, outside ``slurm_env``."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where == "hpc_core/slurm_env.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), where)):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and A_NAME.fullmatch(value):
                    found.append(f"{where}:{node.lineno}: {value}")
    return found


def test_no_other_module_reads_or_names_a_slurm_variable():
    """``os.environ.get("SLURM_...")`` anywhere else would be a second reader of the variable
    (five there were: the launcher, nccl_checks' all-reduce, main and sweep, data.bpe)."""
    assert names_outside() == []


def test_the_scan_would_find_one(monkeypatch, tmp_path):
    (tmp_path / "hpc_train").mkdir()
    (tmp_path / "hpc_train" / "probe.py").write_text(
        '"""Reads SLURM_PROCID (a docstring: not a name)."""\n'
        'import os\nrank = os.environ.get("SLURM_PROCID")\n'
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert names_outside() == ["hpc_train/probe.py:3: SLURM_PROCID"]


@pytest.mark.parametrize("name", [n for n in dir(slurm_env) if n.isupper()])
def test_every_name_is_slurms(name):
    assert getattr(slurm_env, name).startswith(("SLURM_", "SLURMD_"))
