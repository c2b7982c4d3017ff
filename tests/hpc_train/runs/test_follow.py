import json

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.runs import follow, logparse


def train_line(n, loss, wps=1000.0):
    payload = {"epoch": 1, "loss": f"{loss}", "wps": f"{wps}", "num_updates": f"{n}", "lr": "0.001"}
    return f"2026-11-22 02:27:00 | INFO | train_inner | {json.dumps(payload)}"


def test_parse_metrics_reads_json_after_any_prefix():
    assert logparse.parse_metrics(train_line(5, 9.5))["num_updates"] == 5.0
    assert logparse.parse_metrics('{"epoch": 1, "loss": "9.5"}')["loss"] == 9.5
    assert logparse.parse_metrics("no metrics here") is None
    assert logparse.parse_metrics("broken {json") is None


def test_summary_tracks_updates_losses_resumes_and_validation():
    lines = [
        train_line(5, 12.0, 900),
        train_line(10, 11.0, 1100),
        "Loaded checkpoint /s/checkpoint_last.pt (epoch 1 @ 10 updates)",
        train_line(15, 10.0, 1000),
        '{"epoch": 1, "valid_loss": "10.5", "valid_num_updates": "15"}',
        "done training in 3.1 seconds",
    ]
    s = logparse.summarize(lines)
    assert s.updates == 15
    assert (s.first_loss, s.final_loss) == (12.0, 10.0)
    assert s.mean_wps == 1000.0
    assert s.valid_loss == 10.5
    assert s.resumed_at == [10]


def test_report_names_updates_checkpoint_and_goodput(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoint_last.write_bytes(b"x")
    text = follow.report(logparse.summarize([train_line(15, 9.0)]), run, 15, "COMPLETED")
    assert "15/15 updates" in text and str(run.checkpoint_last) in text
    assert "ETTR" not in text  # no ledger, no goodput line
    ledger.record(run.ledger, "submitted", "3", 0, when=100.0)
    ledger.record(run.ledger, "started", "3", 0, when=110.0)
    ledger.record(run.ledger, "first_update", "3", 0, when=120.0, update=1)
    ledger.record(run.ledger, "finished", "3", 0, when=150.0)
    text = follow.report(logparse.summarize([train_line(15, 9.0)]), run, 15, "COMPLETED")
    assert "ETTR 60% of 50 s: queue 10 s, start-up 10 s" in text
    assert "blamed" not in text
    ledger.record(run.ledger, "blamed", "3", 0, when=130.0, node="n2",
                  why="torchrun on n2 was killed (SIGKILL)", drained=True)  # fmt: skip
    text = follow.report(logparse.summarize([train_line(15, 9.0)]), run, 15, "COMPLETED")
    said = "  blamed: n2: torchrun on n2 was killed (SIGKILL) (job 3, start #1); drained\n  ETTR"
    assert said in text


def test_the_end_of_epoch_line_counts_updates_no_interval_line_logged():
    """max-update 8 with --log-interval 5: the last interval line says 5, fairseq's end-of-epoch
    line says 8; --follow must report 8/8, not fail the run at 5/8."""
    lines = [
        train_line(5, 12.0, 900),
        '2026-11-22 13:00:00 | INFO | train | {"epoch": 1, "train_loss": "11.5", '
        '"train_num_updates": "8", "train_wps": "950"}',
    ]
    s = logparse.summarize(lines)
    assert s.updates == 8 and s.final_loss == 12.0 and s.wps == [900.0]


def test_follow_job_says_state_changes_and_hands_over_each_line_once(tmp_path, monkeypatch):
    """A fake controller (slurm.job_state replaced: no Slurm here): RUNNING twice, then done;
    a line appended after the last poll still arrives."""
    from hpc_core import slurm
    from hpc_core.wait import Backoff

    log = tmp_path / "job.log"
    log.write_text("one\ntwo\npart")
    states = iter(["RUNNING", "RUNNING", "COMPLETED"])

    def job_state(job_id):
        state = next(states)
        if state == "COMPLETED":
            with log.open("a") as fh:
                fh.write("ial\nlast\n")
        return slurm.JobState(job_id, state, 0, "n1", "")

    monkeypatch.setattr(slurm, "job_state", job_state)
    said, lines = [], []
    final = follow.follow_job("7", log, lines.append, said.append, Backoff(0.001, 1, 0.001))
    assert final.state == "COMPLETED"
    assert lines == ["one", "two", "partial", "last"]
    assert [s.split("] ", 1)[1] for s in said] == ["job 7: RUNNING n1", "job 7: COMPLETED n1"]
