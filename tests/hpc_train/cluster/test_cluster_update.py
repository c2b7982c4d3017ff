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
