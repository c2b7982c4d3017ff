"""Runs inside the local image on the local Slurm (tiny preset, 2 emulated nodes): Slurm's own
``--container`` (oci.conf, runc) runs the launcher, torchrun and the ranks inside the OCI image
that slurm/local/build-image.sh builds (once per session, cached under .local/images)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.contract import IMAGE_MARKER, read_beats
from hpc_train.job import container

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PER_UPDATE = ("--log-interval", "1")
WATCHDOG = (
    "--hang-timeout-floor", "10", "--hang-factor", "10",
    "--hang-save-timeout", "60", "--hang-startup-timeout", "180",
)  # fmt: skip


@pytest.fixture(scope="session")
def local_image(slurm_cluster) -> Path:
    """The local image, as `make local-image` builds it (reused while nothing changed)."""
    done = subprocess.run(["bash", str(REPO / "slurm/local/build-image.sh")],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def in_image(local_image: Path) -> tuple[str, ...]:
    return ("--container", str(local_image))


def image_lines(save: Path) -> list[str]:
    return [
        ln for ln in RunDir(save).train_log.read_text().splitlines() if "runs in the image" in ln
    ]


def runc_tasks(job: str) -> list[str]:
    """The parent's command of each ``runc run`` of this job's step 0 (container id
    ``NODE.USER.JOB.STEP.TASK``, oci.conf's pattern)."""
    parents = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"run" not in argv or not any(a.endswith(b"runc") for a in argv[:1]):
                continue
            if not any(f".{job}.0.".encode() in a for a in argv):
                continue
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            parents.append(Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return parents


def test_a_tiny_run_inside_the_image_completes_and_its_ranks_run_there(runs, local_image):
    runs.wait_idle_nodes(2)
    job, save = runs.submit("boxed", 300, fairseq=PER_UPDATE, extra_cli=in_image(local_image))
    runs.wait_for_update(save, 20)
    # while it trains: each rank's root is the container's (its marker is there), not the host's
    beats = [b for d in RunDir(save).state.glob("heartbeats/*/*") for b in read_beats(d)]
    assert len({b.node for b in beats}) == 2, beats
    key = json.loads((local_image / "rootfs" / IMAGE_MARKER.lstrip("/")).read_text())["key"]
    for beat in beats:
        marker = Path(f"/proc/{beat.pid}/root") / IMAGE_MARKER.lstrip("/")
        assert json.loads(marker.read_text())["key"] == key, beat
    # each node's task is runc itself, a child of slurmstepd: a signal to the step (the notice)
    # reaches runc, which passes it on; a shell between them would die of USR2 and end the step
    tasks = runc_tasks(job)
    assert len(tasks) == 2 and all(parent.startswith("slurmstepd") for parent in tasks), tasks
    final = runs.wait_done(job)
    assert final.state == "COMPLETED", runs.explain(save, job)
    assert runs.summary(save).updates == 300
    said = image_lines(save)
    assert {ln.split("rank ")[1].split(" ")[0] for ln in said} == {"0", "1"}, said
    assert all(key in ln for ln in said)
    assert not Path("/opt/hpc-train/image.json").exists()  # the host has no marker: a real test
    # the launcher and submitit ran in the image too: their interpreter is the image's
    bundle = json.loads((RunDir(save).oci_bundle / "config.json").read_text())
    assert str(save) in [m["destination"] for m in bundle["mounts"]]
    assert container.IMAGE_PYTHON in (RunDir(save).slurm_logs / f"{job}_submission.sh").read_text()


def test_a_preemption_inside_the_image_loses_no_update(runs, local_image):
    runs.wait_idle_nodes(2)
    job, save = runs.submit(
        "boxed-preempted", 300, fairseq=PER_UPDATE, extra_cli=in_image(local_image)
    )
    runs.wait_running(job)
    runs.wait_for_update(save, 15)
    chaos.preempt(job, partition="high", hold_s=2)
    runs.wait_for("the notice", lambda: len(runs.notices(save)) == 1, 120)
    final = runs.wait_done(job)
    assert final.state == "COMPLETED", runs.explain(save, job)
    assert final.restarts >= 1
    assert runs.trained_updates(save) == list(range(1, 301))  # none twice, none skipped
    assert len(image_lines(save)) == 4  # both ranks, both starts, in the image


def test_a_hang_inside_the_image_is_detected_with_its_stacks(runs, local_image):
    runs.wait_idle_nodes(2)
    job, save = runs.submit(
        "boxed-hang", 300, nodes="1-2", fairseq=(*PER_UPDATE, "--save-interval-updates", "10"),
        extra_cli=(*WATCHDOG, *in_image(local_image)),
    )  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    runs.wait_for_update(save, 25)
    victim = nodes[-1]
    try:
        assert chaos.hang(job, victim) == victim
        runs.wait_for("the restart after the hang",
                      lambda: "start #2" in runs.launcher_log(save, job), timeout=180)  # fmt: skip
        final = runs.wait_done(job)
    finally:
        runs.give_back(victim)
    assert final.state == "COMPLETED", runs.explain(save, job)
    incident = RunDir(save).incident(job, 0)
    stacks = sorted(incident.glob("stacks-rank*.txt"))
    assert len(stacks) == 1 and "File " in stacks[0].read_text()  # the live rank's, from inside
    assert runs.summary(save).updates == 300
