"""A run's logs, across every requeue: fairseq's train.log and the launchers' lines, in order.

Examples:
    hpc-train logs /lustre/runs/roberta            # the whole run so far, in order
    hpc-train logs 4242 --follow                   # re-attach to a running job until it ends
    hpc-train logs 4242 --task 0                   # task 0's raw Slurm log (every requeue)
    hpc-train logs 4242 --summary --json           # final update, losses, restarts, speed
    hpc-train logs summary train.log old/train.log --json

RUN is a save dir or a job id (``hpc-train status`` lists yours). On a terminal ``--follow``
shows a live progress bar; piped, one plain line per log interval. Where the run's curves are
(``--tensorboard``, ``--wandb-project``) ends the report of ``--follow``, and follows the log
on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpc_train import cli
from hpc_train.runs import follow, index, logparse, tracking


def print_summary(summary: logparse.RunSummary, as_json: bool) -> None:
    data = summary.as_json()
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        print("\n".join(f"{key}: {value}" for key, value in data.items()))


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(
        prog="hpc-train logs",
        usage="%(prog)s RUN [--follow | --task N | --all-tasks | --summary] [--json]\n"
        "       %(prog)s summary FILE [FILE ...] [--json]",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=cli.examples(__doc__ or "", "hpc-train logs"),
    )
    p.add_argument("targets", nargs="+", metavar="RUN", help="a save dir or a job id")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--follow", action="store_true", help="follow the job until it ends")
    how.add_argument("--task", type=int, metavar="N", help="task N's raw Slurm log")
    how.add_argument("--all-tasks", action="store_true", help="every task's raw Slurm log")
    how.add_argument("--summary", action="store_true", help="the run's summary instead")
    p.add_argument("--json", action="store_true", help="the summary as JSON")
    args = p.parse_args(argv)

    def warn(msg: str) -> None:
        print(f"hpc-train logs: warning: {msg}", file=sys.stderr)

    if args.targets[0] == "summary":
        files = [Path(f) for f in args.targets[1:]]
        if not files or any(not f.is_file() for f in files):
            p.error("summary: name one or more existing log files")
        text = "".join(f.read_text(errors="replace") for f in files)
        print_summary(logparse.summarize_text(text), args.json)
        return 0
    if len(args.targets) != 1:
        p.error("name one run (a save dir or a job id), or use `summary FILE ...`")
    try:
        run = index.resolve(args.targets[0], warn)
    except index.RunNotFound as err:
        p.error(str(err))
    rundir = run.dir
    if args.summary:
        print_summary(follow.run_summary(rundir, run.max_update), args.json)
        return 0
    if args.task is not None or args.all_tasks:
        lines = follow.raw_task_logs(rundir, None if args.all_tasks else args.task)
        if not lines:
            p.error(f"{rundir.slurm_logs}: no task logs")
        print("\n".join(lines))
        return 0
    if args.follow:
        if run.job is None:
            p.error(f"{run.save_dir}: no job recorded for this run; name its job id")
        return follow.follow(rundir, run.job, run.max_update, bar=sys.stdout.isatty())
    lines = follow.RunTail(rundir).new_lines()
    if not lines:
        p.error(f"{run.save_dir}: no logs yet (train.log and slurm/ are empty)")
    print("\n".join(lines))
    for line in tracking.lines(rundir):  # on stderr: the log's lines stay the log's
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
