"""One geometry per start, from every node's report (pure), and the launcher refusing a start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.contract import NodeReport
from hpc_train.faults.suspects import Evidence
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Recovery, SlurmJob, Training
from hpc_train.launch import geometry, launcher, starts
from nccl_checks import gpu, preflight

FIXTURES = Path(__file__).resolve().parents[2] / "nccl_checks" / "fixtures"


def reports(*gpus: int) -> list[NodeReport]:
    return [NodeReport(i, f"n{i + 1}", g) for i, g in enumerate(gpus)]


def test_healthy_nodes_run_what_was_asked_capped_by_what_they_have():
    assert geometry.from_reports(8, reports(8, 8)) == geometry.Geometry(2, 8, True)
    assert geometry.from_reports(4, reports(8, 8)).ranks_per_node == 4
    assert geometry.from_reports(8, reports(4, 4)).ranks_per_node == 4  # g5-style nodes, honest


def test_no_gpu_anywhere_is_the_cpu_fallback():
    assert geometry.from_reports(8, reports(0, 0)) == geometry.Geometry(2, 1, False)
    assert geometry.from_reports(0, reports(8, 8)) == geometry.Geometry(2, 1, False)


def test_a_node_short_of_gpus_is_refused_by_name_whichever_task_it_is():
    shape = geometry.from_reports(8, reports(7, 8, 0))  # n1 lost a GPU, n3's CUDA is broken
    assert shape.ranks_per_node == 8 and shape.bad_nodes == ("n1", "n3")
    assert shape.refused == (
        "node(s) n1 (7), n3 (0) see fewer GPUs than the 8 per node this start needs"
    )


def test_a_quarantined_node_is_refused_before_anything_else():
    shape = geometry.from_reports(8, reports(8, 0, 8), quarantined={"n3", "n9"})
    assert shape.bad_nodes == ("n3",) and "n3 quarantined" in shape.refused
    assert geometry.from_reports(8, reports(8, 8), quarantined={"n9"}).refused == ""


def test_a_node_that_failed_its_gpu_check_is_refused_on_that_evidence():
    failed = NodeReport(1, "n2", 8, "GPU check failed: GPU 3: 2 uncorrectable ECC errors")
    shape = geometry.from_reports(8, [NodeReport(0, "n1", 8), failed, NodeReport(2, "n3", 7)])
    assert shape.bad_nodes == ("n2",)  # the failed check first: n3 is refused at the next start
    assert shape.refused == "n2: GPU check failed: GPU 3: 2 uncorrectable ECC errors"
    assert geometry.from_reports(8, reports(8, 8)).refused == ""


@pytest.mark.nogpu
def test_the_node_check_runs_only_where_the_job_asks_and_never_fails_without_a_driver():
    """No NVIDIA driver here: the check that --node-check asks for says so and is no failure (the
    start sees no GPU and refuses the node for that); one not asked for is never run."""
    said: list[str] = []

    def spec(gpus: int, check: str = "auto", itype: str = "p3dn.24xlarge") -> JobSpec:
        sizing = Sizing(gpus_per_node=gpus, instance_type=itype)
        return JobSpec(Training("tiny", Path("/d"), Path("/s")), sizing=sizing,
                       slurm=SlurmJob(node_check=check))  # fmt: skip

    p3dn = spec(8)  # auto: on for p3dn
    assert p3dn.checks_nodes and starts.node_health(p3dn, 8, said.append) == ""
    assert said and said[0].startswith("GPU check: not checked (")
    said.clear()
    for off in (spec(8, "off"), spec(8, itype="p5.48xlarge"), spec(0, "on")):
        assert not off.checks_nodes and starts.node_health(off, 8, said.append) == ""
    assert said == []
    assert spec(8, "on", "p5.48xlarge").checks_nodes


class NoTorchrun(launcher.Launcher):
    def torchrun_command(self, start, nproc, args):
        raise AssertionError("a refused start never runs torchrun")


def test_task_0_refuses_the_start_drains_requeues_and_excludes_the_short_node(tmp_path, fake_slurm):
    """Task 1 (n2) reported 6 GPUs (its report written here as its launcher would)."""
    run = RunDir(tmp_path)
    run.node_report("41", 0, 1).parent.mkdir(parents=True)
    run.node_report("41", 0, 1).write_text(json.dumps({"task": 1, "node": "n2", "gpus": 6}))
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=8),
                   slurm=SlurmJob(node_check="off"))  # fmt: skip  # n2's GPUs
    with pytest.raises(RuntimeError, match=r"start refused: node\(s\) n2 \(6\) see fewer GPUs"):
        NoTorchrun(spec).run(launcher.Start("41", 0, 2, "n1", 0, ("n1", "n2")), gpus=8)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n2"])]
    assert [node for node, _ in fake_slurm.drained] == ["n2"]
    kinds = [(e.kind, e.get("node") if e.kind == "blamed" else e.get("cause"))
             for e in ledger.read(run.ledger)]  # fmt: skip
    assert kinds == [("stopped", "bad node"), ("blamed", "n2"), ("requeued", None)]
    with pytest.raises(RuntimeError, match="task 0 requeues"):  # task 1 reads the refusal
        NoTorchrun(spec).run(launcher.Start("41", 1, 2, "n1", 0, ("n1", "n2")), gpus=6)
    assert fake_slurm.requeued == ["41"]


def test_a_refused_start_with_the_budget_spent_in_the_job_stops_instead_of_requeueing(
    tmp_path, fake_slurm
):
    """--max-restarts 1, spent by an in-job restart (Slurm's count still 0): the refusal asks
    the one budget (``restarts_spent``), not Slurm's count alone: no requeue is left."""
    run = RunDir(tmp_path)
    ledger.record(run.ledger, "restarted", "41", 0, round=1)
    run.node_report("41", 0, 1).parent.mkdir(parents=True, exist_ok=True)
    run.node_report("41", 0, 1).write_text(json.dumps({"task": 1, "node": "n2", "gpus": 6}))
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(gpus_per_node=8),
        slurm=SlurmJob(node_check="off"),
        recovery=Recovery(max_restarts=1),
    )
    with pytest.raises(RuntimeError, match=r"no restarts left \(--max-restarts 1\)"):
        NoTorchrun(spec).run(launcher.Start("41", 0, 2, "n1", 0, ("n1", "n2")), gpus=8)
    assert fake_slurm.requeued == []


