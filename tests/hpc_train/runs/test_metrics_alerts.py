"""The shipped alert rules (docs/alerts/hpc-train.rules.yml): valid for the real promtool, and
every rule has a unit test on synthetic series that fires it and one that does not."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parents[3] / "docs" / "alerts"
RULES = ALERTS / "hpc-train.rules.yml"
RULE_TESTS = ALERTS / "hpc-train.rules.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool not found: install Debian's `prometheus` package (make install-system)"
    return subprocess.run([found, *args], capture_output=True, text=True, cwd=ALERTS, timeout=60)


def test_the_rules_file_is_valid():
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 7 rules found" in proc.stdout


def test_every_rule_passes_its_promtool_unit_test():
    proc = promtool("test", "rules", RULE_TESTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_rule_is_tested_both_firing_and_quiet():
    rules = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for c in t.get("alert_rule_test", [])]  # fmt: skip
    for alert in rules:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{alert}: no case where it stays quiet"


def test_the_rules_and_the_dashboard_name_only_metrics_that_exist():
    from hpc_train.runs import metrics

    exported = set()
    for fam in metrics.families([], slurm_up=True):
        name = f"{metrics.PREFIX}_{fam.name}"
        exported.add(name)
    dashboard = ALERTS / "hpc-train.dashboard.json"
    named = set(re.findall(r"hpc_train_[a-z_]+", RULES.read_text() + dashboard.read_text()))
    assert named and named <= exported, named - exported
    json.loads(dashboard.read_text())  # valid JSON (not rendered in a Grafana here)


def test_the_first_restart_counts_in_the_storm_as_the_exporter_emits_it(tmp_path):
    """The exporter's own series over four scrapes (no restart yet, then 1, 2, 3 restarts, 5
    minutes apart) through the real rules: the storm fires at the third restart, so the first
    one counted although its series only appeared with it."""
    from hpc_core import ledger, slurm
    from hpc_core.rundir import RunDir
    from hpc_train.runs import index, metrics

    save = tmp_path / "run"
    rd = RunDir(save)
    ledger.record(rd.ledger, "submitted", "8", 0, 1000, max_update=100, name="s")
    ledger.record(rd.ledger, "started", "8", 0, 1010, nodes=["n1"])
    run = index.Run(save, "8", "s", 100)
    whys = ["crash (rank 0): boom", "hang (rank 1): silent", "crash (rank 0): boom"]
    scrapes = []
    for restart in range(4):
        if restart:
            ledger.record(rd.ledger, "started", "8", restart, 1010 + 300 * restart,
                          nodes=["n1"], previous=whys[restart - 1])  # fmt: skip
        now = 1020 + 300 * restart
        view = metrics.observe(run, slurm.JobState("8", "RUNNING", restart, "n1", "None"), now)
        scrapes.append({(f"{metrics.PREFIX}_{f.name}", tuple(zip(f.labels, lab, strict=True))): v
                        for f in metrics.families([view], True) for lab, v in f.samples})  # fmt: skip
    assert not any(name.endswith("restarts_total") for name, _ in scrapes[0])
    series = []
    for key in sorted({k for s in scrapes for k in s}):
        name, labels = key
        text = ",".join(f'{k}="{v}"' for k, v in labels)
        values = " ".join(" ".join([str(s[key]) if key in s else "_"] * 5) for s in scrapes)
        series.append({"series": f"{name}{{{text}}}", "values": values})
    fire = {"alertname": "HpcTrainRestartStorm", "exp_alerts": [{
        "exp_labels": {"severity": "critical", "slurm_job": "8", "run": "s",
                       "save_dir": str(save)},
        "exp_annotations": {
            "summary": "run s (job 8) restarted 3 times in the last hour",
            "fix": "scontrol requeuehold 8; hpc-train status 8; then scontrol release 8"}}]}  # fmt: skip
    case = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "14m", "alertname": "HpcTrainRestartStorm",
                             "exp_alerts": []}, {"eval_time": "16m", **fire}]}]}  # fmt: skip
    (tmp_path / "storm.test.yml").write_text(yaml.safe_dump(case))
    found = shutil.which("promtool")
    assert found, "promtool not found: install Debian's `prometheus` package (make install-system)"
    proc = subprocess.run([found, "test", "rules", "storm.test.yml"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
