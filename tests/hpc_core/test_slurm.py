import os

import pytest

from hpc_core import slurm


def test_parse_record_joins_values_with_spaces():
    rec = slurm.parse_record(
        "NodeName=n4 Arch=x86_64 State=IDLE+DRAIN Reason=bad link [root@2026-11-22T02:00:00] CPUTot=2"
    )
    assert rec["NodeName"] == "n4"
    assert rec["Reason"] == "bad link [root@2026-11-22T02:00:00]"
    assert rec["CPUTot"] == "2"


def test_unreachable_controller_gives_the_local_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(slurm.SlurmError, match="make cluster-up"):
        slurm.ensure_reachable()


@pytest.mark.slurm
def test_real_cluster_answers_and_expands_hostnames(slurm_cluster):
    assert os.environ["SLURM_CONF"] == str(slurm_cluster)
    slurm.ensure_reachable()
    assert slurm.hostnames("n[1-3]") == ["n1", "n2", "n3"]
    assert slurm.node_info("n1")["NodeName"] == "n1"
    assert slurm.job_state("999999999").state == "GONE"
