import json
from pathlib import Path

from hpc_train import logs
from hpc_train.spec import JobSpec


def train_line(n, loss, wps=1000.0):
    payload = {"epoch": 1, "loss": f"{loss}", "wps": f"{wps}", "num_updates": f"{n}", "lr": "0.001"}
    return f"2026-11-22 02:27:00 | INFO | train_inner | {json.dumps(payload)}"


def test_parse_metrics_reads_json_after_any_prefix():
    assert logs.parse_metrics(train_line(5, 9.5))["num_updates"] == 5.0
    assert logs.parse_metrics('{"epoch": 1, "loss": "9.5"}')["loss"] == 9.5
    assert logs.parse_metrics("no metrics here") is None
    assert logs.parse_metrics("broken {json") is None


def test_summary_tracks_updates_losses_resumes_and_validation():
    lines = [
        train_line(5, 12.0, 900),
        train_line(10, 11.0, 1100),
        "Loaded checkpoint /s/checkpoint_last.pt (epoch 1 @ 10 updates)",
        train_line(15, 10.0, 1000),
        '{"epoch": 1, "valid_loss": "10.5", "valid_num_updates": "15"}',
        "done training in 3.1 seconds",
    ]
    s = logs.summarize(lines)
    assert s.updates == 15
    assert (s.first_loss, s.final_loss) == (12.0, 10.0)
    assert s.mean_wps == 1000.0
    assert s.valid_loss == 10.5
    assert s.resumed_at == [10]


def test_report_names_updates_and_checkpoint(tmp_path):
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    spec = JobSpec("tiny", Path("/d"), tmp_path, gpus_per_node=0, max_update=15)
    text = logs.report(logs.summarize([train_line(15, 9.0)]), spec, "COMPLETED")
    assert "15/15 updates" in text and str(tmp_path / "checkpoint_last.pt") in text


def test_the_end_of_epoch_line_counts_updates_no_interval_line_logged():
    """max-update 8 with --log-interval 5: the last interval line says 5, fairseq's end-of-epoch
    line says 8; --follow must report 8/8, not fail the run at 5/8."""
    lines = [
        train_line(5, 12.0, 900),
        '2026-11-22 13:00:00 | INFO | train | {"epoch": 1, "train_loss": "11.5", '
        '"train_num_updates": "8", "train_wps": "950"}',
    ]
    s = logs.summarize(lines)
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
    final = logs.follow_job("7", log, lines.append, said.append, Backoff(0.001, 1, 0.001))
    assert final.state == "COMPLETED"
    assert lines == ["one", "two", "partial", "last"]
    assert [s.split("] ", 1)[1] for s in said] == ["job 7: RUNNING n1", "job 7: COMPLETED n1"]
