"""The submit CLI: golden job scripts per preset, dry-run, and one-line errors (exit 2)."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_train import submit
from hpc_train.job import presets
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Notifications, Recovery, SlurmJob, Training, validate

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PYTHON = "/lustre/hpc-train/venv/bin/python"  # fixed so golden files do not depend on this machine


def golden_spec(preset: str) -> JobSpec:
    gpus = 0 if preset == "tiny" else 8
    return JobSpec(
        Training(preset, Path("/lustre/data-bin/wikitext-103"), Path(f"/lustre/runs/{preset}")),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=gpus),
        slurm=SlurmJob(partition="gpu"),
    )


def golden_text(preset: str) -> str:
    spec = golden_spec(preset)
    line, plan = submit.training_command(spec, validate(spec, check_paths=False))
    return f"{submit.render_sbatch(spec, python=PYTHON)}\n# {plan}\n{line}\n"


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_generated_job_script_matches_golden_file(preset):
    path = GOLDEN / f"{preset}.sbatch"
    text = golden_text(preset)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"regenerate with UPDATE_GOLDEN=1 and review {path}"


def test_dry_run_renders_exactly_what_submitit_submits(tmp_path):
    import submitit

    spec = golden_spec("roberta-large")
    spec = replace(spec, training=replace(spec.training, save_dir=tmp_path))
    executor = submitit.SlurmExecutor(folder=spec.run_dir.slurm_logs)
    executor.update_parameters(**submit.sbatch_parameters(spec))
    real = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert submit.render_sbatch(spec) == real


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.submit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_issue_example_dry_run_needs_no_slurm(tmp_path):
    proc = run_cli(
        "--preset", "roberta-large", "--nodes", "2", "--gpus-per-node", "8",
        "--data", "D", "--save-dir", "S", "--dry-run",
        env={"SLURM_CONF": str(tmp_path / "no-such.conf")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("#SBATCH --nodes=2", "#SBATCH --requeue", "#SBATCH --ntasks-per-node=1"):
        assert needle in out
    assert "--nnodes=2" in out and "--nproc_per_node=8" in out and "--rdzv_backend=c10d" in out
    assert "--arch roberta_large" in out and "--update-freq 4" in out
    assert "--adam-betas '(0.9, 0.98)'" in out and "--fp16" in out
    assert not Path("S").exists()  # a dry run writes nothing


def test_args_after_double_dash_reach_fairseq():
    proc = run_cli(
        "--preset", "tiny", "--gpus-per-node", "0", "--data", "D", "--save-dir", "S",
        "--dry-run", "--", "--validate-interval-updates", "7",
    )  # fmt: skip
    assert proc.returncode == 0
    command = next(line for line in proc.stdout.splitlines() if line.startswith("torchrun "))
    assert command.endswith("--validate-interval-updates 7")
    assert "# speed levers for CPU ranks" in proc.stdout  # then the levers, listed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "gpt-9"], "unknown preset"),
        (["--preset", "tiny", "--nodes", "0"], "at least 1 node"),
        (["--preset", "tiny", "--global-batch", "4", "--nodes", "2"], "smaller than one step"),
        (["--preset", "tiny", "--max-update", "0"], "--max-update"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run_cli(*args, "--gpus-per-node", "0", "--data", "D", "--save-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_missing_and_unbinarized_data_are_refused(tmp_path):
    for data in (tmp_path / "missing", tmp_path):
        proc = run_cli(
            "--preset", "tiny", "--gpus-per-node", "0", "--data", str(data),
            "--save-dir", str(tmp_path / "s"),
        )  # fmt: skip
        assert proc.returncode == 2
        assert "--data" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unwritable_save_dir_is_refused(tmp_path, corpus):
    (tmp_path / "f").write_text("")
    proc = run_cli(
        "--preset", "tiny", "--gpus-per-node", "0", "--data", str(corpus),
        "--save-dir", str(tmp_path / "f/x"),
    )  # fmt: skip
    assert proc.returncode == 2 and "not writable" in proc.stderr


def test_no_slurm_reachable_says_how_to_start_the_local_one(tmp_path, corpus):
    proc = run_cli(
        "--preset", "tiny", "--gpus-per-node", "0", "--data", str(corpus),
        "--save-dir", str(tmp_path / "s"), env={"SLURM_CONF": str(tmp_path / "no.conf")},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "make cluster-up" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_preflight_adds_the_allreduce_check_before_training():
    tiny = golden_spec("tiny")
    spec = replace(tiny, slurm=replace(tiny.slurm, preflight=True))
    setup = submit.setup_lines(spec)
    check = next(line for line in setup if "nccl_checks allreduce" in line)
    assert "--backend=gloo" in check and "--nodes=2" in check and "exit" in check
    assert "nccl_checks" not in "".join(submit.setup_lines(golden_spec("tiny")))


def test_elastic_range_lets_slurm_allocate_as_many_nodes_as_are_free():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=1, nodes_max=4, gpus_per_node=0),
    )
    script = submit.render_sbatch(spec)
    assert "#SBATCH --nodes=1-4" in script
    assert "--ntasks-per-node" not in script  # with it, Slurm allocates only MIN nodes


def test_hot_spares_are_allocated_beside_the_nodes_that_train_best_effort():
    """--nodes 2 --spares 1 asks Slurm for 2-3 nodes, without --ntasks-per-node (with it Slurm
    settles for MIN): a start takes the spare when it is free and never waits for it. The
    pre-flight checks the 2 nodes that train first."""
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        slurm=SlurmJob(preflight=True),
        recovery=Recovery(spares=1),
    )
    script = submit.render_sbatch(spec)
    assert "#SBATCH --nodes=2-3" in script and "--ntasks-per-node" not in script
    assert "#SBATCH --no-kill" in script  # a lost node no longer ends the allocation ...
    assert "_log.err --no-kill " in script  # srun: ... nor the other nodes' tasks
    assert "--no-kill" not in submit.render_sbatch(
        JobSpec(Training("tiny", Path("/d"), Path("/s")))
    )
    check = next(line for line in submit.setup_lines(spec) if "nccl_checks allreduce" in line)
    assert "--nodes=2" in check


def test_a_partition_sbatch_refuses_is_one_line_and_exit_2(tmp_path, corpus, slurm_cluster):
    """Real Slurm: sbatch says no; the user reads its reason, not submitit's traceback."""
    proc = run_cli(
        "--preset", "tiny", "--gpus-per-node", "0", "--data", str(corpus),
        "--save-dir", str(tmp_path / "s"), "--partition", "nope",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "sbatch refused the job" in proc.stderr and "invalid partition" in proc.stderr.lower()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_mail_options_pass_through_to_sbatch():
    spec = JobSpec(
        Training("tiny", Path("/d"), Path("/s")),
        sizing=Sizing(gpus_per_node=0),
        notify=Notifications(mail_user="me@lab.org", mail_type="END,FAIL"),
    )
    script = submit.render_sbatch(spec)
    assert "#SBATCH --mail-user=me@lab.org" in script and "#SBATCH --mail-type=END,FAIL" in script
    assert "--mail" not in submit.render_sbatch(JobSpec(Training("tiny", Path("/d"), Path("/s"))))


def test_an_unknown_mail_type_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--preset", "tiny", "--data", str(tmp_path), "--save-dir", str(tmp_path), "--dry-run"]
    with pytest.raises(SystemExit) as exit_:
        submit.main([*argv, "--mail-type", "end,sometimes"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--mail-type 'end,sometimes'" in err
    assert len(err.strip().splitlines()) == 1


def test_a_save_that_cannot_fit_the_partitions_grace_time_is_a_warning(tmp_path, slurm_cluster):
    """Real Slurm: the local `low` partition preempts with GraceTime=30; `high` is never
    preempted. A roberta-large save (~61 s estimated on Lustre) does not fit 30 s."""
    assert slurm.grace_time_s("low") == 30 and slurm.grace_time_s(None) == 30  # the default
    assert slurm.grace_time_s("high") is None
    base = ["--preset", "roberta-large", "--data", "D", "--save-dir", "S", "--dry-run"]
    low = run_cli(*base, "--partition", "low")
    assert low.returncode == 0, low.stderr
    assert "does NOT fit the partition GraceTime at preemption (30 s)" in low.stderr
    high = run_cli(*base, "--partition", "high")
    assert high.returncode == 0 and "GraceTime" not in high.stderr


def test_a_resubmission_keeps_the_quarantined_nodes_out(tmp_path):
    """The save dir's quarantine list (nodes blamed twice within a day) becomes --exclude."""
    from hpc_core import ledger
    from hpc_train.faults import quarantine

    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=0))
    assert "--exclude" not in submit.render_sbatch(spec)
    for restart in (0, 1):
        ledger.record(spec.run_dir.ledger, "blamed", "7", restart, node="n3", why="hang")
    quarantine.update(spec.run_dir)
    assert "#SBATCH --exclude=n3" in submit.render_sbatch(spec)


def fake_slurm_run(controller_up: bool, asked: list[list[str]]):
    """A fake of ``slurm.run`` (the one way to Slurm's clients): `scontrol ping` answers at once,
    UP or refused; a partition query answers only when the controller is up, and otherwise
    fails the test (the real client would wait for the controller, 9-60 s)."""

    def run(args, timeout=30.0, check=True):
        asked.append(list(args))
        if list(args[:2]) == ["scontrol", "ping"]:
            if controller_up:
                return "Slurmctld(primary) at vm is UP\n"
            raise slurm.SlurmUnreachable(
                "`scontrol ping`: Unable to contact slurm controller (connect failure)"
            )
        if controller_up and list(args[:3]) == ["scontrol", "show", "partition"]:
            return "PartitionName=low Default=YES PreemptMode=REQUEUE GraceTime=30 State=UP\n"
        pytest.fail(f"the dry run waited for a controller: {' '.join(args)}")

    return run


DRY_LARGE = ["--preset", "roberta-large", "--nodes", "2", "--gpus-per-node", "8",
             "--data", "D", "--save-dir", "S", "--dry-run"]  # fmt: skip


def test_a_dry_run_never_waits_for_a_controller_and_says_what_it_did_not_ask(
    tmp_path, monkeypatch, capsys
):
    """No controller answers: one `scontrol ping` (refused at once), never a query that waits;
    stderr names what was not asked. With no config at all, not even the ping."""
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm, "run", fake_slurm_run(False, asked))
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert submit.main([*DRY_LARGE, "--partition", "low"]) == 0
    err = capsys.readouterr().err
    assert asked == [["scontrol", "ping"]]
    assert "dry run: Slurm not asked for the GraceTime of partition low" in err
    assert "(`scontrol show partition`): `scontrol ping`: Unable to contact" in err
    asked.clear()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert submit.main(DRY_LARGE) == 0
    err = capsys.readouterr().err
    assert asked == []  # the client would retry reading a missing config for a minute
    assert f"of the default partition (`scontrol show partition`): SLURM_CONF={tmp_path}" in err


