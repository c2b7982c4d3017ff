"""Slurm's silence is no answer (issue 46): each look-up tells "the controller did not answer"
from an answer, by Slurm's own words. Slurm's clients are stood in for by scripts on PATH that
print what Slurm 22.05's clients printed here with slurmctld stopped (measured 2026-11-29 on the
local cluster); the real outage is tests/integration/test_slurm_silence.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.wait import Backoff

# what the clients said with slurmctld stopped (kill of its pid), and with one slurmd killed
SRUN_SILENT = "srun: error: Unable to confirm allocation for job 5: Unable to contact slurm controller (connect failure)"
SRUN_NODE_GONE = (
    "srun: error: Task launch for StepId=5.1 failed on node n2: Communication connection failure"
)
PING_DOWN = "Slurmctld(primary) at h is DOWN\n*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **"
PING_UP = "Slurmctld(primary) at h is UP"
REQUEUE_SILENT = "Unexpected message received for job 5"  # `scontrol requeue` then
CONFIG_SILENT = "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)"


def client(bin_dir: Path, name: str, *answers: tuple[int, str]) -> Path:
    """A stand-in for Slurm's client ``name``: its n-th call prints the n-th answer's text (on
    stderr when its status is not 0) and exits with it; the last answer repeats. Each call's
    arguments are appended to ``<name>.calls``."""
    calls = bin_dir / f"{name}.calls"
    calls.unlink(missing_ok=True)
    lines = [f'n=$(wc -l < "{calls}" 2>/dev/null || echo 0); echo "$*" >> "{calls}"']
    for i, (status, text) in enumerate(answers):
        stream = ">&2" if status else ""
        test = "true" if i == len(answers) - 1 else f'[ "$n" -eq {i} ]'
        lines.append(f"if {test}; then printf '%s\\n' '{text}' {stream}; exit {status}; fi")
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return calls


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake clients first on PATH; a SLURM_CONF that exists; quick back-offs."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(slurm, "SILENCE_BACKOFF", Backoff(0.01, 1.0, 0.01))
    monkeypatch.setattr(slurm, "_SLURMD_TIMEOUTS", {})
    return tmp_path


def test_the_step_probe_says_unknown_while_the_controller_is_silent(bin_dir):
    """srun cannot reach the controller and `scontrol ping` says DOWN: None, not False (False
    read as "no step starts" sent the launcher into a 300 s wait for Slurm's word)."""
    client(bin_dir, "srun", (1, SRUN_SILENT))
    client(bin_dir, "scontrol", (1, PING_DOWN))
    assert slurm.step_starts("5", "n2") is None


def test_the_step_probe_says_no_when_slurm_answers_and_the_node_does_not(bin_dir):
    client(bin_dir, "srun", (1, SRUN_NODE_GONE))
    pings = client(bin_dir, "scontrol", (0, PING_UP))
    assert slurm.step_starts("5", "n2") is False
    assert not pings.exists()  # a refusal is an answer: no ping needed
    # srun unanswered but the controller answers its ping: the node, not the controller
    client(bin_dir, "srun", (1, "srun: error: Socket timed out on send/recv operation"))
    assert slurm.step_starts("5", "n2") is False
    client(bin_dir, "srun", (0, ""))
    assert slurm.step_starts("5", "n2") is True


def test_a_requeue_unanswered_is_asked_again_until_the_controller_answers(bin_dir):
    calls = client(bin_dir, "scontrol", (1, REQUEUE_SILENT), (1, REQUEUE_SILENT), (0, ""))
    slurm.requeue("5")
    assert calls.read_text().splitlines() == ["requeue 5"] * 3


def test_a_requeue_asked_again_after_one_that_took_effect_is_done(bin_dir):
    """The first ask timed out at the client but the controller requeued the job: the second
    finds it pending ("Job is pending execution"), which is the answer, not a failure."""
    client(bin_dir, "scontrol", (1, "Socket timed out on send/recv operation"),
           (1, "Job is pending execution for job 5"))  # fmt: skip
    slurm.requeue("5")
    # asked once only, the same words are a refusal
    client(bin_dir, "scontrol", (1, "Job is pending execution for job 5"))
    with pytest.raises(slurm.SlurmError, match="pending execution"):
        slurm.requeue("5")


def test_a_controller_silent_past_patience_is_said_with_how_long(bin_dir):
    client(bin_dir, "scontrol", (1, REQUEUE_SILENT))
    with pytest.raises(slurm.SlurmUnreachable, match=r"scontrol requeue 5: no answer for \d+ s"):
        slurm.requeue("5", patience=0.05)
    refusal = client(bin_dir, "scontrol", (1, "Invalid job id specified"))
    with pytest.raises(slurm.SlurmError) as err:  # a refusal: at once, never asked again
        slurm.patient(lambda: slurm.run(["scontrol", "requeue", "5"]), "requeue", 60)
    assert not isinstance(err.value, slurm.SlurmUnreachable)
    assert len(refusal.read_text().splitlines()) == 1


def test_slurmd_timeout_is_read_once_while_the_controller_answers(bin_dir):
    """Never the 300 s default for a controller that is silent: SlurmUnreachable until it
    answers; then read once and kept (one `scontrol show config` however often asked)."""
    calls = client(bin_dir, "scontrol", (1, CONFIG_SILENT), (0, "SlurmdTimeout           = 20 sec"))
    with pytest.raises(slurm.SlurmUnreachable):
        slurm.slurmd_timeout_s()
    assert slurm.slurmd_timeout_s() == 20
    assert calls.read_text().splitlines() == ["show config"] * 2
    again = client(bin_dir, "scontrol", (1, CONFIG_SILENT))  # silent again: the value stands
    assert slurm.slurmd_timeout_s() == 20
    assert not again.exists()  # not asked
