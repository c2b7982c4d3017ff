"""Which samples each epoch trained, and how often: the check of ``--audit-samples``.

Every rank of every start appended ``contract.AuditLine``s to ``RunDir.audit_file`` (written by
``hpc_train.worker.data_position``): where its start resumed, then after each training step the
position reached (batches of the epoch's plan consumed by all ranks) and the sample ids it
trained. Steps trained after the last save of a start that then died are trained again by the
next start, which resumes from that save: they are not in the model, so they do not count.

The lines of all ranks and starts are replayed in time order; a start's ``resumed`` line undoes
every earlier line past the update it resumed from (what it trains again). The update, not the
data position the iterator claims: a wrong position (the bug this audit is for) must not hide. What is left is the lineage of the
model: per epoch, each sample id of the epoch's plan (``RunDir.audit_plan``) should appear
exactly once. Reports samples seen 0 times (in an epoch whose end was reached) and 2+ times.

    python -m hpc_train.runs.audit SAVE_DIR     # exit 1 when an epoch is not exactly once
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc_core.rundir import RunDir
from hpc_train.contract import AuditLine

SHOWN = 10  # sample ids named in a report line


@dataclass(frozen=True)
class EpochAudit:
    epoch: int
    complete: bool  # the epoch's end was reached in the lineage
    planned: int  # samples in the epoch's plan (0: no plan file)
    seen: int  # distinct samples trained
    missing: list[int] = field(default_factory=list)  # planned, trained 0 times (complete only)
    repeated: dict[int, int] = field(default_factory=dict)  # id -> times trained, 2+

    @property
    def exact(self) -> bool:
        """Every sample of the epoch (so far) trained once: none twice, none missed at its end."""
        return not self.repeated and not (self.complete and self.missing)

    def describe(self) -> str:
        state = "complete" if self.complete else "in progress"
        said = f"epoch {self.epoch} ({state}): {self.seen} of {self.planned} samples trained"
        if self.missing:
            said += f"; {len(self.missing)} never: {_some(self.missing)}"
        if self.repeated:
            said += f"; {len(self.repeated)} twice or more: {_some(sorted(self.repeated))}"
        return said + ("" if self.exact else "  NOT EXACTLY ONCE")


def _some(ids: list[int]) -> str:
    more = f" (+{len(ids) - SHOWN})" if len(ids) > SHOWN else ""
    return ", ".join(map(str, ids[:SHOWN])) + more


def read_lines(run: RunDir) -> list[AuditLine]:
    """Every rank's lines of every start, in time order (a line cut short is skipped)."""
    lines: list[AuditLine] = []
    for path in sorted(run.audit.glob("*/rank-*.jsonl")) if run.audit.is_dir() else []:
        for text in path.read_text().splitlines():
            try:
                lines.append(AuditLine(**json.loads(text)))
            except (ValueError, TypeError):
                continue  # the last line of a rank killed mid-write
    return sorted(lines, key=lambda line: line.t)


def lineage(lines: Iterable[AuditLine]) -> list[AuditLine]:
    """The steps and epoch ends the model kept: each ``resumed`` line undoes the earlier lines
    past the update it resumed from."""
    kept: list[AuditLine] = []
    for line in lines:
        if line.resumed:
            kept = [k for k in kept if k.update <= line.update]
        else:
            kept.append(line)
    return kept


def audit_epochs(lines: Iterable[AuditLine], plans: dict[int, list[int]]) -> list[EpochAudit]:
    """Per epoch of the lineage: how often each sample id was trained, against its plan."""
    counts: dict[int, Counter[int]] = {}
    ended: set[int] = set()
    for line in lineage(lines):
        counts.setdefault(line.epoch, Counter()).update(line.ids)
        if line.end:
            ended.add(line.epoch)
    out = []
    for epoch, seen in sorted(counts.items()):
        plan = plans.get(epoch, [])
        complete = epoch in ended
        out.append(
            EpochAudit(
                epoch=epoch,
                complete=complete,
                planned=len(plan),
                seen=len(seen),
                missing=[i for i in plan if i not in seen] if complete else [],
                repeated={i: n for i, n in sorted(seen.items()) if n > 1},
            )
        )
    return out


def read_plans(run: RunDir, epochs: Iterable[int]) -> dict[int, list[int]]:
    plans = {}
    for epoch in epochs:
        path = run.audit_plan(epoch)
        if path.exists():
            plans[epoch] = [int(i) for i in json.loads(path.read_text())]
    return plans


def audit(save_dir: Path) -> list[EpochAudit]:
    """The audit of a run's save dir: one ``EpochAudit`` per epoch trained (empty: no audit)."""
    run = RunDir(save_dir)
    lines = read_lines(run)
    return audit_epochs(lines, read_plans(run, {line.epoch for line in lines}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.runs.audit",
        description="Per epoch: the samples a run trained 0 or 2+ times (runs with "
        "--audit-samples). Exit status 1 when an epoch is not exactly once.",
    )
    parser.add_argument("save_dir", type=Path, metavar="SAVE_DIR", help="the run's --save-dir")
    save_dir = parser.parse_args(argv).save_dir
    epochs = audit(save_dir)
    if not epochs:
        print(f"no audit in {save_dir} (train with --audit-samples)")
        return 1
    for epoch in epochs:
        print(epoch.describe())
    return 0 if all(epoch.exact for epoch in epochs) else 1


if __name__ == "__main__":
    sys.exit(main())
