"""bench-soak's arithmetic and scripts on inputs the test writes (the benchmark is not a test)."""

from __future__ import annotations

import json
import shlex
import subprocess

from benchmarks import soak
from hpc_core.ledger import Event


def ev(kind: str, t: float, **data) -> Event:
    return Event(kind, t, "7", 0, data)


def upd(n: int) -> str:
    return "2026-11-24 08:00:00 | INFO | train_inner | " + json.dumps(
        {"loss": "9.1", "num_updates": str(n)}
    )


# updates 1..10 at 1 s each, a crash at 10.5, a resume from the checkpoint at 6, updates 7..9
LINES = [(float(n), upd(n)) for n in range(1, 11)] + [
    (20.0, "| INFO | fairseq.checkpoint_utils | Loaded checkpoint /x/checkpoint_last.pt "
           "(epoch 1 @ 6 updates)"),
    *[(20.0 + n, upd(6 + n)) for n in range(1, 4)],
]  # fmt: skip


def test_updates_clean_rate_resume_and_recomputed_by_hand():
    updates = soak.updates_of(LINES)
    assert [u for _, u in updates] == [*range(1, 11), 7, 8, 9]
    assert soak.clean_s_per_update(updates, until=10.5) == 1.0
    assert soak.clean_s_per_update(updates, until=1.5) is None  # one update: no stretch
    resumed = soak.resume_in_log(LINES, after=10.5)
    assert resumed == (21.0, 7)
    assert soak.recomputed_at(updates, resumed) == 4  # 7..10 trained twice
    assert soak.duplicates(updates) == 3  # by the budget's end: 7, 8, 9 so far
    assert soak.resume_in_log(LINES, after=25.0) is None


def test_ledger_first_update_after_and_training_nodes():
    events = [
        ev("started", 0, nodes=["n1", "n2"], spares=["n3"]),
        ev("first_update", 5),
        ev("restarted", 30, members=["n1", "n3"], left_out=["n2"]),
        ev("first_update", 40),
    ]
    assert soak.first_update_after(events, 10) == 40
    assert soak.first_update_after(events, 41) is None
    assert soak.training_nodes(events) == ["n1", "n3"]
    assert soak.training_nodes(events[:2]) == ["n1", "n2"]


def test_schedule_scaled_keeps_order_and_kinds():
    scaled = soak.scaled(soak.SCHEDULE, 0.5)
    assert [k for _, k in scaled] == [k for _, k in soak.SCHEDULE]
    assert [o for o, _ in scaled] == [o * 0.5 for o, _ in soak.SCHEDULE]


def test_bare_scripts_parse_and_keep_fairseq_args(tmp_path):
    line = ("torchrun --nnodes=2 -m hpc_train.worker.train /d --adam-betas '(0.9, 0.98)' "
            "--save-dir /s --log-interval 1")  # fmt: skip
    args = soak.fairseq_args(line)
    assert args == ["/d", "--adam-betas", "(0.9, 0.98)", "--save-dir", "/s", "--log-interval", "1"]
    rank = soak.bare_rank_sh(args)
    for text in (soak.bare_script(2, tmp_path / "o", tmp_path / "t.sh", "low"),
                 soak.bare_train_sh(2, tmp_path / "r.sh"), rank):  # fmt: skip
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "--requeue" in soak.bare_script(2, tmp_path / "o", tmp_path / "t.sh", "low")
    assert shlex.quote("(0.9, 0.98)") in rank and "fairseq-train" in rank
