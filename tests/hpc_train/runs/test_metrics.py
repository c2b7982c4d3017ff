"""hpc-train metrics: the families from a run's ledger, train.log and heartbeats (Slurm mocked),
checked by the real `promtool check metrics`; the textfile written atomically; the HTTP server."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train.contract import Beat
from hpc_train.runs import index, metrics

PROMTOOL = shutil.which("promtool")
NOW = 10_000.0


def require_promtool() -> str:
    # not a skip: promtool is part of the system packages (slurm/local/install-packages.sh)
    assert PROMTOOL, (
        "promtool not found: install Debian's `prometheus` package (make install-system)"
    )
    return PROMTOOL


def write_run(save: Path, job: str = "42", running: bool = True) -> index.Run:
    """A run two starts in: a crash, a node blamed twice (quarantined), saves, beats."""
    rd = RunDir(save)
    rec = lambda kind, t, restart=0, **d: ledger.record(rd.ledger, kind, job, restart, t, **d)  # noqa: E731
    rec("submitted", 9000, max_update=100, name="demo")
    rec("started", 9010, nodes=["n1", "n2"])
    rec("first_update", 9030, update=1)
    rec("checkpoint", 9100, update=10, seconds=2.0)
    rec("blamed", 9150, node="n2", why="hang")
    rec("blamed", 9160, node="n2", why="hang")
    rec("stopped", 9200, cause="crash", reached=15, last_progress=9190)
    rec("started", 9300, 1, nodes=["n1", "n3"], resume_at=10, previous="crash (rank 0): boom")
    rec("first_update", 9320, 1, update=11)
    rec("checkpoint", 9400, 1, update=20, seconds=1.0)
    rec("checkpoint", 9500, 1, update=30, seconds=1.0)
    rd.train_log.write_text(
        "2026-01-01 00:00:00 | INFO | train_inner | epoch 001:     31 / 100 loss=9.5, "
        "wps=1234.5, num_updates=31\n"
    )
    beat = rd.heartbeat(job, 1, "n1", 0)
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps(Beat(0, "n1", 1, 31, NOW - 50, "train", 2.0, 1.5).__dict__))
    return index.Run(save, job, "demo", 100)


def running(job: str = "42") -> slurm.JobState:
    return slurm.JobState(job, "RUNNING", 1, "n[1,3]", "None")


def samples(fams: list[metrics.Family]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(f.name, labels): value for f in fams for labels, value in f.samples}


def test_a_runs_progress_goodput_restarts_and_nodes_are_metrics(tmp_path):
    run = write_run(tmp_path / "run")
    view = metrics.observe(run, running(), NOW)
    got = samples(metrics.families([view], slurm_up=True))
    lab = ("42", "demo", str(tmp_path / "run"))
    assert got[("run_state", (*lab, "RUNNING"))] == 1
    assert got[("run_update", lab)] == 31 and got[("run_max_update", lab)] == 100
    assert got[("run_loss", lab)] == pytest.approx(9.5)
    assert got[("run_words_per_second", lab)] == pytest.approx(1234.5)
    assert got[("run_seconds_since_progress", lab)] == pytest.approx(50)  # the heartbeat
    assert got[("run_hang_allowance_seconds", (*lab, "on"))] == 300  # max(floor 300, 10 x 2 s)
    assert got[("run_seconds_since_checkpoint", lab)] == pytest.approx(NOW - 9500)
    assert got[("run_checkpoint_interval_seconds", lab)] == pytest.approx(100)
    assert got[("run_restarts_total", (*lab, "crash"))] == 1
    assert got[("node_blamed_total", (*lab, "n2"))] == 2
    assert got[("node_quarantined", (*lab, "n2"))] == 1
    # the goodput is hpc_train.planning.goodput's: the parts and the productive rest make the wall
    lost = sum(v for (name, _), v in got.items() if name == "run_lost_seconds_total")
    assert lost + got[("run_productive_seconds_total", lab)] == pytest.approx(
        got[("run_wall_seconds_total", lab)]
    )
    assert got[("run_wall_seconds_total", lab)] == pytest.approx(NOW - 9000)
    assert 0 < got[("run_ettr_ratio", lab)] < 1
    assert got[("slurm_up", ())] == 1


def test_an_ended_run_has_no_ages_and_a_pending_one_its_wait(tmp_path):
    run = write_run(tmp_path / "run")
    ended = samples(metrics.families(
        [metrics.observe(run, slurm.JobState("42", "COMPLETED", 1, "", ""), NOW)], True))  # fmt: skip
    assert not any(name in ("run_seconds_since_progress", "run_seconds_since_checkpoint",
                            "run_pending_seconds") for name, _ in ended)  # fmt: skip
    ledger.record(RunDir(run.save_dir).ledger, "requeued", "42", 1, NOW - 30, by="task 0")
    pending = metrics.observe(run, slurm.JobState("42", "PENDING", 2, "", "BeginTime"), NOW)
    got = samples(metrics.families([pending], True))
    assert got[("run_pending_seconds", ("42", "demo", str(run.save_dir)))] == pytest.approx(30)


def test_a_corrupt_ledger_line_and_a_vanished_dir_are_counted_not_raised(tmp_path):
    run = write_run(tmp_path / "run")
    with RunDir(run.save_dir).ledger.open("a") as f:
        f.write('{"event": "checkpoint", "time": 9600, "jo\n')
    gone = index.Run(tmp_path / "nowhere", "43", "gone")
    views = [metrics.observe(r, running(r.job or ""), NOW) for r in (run, gone)]
    got = samples(metrics.families(views, True))
    assert got[("run_problems", ("42", "demo", str(run.save_dir)))] == 1
    assert got[("run_problems", ("43", "gone", str(tmp_path / "nowhere")))] == 1
    assert got[("run_state", ("43", "gone", str(tmp_path / "nowhere"), "RUNNING"))] == 1


def test_the_textfile_is_valid_exposition_and_written_atomically(tmp_path, monkeypatch, capsys):
    promtool = require_promtool()
    run = write_run(tmp_path / "run")
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    ledger.index_run("42", run.save_dir, "demo", 100)
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: {"42": running()})
    out = tmp_path / "textfile"
    out.mkdir()
    assert metrics.main(["write", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [metrics.TEXTFILE]  # no temporary left
    text = (out / metrics.TEXTFILE).read_text()
    assert (
        f'hpc_train_run_update{{run="demo",save_dir="{run.save_dir}",slurm_job="42"}} 31.0' in text
    )
    assert "hpc_train_run_restarts_total{" in text and "hpc_train_run_lost_seconds_total{" in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert metrics.main(["write", "-"]) == 0
    printed = capsys.readouterr().out
    assert 'slurm_job="42"} 31.0' in printed


def test_serve_answers_a_scrape(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run")
    collector = metrics.RunsCollector(lambda: ([run], None))
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: {"42": running()})
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        server.shutdown()
    assert (
        f'hpc_train_run_update{{run="demo",save_dir="{run.save_dir}",slurm_job="42"}} 31.0' in body
    )


@pytest.mark.parametrize(
    "argv, said",
    [
        (["serve", "--port", "70000"], "--port 70000: not a TCP port"),
        (["write", "/no/such/dir"], "/no/such/dir: not a directory"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as ended:
        metrics.main(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_an_unwritable_textfile_dir_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    def refuse(path: Path, data: bytes) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(metrics, "atomic_write", refuse)
    with pytest.raises(SystemExit) as ended:
        metrics.main(["write", str(tmp_path), "--save-dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert f"cannot write {tmp_path / metrics.TEXTFILE}: Permission denied" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_the_hang_allowance_is_the_runs_own_as_submit_recorded_it(tmp_path, monkeypatch):
    """`submit --hang-timeout-floor 10 --hang-factor 3` is in the ledger: the gauge (and the
    alert on it) follows that run's watchdog, not the defaults; --no-watchdog: the defaults',
    labelled watchdog="off"."""
    from hpc_train import submit
    from hpc_train.job.limits import HangLimits, Watch
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training

    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    lab = ("42", "demo", str(tmp_path / "run"))
    run = write_run(tmp_path / "run")
    spec = JobSpec(
        Training("tiny", tmp_path / "d", tmp_path / "run"),
        sizing=Sizing(gpus_per_node=0),
        watch=Watch(hang=HangLimits(factor=10, floor_s=10.0)),
    )
    submit.record_submission(spec, "42", NOW - 10)
    got = samples(metrics.families([metrics.observe(run, running(), NOW)], slurm_up=True))
    assert got[("run_hang_allowance_seconds", (*lab, "on"))] == 20  # max(floor 10, 10 x 2 s)
    quiet = JobSpec(
        Training("tiny", tmp_path / "d", tmp_path / "run"),
        sizing=Sizing(gpus_per_node=0),
        watch=Watch(no_watchdog=True),
    )
    submit.record_submission(quiet, "42", NOW - 5)
    got = samples(metrics.families([metrics.observe(run, running(), NOW)], slurm_up=True))
    # --no-watchdog: the default limits' allowance, marked, so HpcTrainNoProgress still fires
    assert got[("run_hang_allowance_seconds", (*lab, "off"))] == 300  # max(floor 300, 10 x 2 s)
    assert ("run_hang_allowance_seconds", (*lab, "on")) not in got
    # --no-watchdog with its own --hang-* limits: judged by those (the doctor's test run uses it)
    limits = HangLimits(floor_s=10.0, factor=3)
    own = JobSpec(
        Training("tiny", tmp_path / "d", tmp_path / "run"),
        sizing=Sizing(gpus_per_node=0),
        watch=Watch(no_watchdog=True, hang=limits),
    )
    submit.record_submission(own, "42", NOW - 1)
    got = samples(metrics.families([metrics.observe(run, running(), NOW)], slurm_up=True))
    assert got[("run_hang_allowance_seconds", (*lab, "off"))] == 10  # max(floor 10, 3 x 2 s)


def test_after_a_resume_the_checkpoint_interval_is_the_runs_and_the_age_counts_from_the_start(
    tmp_path,
):
    """Requeued after saves every 100 s, the new start has not saved yet: the interval is the
    run's (not absent until two new saves), and the age counts from the resume (the queue wait
    is no stale checkpoint) - 400 s into a start that never saved is over 3x the interval."""
    rd = RunDir(tmp_path / "run")
    rec = lambda kind, t, restart=0, **d: ledger.record(rd.ledger, kind, "42", restart, t, **d)  # noqa: E731
    rec("submitted", 0, max_update=100, name="demo")
    rec("started", 10, nodes=["n1"])
    for t, update in ((100, 10), (200, 20), (300, 30)):
        rec("checkpoint", t, update=update, seconds=1.0)
    rec("stopped", 350, cause="notice", reached=32)
    rec("requeued", 350, by="submitit (notice)")
    rec("started", 3000, 1, nodes=["n2"], previous="saved on notice (SIGUSR2) at update 32")
    run = index.Run(rd.root, "42", "demo", 100)
    lab = ("42", "demo", str(rd.root))
    got = samples(metrics.families([metrics.observe(run, running(), 3150)], True))
    assert got[("run_checkpoint_interval_seconds", lab)] == pytest.approx(100)
    assert got[("run_seconds_since_checkpoint", lab)] == pytest.approx(150)
    got = samples(metrics.families([metrics.observe(run, running(), 3400)], True))
    assert got[("run_seconds_since_checkpoint", lab)] > 3 * got[
        ("run_checkpoint_interval_seconds", lab)]  # fmt: skip
    rec("checkpoint", 3500, 1, update=40, seconds=1.0)
    rec("checkpoint", 3560, 1, update=45, seconds=1.0)  # the current start's own pace wins
    got = samples(metrics.families([metrics.observe(run, running(), 3600)], True))
    assert got[("run_checkpoint_interval_seconds", lab)] == pytest.approx(60)
    assert got[("run_seconds_since_checkpoint", lab)] == pytest.approx(40)
    pending = metrics.observe(run, slurm.JobState("42", "PENDING", 2, "", "BeginTime"), 3600)
    assert ("run_seconds_since_checkpoint", lab) not in samples(metrics.families([pending], True))
