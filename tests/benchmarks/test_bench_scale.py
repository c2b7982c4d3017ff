"""The scale benchmark's own arithmetic (``benchmarks.scale``), on files written by the test with
times it chose: no cluster (the real run is ``test_smoke.py``'s bench-scale smoke)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from benchmarks import scale
from hpc_core.rundir import RunDir, incident_report
from hpc_train.contract import StartFiles


def test_a_hangs_teardown_is_the_last_report_to_the_last_exit_record(tmp_path):
    """Three nodes report the hang at 10.0, 10.4 and 10.2 s; their exit records land at 11.0,
    13.5 and 12.0 s (one spare, task 3, runs no torchrun: no record). The teardown is 13.5 -
    10.4 = 3.1 s; with a record missing it is not said."""
    files = StartFiles(RunDir(tmp_path), "41.1", 0)
    files.incident.mkdir(parents=True)
    for node, at in (("n1", 1000.0), ("n2", 1000.4), ("n3", 1000.2)):
        incident_report(files.incident, node).write_text(json.dumps({"node": node, "time": at}))
    job = SimpleNamespace(nodes=4)
    for task, at in ((0, 1001.0), (1, 1003.5)):
        path = files.node_exit(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        os.utime(path, (at, at))
    assert scale.teardown(job, files) is None  # n3's record not in yet
    files.node_exit(2).write_text("{}")
    os.utime(files.node_exit(2), (1002.0, 1002.0))
    assert scale.teardown(job, files) == 3.1
