"""The documented update (new code through OnNodeUpdated) passes ParallelCluster's own update check.

`validate.update_check` runs pcluster's ConfigPatch, the check `pcluster update-cluster` runs, on two
renders of a template; AWS is faked (moto) only because loading a config needs a region and
credentials, the check itself compares the two configs by each parameter's update policy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

pytest.importorskip(
    "pcluster.config.config_patch",
    reason="needs the aws extra (aws-parallelcluster + moto): pip install -e '.[aws]'",
)
pytestmark = pytest.mark.aws

from hpc_train.cluster import render, validate  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "pcluster_configs"
VALUES = yaml.safe_load((CONFIGS / "examples" / "values.yaml").read_text())
NEW_SHA = "ab" * 32
TEMPLATES = sorted(p.name for p in CONFIGS.glob("*.yaml"))
FIXTURES = Path(__file__).parent / "fixtures"


def rendered(name: str, **values: str) -> dict[str, Any]:
    return yaml.safe_load(render.render_text((CONFIGS / name).read_text(), {**VALUES, **values}))


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_documented_update_is_allowed(name: str) -> None:
    """docs/on-aws.md: upload hpc-train-src-<sha16>.tar.gz, render with --update-sha256, update."""
    allowed, changes = validate.update_check(rendered(name), rendered(name, update_sha256=NEW_SHA))
    assert allowed, [(c.path, c.reason) for c in changes]
    assert [(c.path, c.policy, c.check) for c in changes] == [
        ("HeadNode.CustomActions.OnNodeUpdated.Args", "SUPPORTED", "SUCCEEDED")
    ]
    assert not [c for c in changes if c.policy == "UNSUPPORTED"]


def test_the_update_names_the_new_tarball_and_its_sha() -> None:
    new = rendered("p3dn.yaml", update_sha256=NEW_SHA)
    args = new["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"]
    assert args[3].endswith(f"/hpc-train/hpc-train-src-{NEW_SHA[:16]}.tar.gz")
    assert args[5] == NEW_SHA
    # the creation-time action is untouched
    assert (
        rendered("p3dn.yaml")["HeadNode"]["CustomActions"]["OnNodeConfigured"]
        == (new["HeadNode"]["CustomActions"]["OnNodeConfigured"])
    )


def test_the_old_way_a_new_sha_in_on_node_configured_is_refused() -> None:
    """Before issue 17 the sha256 sat in OnNodeConfigured's Args: pcluster refuses that update."""
    allowed, changes = validate.update_check(
        rendered("p3dn.yaml"), rendered("p3dn.yaml", source_sha256=NEW_SHA)
    )
    assert not allowed
    [refused] = [c for c in changes if c.check == "FAILED"]
    assert refused.path == "HeadNode.CustomActions.OnNodeConfigured.Args"
    assert refused.policy == "UNSUPPORTED"
    assert "Update actions are not currently supported for the 'Args' parameter" in refused.reason


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.cluster", "check-update", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_cli_check_update(tmp_path: Path) -> None:
    old, new, bad = tmp_path / "old.yaml", tmp_path / "new.yaml", tmp_path / "bad.yaml"
    old.write_text(yaml.safe_dump(rendered("p3dn.yaml")))
    new.write_text(yaml.safe_dump(rendered("p3dn.yaml", update_sha256=NEW_SHA)))
    bad.write_text(yaml.safe_dump(rendered("p3dn.yaml", source_sha256=NEW_SHA)))
    proc = _cli(str(old), str(new))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: update allowed" in proc.stdout
    proc = _cli(str(old), str(bad))
    assert proc.returncode == 1
    assert "FAILED        HeadNode.CustomActions.OnNodeConfigured.Args [UNSUPPORTED]" in proc.stdout
    proc = _cli(str(old), str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "note: requeue hold" not in _cli(str(old), str(new)).stdout  # the hold stays 10 s
    slower = rendered("p3dn.yaml", update_sha256=NEW_SHA)
    slower["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] = [
        {"SchedulerParameters": "nohold_on_prolog_fail,requeue_delay=30"}
    ]
    new.write_text(yaml.safe_dump(slower))
    proc = _cli(str(old), str(new))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: requeue hold 10 s -> 30 s" in proc.stdout and "restart slurmctld" in proc.stdout


# Ordinary changes get pcluster's own verdict; what pcluster asks the live cluster (compute fleet,
# login nodes, head node running?) is validate.LiveCluster, "running" unless said otherwise.
def _queue_resource(config: dict[str, Any]) -> dict[str, Any]:
    resource: dict[str, Any] = config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]
    return resource


