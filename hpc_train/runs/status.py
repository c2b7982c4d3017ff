"""Where your runs stand: one row per run, from the run's ledger, its train.log and Slurm.

Examples:
    hpc-train status                          # every run you submitted (your run index)
    hpc-train status /lustre/runs/roberta     # one run by its save dir ...
    hpc-train status 4242 --json              # ... or by its job id, for machines

One run's view also says where its curves are (``--tensorboard``, ``--wandb-project``): the
``tensorboard --logdir`` command and the W&B run.

A run whose job Slurm has forgotten still shows, from its save dir: its state then comes from
the ledger (COMPLETED, CANCELLED, STOPPED (cause)), in Slurm's words.
"""

from __future__ import annotations

import json
import sys
import time

from hpc_train import cli
from hpc_train.planning import goodput
from hpc_train.runs import index, tracking


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def row(s: index.RunStatus) -> list[str]:
    ettr = s.goodput.ettr if s.goodput else None
    causes = sorted({goodput.short_cause(why) for _, why in s.restarts})
    return [
        s.run.job or "-",
        s.run.name or s.run.save_dir.name,
        f"{s.state} (blocked)" if s.blocked else f"{s.state} (held)" if s.held else s.state,
        s.nodes or "-",
        f"{s.updates}/{s.max_update if s.max_update is not None else '?'}",
        "-" if s.last_loss is None else f"{s.last_loss:.3f}",
        "-"
        if s.checkpoint_update is None
        else f"{s.checkpoint_update} ({age(s.checkpoint_age_s)})",
        f"{len(s.restarts)}" + (f" ({'; '.join(causes)})" if causes else ""),
        "-" if ettr is None else f"{ettr:.0%}",
        age(s.eta_s),
    ]


HEADER = [
    "JOB",
    "NAME",
    "STATE",
    "NODES",
    "UPDATE",
    "LOSS",
    "CHECKPOINT",
    "RESTARTS",
    "ETTR",
    "ETA",
]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [HEADER, *rows]
    )


def detail(s: index.RunStatus) -> str:
    """The one-run view: the row, each restart and its cause, the nodes it named, the save dir's
    storage (its room, a checkpoint's size, the last verified checkpoint, those set aside), the
    goodput."""
    lines = [table([row(s)]), f"save dir: {s.run.save_dir}"]
    if s.blocked:
        lines.append(f"requeue blocked: {s.blocked}")
    if s.held:
        lines.append(f"held: {s.held}")
    if s.spares:
        lines.append(f"hot spares standing by: {', '.join(s.spares)}")
    for n, (update, why) in enumerate(s.restarts, 1):
        lines.append(f"restart {n}: resumed at update {update}; before it: {why}")
    lines += [n.describe() for n in s.nodes_named]
    if s.storage:
        lines += s.storage.lines()
    if s.goodput:
        lines.append(s.goodput.describe())
    lines += tracking.lines(s.run.dir)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(
        prog="hpc-train status",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=cli.examples(__doc__ or "", "hpc-train status"),
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="save dirs or job ids (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON list, for machines")
    args = p.parse_args(argv)

    def warn(msg: str) -> None:
        print(f"hpc-train status: warning: {msg}", file=sys.stderr)

    try:
        chosen = [index.resolve(a, warn) for a in args.runs] if args.runs else index.user_runs(warn)
    except index.RunNotFound as err:
        p.error(str(err))
    now = time.time()
    said = index.slurm_states([r.job for r in chosen], warn)  # one query for every run
    found = [index.status_of(r, now, said.get(r.job or ""), warn) for r in chosen]
    if args.json:
        print(json.dumps([s.as_json() for s in found], indent=1))
    elif len(args.runs) == 1:
        print(detail(found[0]))
    elif found:
        print(table([row(s) for s in found]))
    else:
        print("no runs yet: `hpc-train submit` records each run it submits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