def test_a_dry_run_with_a_controller_asks_the_grace_time(tmp_path, monkeypatch, capsys):
    """A controller that answers: the partition's GraceTime is asked and warned about (the
    real-Slurm version: test_a_save_that_cannot_fit_the_partitions_grace_time_is_a_warning)."""
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm, "run", fake_slurm_run(True, asked))
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert submit.main(DRY_LARGE) == 0
    err = capsys.readouterr().err
    assert [a[:3] for a in asked] == [["scontrol", "ping"], ["scontrol", "show", "partition"]]
    assert "does NOT fit the partition GraceTime at preemption (30 s)" in err
    assert "not asked" not in err


def test_submit_validates_once_and_reuses_its_plan(tmp_path, monkeypatch, capsys):
    """validate() runs once per submit (a dry run or a real one) and its largest-world plan
    is the one the dry run prints: the batch plan is never derived a second time."""
    from types import SimpleNamespace

    checks: list[bool] = []
    validating: list[bool] = []
    owner = JobSpec.batch_plan  # the one place the plan is derived

    def counting(spec, check_paths=True):
        checks.append(check_paths)
        validating.append(True)
        try:
            return validate(spec, check_paths)
        finally:
            validating.pop()

    def derived_again(spec, world_size, gpu):
        if not validating:
            raise AssertionError("the batch plan derived again after validate()")
        return owner(spec, world_size, gpu)

    monkeypatch.setattr(submit, "validate", counting)
    monkeypatch.setattr(JobSpec, "batch_plan", derived_again)
    monkeypatch.setattr(submit, "grace_time_s", lambda partition, dry_run=False: None)
    assert submit.main(DRY_LARGE) == 0
    assert checks == [False] and "--update-freq 4" in capsys.readouterr().out

    checks.clear()
    data = tmp_path / "data"
    data.mkdir()
    for name in ("dict.txt", "train.bin", "train.idx"):
        (data / name).write_text("")
    monkeypatch.setattr(slurm, "ensure_reachable", lambda: None)
    executor = SimpleNamespace(submit=lambda launcher: SimpleNamespace(job_id="42"))
    monkeypatch.setattr(submit, "make_executor", lambda spec: executor)
    argv = ["--preset", "tiny", "--gpus-per-node", "0", "--data", str(data)]
    assert submit.main([*argv, "--save-dir", str(tmp_path / "s")]) == 0
    assert checks == [True] and "submitted job 42" in capsys.readouterr().out


def test_the_job_never_overrides_the_nodes_efa_profile(tmp_path):
    """Issue 17: the sbatch setup exported the unknown-version set (FI_PROVIDER=efa,
    FI_EFA_USE_DEVICE_RDMA=1 on p4d) over the node's profile; now the node's profile decides."""
    from hpc_core import instances

    large = golden_spec("roberta-large")
    spec = replace(large, sizing=replace(large.sizing, instance_type="p4d.24xlarge"))
    profile = tmp_path / "hpc-train-nccl.sh"
    profile.write_text("export FI_EFA_USE_HUGE_PAGE=0\nexport NCCL_DEBUG=WARN\n")  # new software
    script = "\n".join(
        [*submit.setup_lines(spec), 'echo "${FI_PROVIDER-unset} ${FI_EFA_USE_DEVICE_RDMA-unset}"']
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FI_", "NCCL_"))}
    run = lambda: subprocess.run(  # noqa: E731
        ["bash", "-c", script], capture_output=True, text=True, check=True,
        env={**env, instances.NODE_PROFILE_ENV: str(profile)},
    ).stdout.strip()  # fmt: skip
    assert run() == "unset unset"
    profile.unlink()  # a node the bootstrap did not set up: the unknown-version set
    assert run() == "efa 1"
