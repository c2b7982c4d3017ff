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
