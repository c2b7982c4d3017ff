"""A real Prometheus (Debian's, started here on a loopback port) scrapes `hpc-train metrics
serve` while a real tiny run trains on the local Slurm cluster, and sees the update advance;
`promtool check metrics` passes on the served page and on the textfile `metrics write` leaves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from hpc_core.wait import Backoff, wait_until
from hpc_train.testing import free_port

pytestmark = pytest.mark.slurm

STEADY = Backoff(0.5, 1.0, 0.5)
MAX_UPDATE = 300


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} not found: install Debian's `prometheus` package (make install-system)"
    return found


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def ready(base: str) -> bool | None:
    """Prometheus says Ready; None while it is not listening yet (refused under load: run 4)."""
    try:
        return "Ready" in get(f"{base}/-/ready") or None
    except (urllib.error.URLError, ConnectionError):
        return None


def query(base: str, expr: str) -> list[dict]:
    said = json.loads(get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"))
    assert said["status"] == "success", said
    return said["data"]["result"]


def check_metrics(text: str) -> None:
    proc = subprocess.run([tool("promtool"), "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_prometheus_scrapes_a_training_run_and_sees_its_update_advance(runs, tmp_path):
    runs.wait_idle_nodes(1)
    # paced (chaos pace, <= 10 updates/s): 30 s of training at least, for ten updates scraped
    job, save = runs.submit("metrics-scraped", MAX_UPDATE, nodes="1",
                            fairseq=("--log-interval", "1"), pace_s=0.1)  # fmt: skip
    port, prom_port = free_port(), free_port()
    served = subprocess.Popen(
        [sys.executable, "-m", "hpc_train.command", "metrics", "serve", "--port", str(port),
         "--save-dir", str(save)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )  # fmt: skip
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: hpc-train\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    prom = subprocess.Popen(
        [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    base = f"http://127.0.0.1:{prom_port}"
    try:
        assert served.stdout is not None
        assert "serving http://127.0.0.1:" in served.stdout.readline()
        wait_until(lambda: ready(base), "prometheus ready", 60, STEADY)
        runs.wait_running(job)
        runs.wait_for_update(save, 3, timeout=300)

        def update_seen() -> float | None:
            found = query(base, f'hpc_train_run_update{{slurm_job="{job}"}}')
            return (
                float(found[0]["value"][1]) if found and float(found[0]["value"][1]) > 0 else None
            )

        first = wait_until(update_seen, "an update scraped", 60, STEADY)
        later = wait_until(lambda: ((u := update_seen()) and u >= first + 10 and u) or None,
                           "the scraped update advancing", 180, STEADY)  # fmt: skip
        assert later > first
        running = query(base, f'hpc_train_run_state{{slurm_job="{job}",state="RUNNING"}}')
        assert running and running[0]["value"][1] == "1", running
        assert query(base, "hpc_train_slurm_up")[0]["value"][1] == "1"
        assert query(base, f'hpc_train_run_max_update{{slurm_job="{job}"}}')[0]["value"][1] == str(
            MAX_UPDATE
        )
        ranged = query(base, f'max_over_time(hpc_train_run_update{{slurm_job="{job}"}}[10m]) - '
                       f'min_over_time(hpc_train_run_update{{slurm_job="{job}"}}[10m])')  # fmt: skip
        assert float(ranged[0]["value"][1]) >= 10, ranged
        assert query(base, 'up{job="hpc-train"}')[0]["value"][1] == "1"
        # both outputs pass promtool: the served page, and the textfile for node_exporter
        check_metrics(get(f"http://127.0.0.1:{port}/metrics"))
        out = tmp_path / "textfile"
        out.mkdir()
        wrote = subprocess.run(
            [sys.executable, "-m", "hpc_train.command", "metrics", "write", str(out),
             "--save-dir", str(save)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        text = (out / "hpc_train.prom").read_text()
        assert f'run="metrics-scraped",save_dir="{save}",slurm_job="{job}",state=' in text
        check_metrics(text)
        final = runs.wait_done(job)
        assert final.state == "COMPLETED", runs.explain(save, job)
    finally:
        stop(prom)
        stop(served)
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