def test_a_node_whose_gpu_check_failed_is_blamed_drained_and_left_out(tmp_path, fake_slurm):
    """Task 1 (n2) wrote the report its launcher writes when its check fails: the check's own
    verdict on a recorded p3dn state (GPU 3 with uncorrectable ECC errors, pages pending, XID 48;
    no V100 here, so the state is a recorded one). Task 0 refuses the start, blames n2 on a
    failed health check (drained at once: evidence about the node itself), requeues and
    excludes it."""
    state = gpu.load_state(FIXTURES / "gpu_state_p3dn_ecc.json")
    failed = preflight.node("p3dn.24xlarge", state).failed
    assert failed.startswith("GPU check failed: GPU 3: 2 uncorrectable ECC errors")
    run = RunDir(tmp_path)
    run.node_report("41", 0, 1).parent.mkdir(parents=True)
    report = {"task": 1, "node": "n2", "gpus": 8, "health": failed}
    run.node_report("41", 0, 1).write_text(json.dumps(report))
    # n2's check is the test's; task 0's would read this machine's NVML, no p3dn's
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=8),
                   slurm=SlurmJob(node_check="off"))  # fmt: skip
    with pytest.raises(RuntimeError, match="start refused: n2: GPU check failed: GPU 3"):
        NoTorchrun(spec).run(launcher.Start("41", 0, 2, "n1", 0, ("n1", "n2")), gpus=8)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n2"])]
    assert [node for node, _ in fake_slurm.drained] == ["n2"]
    [blamed] = [e for e in ledger.read(run.ledger) if e.kind == "blamed"]
    assert blamed.get("node") == "n2" and blamed.get("evidence") == str(Evidence.HEALTH_CHECK)
    assert blamed.get("drained") is True