def _changed(name: str, change: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    old, new = rendered(name), rendered(name)
    change(new)
    return old, new


_EBS = {"Name": "more", "MountDir": "/more", "StorageType": "Ebs", "EbsSettings": {"Size": 50}}
ORDINARY = {
    "MaxCount up": lambda c: _queue_resource(c).update(MaxCount=4),
    "ScaledownIdletime": lambda c: c["Scheduling"]["SlurmSettings"].update(ScaledownIdletime=20),
    "instance type": lambda c: _queue_resource(c).update(InstanceType="p5.48xlarge"),
    "an EBS volume": lambda c: c["SharedStorage"].append(_EBS),
}
# (path, pcluster's policy, verdict with the fleet running, verdict with it stopped)
VERDICTS = {
    "MaxCount up": (
        "Scheduling.SlurmQueues[gpu].ComputeResources[p4d].MaxCount",
        "RESIZE_UPDATE_STRATEGY_ON_REMOVE",
        "SUCCEEDED",
        "SUCCEEDED",
    ),
    "ScaledownIdletime": (
        "Scheduling.SlurmSettings.ScaledownIdletime",
        "COMPUTE_FLEET_STOP",
        "ACTION NEEDED",
        "SUCCEEDED",
    ),
    "instance type": (
        "Scheduling.SlurmQueues[gpu].ComputeResources[p4d].InstanceType",
        "COMPUTE_FLEET_STOP",
        "ACTION NEEDED",
        "SUCCEEDED",
    ),
    # a new EBS volume: allowed on a running fleet because QueueUpdateStrategy is set (DRAIN)
    "an EBS volume": ("SharedStorage", "SHARED_STORAGE_UPDATE_POLICY", "SUCCEEDED", "SUCCEEDED"),
}


@pytest.mark.parametrize("what", sorted(ORDINARY))
def test_ordinary_changes_get_pclusters_verdict(what: str) -> None:
    old, new = _changed("p4d.yaml", ORDINARY[what])
    path, policy, running, stopped = VERDICTS[what]
    for fleet, verdict in (("running", running), ("stopped", stopped)):
        live = validate.LiveCluster(compute_fleet=fleet)
        allowed, changes = validate.update_check(old, new, live)
        assert [(c.path, c.policy, c.check) for c in changes] == [(path, policy, verdict)], fleet
        assert allowed == (verdict == "SUCCEEDED")


def test_the_fleet_is_assumed_running_by_default() -> None:
    """The stricter assumption: an instance-type change is refused unless told the fleet stopped."""
    old, new = _changed("p4d.yaml", ORDINARY["instance type"])
    allowed, [change] = validate.update_check(old, new)
    assert not allowed and change.reason == "All compute nodes must be stopped"
    assert "pcluster update-compute-fleet" in change.action


def test_a_new_volume_waits_for_running_login_nodes() -> None:
    """pcluster asks has_running_login_nodes(): running pools refuse a new EBS volume."""
    old = yaml.safe_load((FIXTURES / "login-nodes.yaml").read_text())
    new = yaml.safe_load((FIXTURES / "login-nodes.yaml").read_text())
    new["SharedStorage"] = [_EBS]
    allowed, [change] = validate.update_check(old, new)
    assert not allowed and change.check == "ACTION NEEDED"
    stopped = validate.LiveCluster(compute_fleet="stopped", login_nodes="stopped")
    assert validate.update_check(old, new, stopped)[0]
    # the fleet stopped, login nodes still running: refused
    assert not validate.update_check(old, new, validate.LiveCluster(compute_fleet="stopped"))[0]


def test_no_login_pools_means_none_running() -> None:
    assert not validate.LiveCluster().login_nodes_running(rendered("p4d.yaml"))
    assert validate.LiveCluster().login_nodes_running({"LoginNodes": {"Pools": [{"Name": "a"}]}})
    with pytest.raises(ValueError):
        validate.LiveCluster(compute_fleet="paused")


@pytest.mark.parametrize("state", ["running", "stopped"])
def test_the_cluster_pcluster_asks_answers_as_live_says(state: str) -> None:
    """Everything pcluster/config/update_policy.py asks the cluster object, answered from
    LiveCluster: has_running_capacity(), has_running_login_nodes(pool_name=), head_node_instance."""
    from pcluster.config.config_patch import ConfigPatch

    seen: list[Any] = []

    def check(patch: Any) -> tuple[bool, list[list[str]]]:
        seen.append(patch.cluster)
        return True, [["header"]]

    config = yaml.safe_load((FIXTURES / "login-nodes.yaml").read_text())
    live = validate.LiveCluster(compute_fleet=state, login_nodes=state, head_node=state)
    with mock.patch.object(ConfigPatch, "check", check):
        validate.update_check(config, config, live)
    [cluster] = seen
    assert cluster.has_running_capacity() is (state == "running")
    assert cluster.has_running_capacity(updated_value=True) is (state == "running")
    assert cluster.has_running_login_nodes() is (state == "running")
    assert cluster.has_running_login_nodes(pool_name="login") is (state == "running")
    assert cluster.head_node_instance.state == state
    assert cluster.name == cluster.stack_name == "hpc-train"


def test_cli_check_update_ordinary_changes_never_a_traceback(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(rendered("p4d.yaml")))
    for index, what in enumerate(sorted(ORDINARY)):
        new = tmp_path / f"new{index}.yaml"
        new.write_text(yaml.safe_dump(_changed("p4d.yaml", ORDINARY[what])[1]))
        proc = _cli(str(old), str(new))
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == (0 if VERDICTS[what][2] == "SUCCEEDED" else 1), proc.stdout
        assert (
            "not checked offline: whether the compute fleet is running (assumed running: --fleet)"
            in proc.stdout
        )
    proc = _cli(str(old), str(new), "--fleet", "stopped")
    assert proc.returncode == 0, proc.stdout
    assert "(assumed stopped: --fleet)" in proc.stdout


def test_cli_check_update_crash_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from hpc_train.cluster.__main__ import main

    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(rendered("p4d.yaml")))
    with mock.patch.object(validate, "update_check", side_effect=AttributeError("no attr x")):
        assert main(["check-update", str(old), str(old)]) == 2
    err = capsys.readouterr().err
    assert err == "error: the update check could not run: AttributeError: no attr x\n"
