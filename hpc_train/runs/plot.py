"""Plot a run's loss: training loss over updates, validation points, each restart marked.

    hpc-train plot .local/runs/tiny -o loss.png
    hpc-train plot 4242 -o /tmp/roberta-loss.png

RUN is the run's save dir or its job id; its ``train.log`` is read in any fairseq log format. A
restart is a dashed vertical line at the update it resumed from, its cause (from the run's
ledger, else "resumed") in the legend. Updates trained
again after a resume from an older checkpoint show as faint points under the curve.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_core import ledger
from hpc_core.rundir import RunDir, atomic_writer
from hpc_train import cli
from hpc_train.planning import goodput
from hpc_train.runs import index
from hpc_train.runs.logparse import RunSummary, summarize_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Restart = tuple[int, str]  # (update resumed at, cause)


def restarts_from_ledger(run: RunDir) -> list[Restart]:
    """The restarts the run's ledger records, each with why the start before it ended."""
    events = ledger.read(run.ledger)
    return [(update, goodput.short_cause(why)) for update, why in goodput.restarts(events)]


def restarts_from_log(summary: RunSummary) -> list[Restart]:
    """The restarts the log itself shows (its cause unknown there: "resumed")."""
    return [(update, "resumed") for update in summary.resumed_at]


def superseded(losses: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points of an update logged again later (trained again after a resume): all but the last."""
    last = {n: i for i, (n, _) in enumerate(losses)}
    return [point for i, point in enumerate(losses) if last[point[0]] != i]


def restart_labels(restarts: Sequence[Restart]) -> dict[str, str]:
    """Legend text per cause: ``restart: preempted``, ``restart: requeued (x2)``."""
    counts = Counter(cause for _, cause in restarts)
    return {c: f"restart: {c}" + (f" (x{k})" if k > 1 else "") for c, k in counts.items()}


def render(
    summary: RunSummary, restarts: Sequence[Restart], out_png: Path | str, title: str = ""
) -> Figure:
    """Draw the loss curves with ``restarts`` marked, write ``out_png`` (atomically), and return
    the figure (its one axes' legend names each restart cause)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no display, no pyplot
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    curve, label = summary.curve(), "train loss"
    if not curve:
        curve, label = sorted(dict(summary.epoch_losses).items()), "train loss (epoch mean)"
    if curve:
        ax.plot(*zip(*curve, strict=True), color="tab:blue", linewidth=1.5, label=label)
    if old := superseded(summary.losses):
        ax.plot(
            *zip(*old, strict=True),
            ".",
            color="tab:blue",
            alpha=0.3,
            label="first pass (trained again)",
        )
    if valid := sorted(dict(summary.valid_losses).items()):
        ax.plot(*zip(*valid, strict=True), "o-", color="tab:orange", label="valid loss")
    labels = restart_labels(restarts)
    colors = dict(
        zip(labels, ["tab:red", "tab:purple", "tab:brown", "tab:gray", "tab:olive"], strict=False)
    )
    for update, cause in restarts:
        color = colors.get(cause, "tab:red")
        # one legend entry per cause: the first line of each cause takes the label
        ax.axvline(
            update, color=color, linestyle="--", linewidth=1.2, label=labels.pop(cause, None)
        )
    ax.set_xlabel("update")
    ax.set_ylabel("loss")
    ax.set_title(title or "training loss")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    with atomic_writer(out_png, "wb") as fh:
        fig.savefig(fh, format="png", dpi=100)
    return fig


def build_parser() -> cli.Parser:
    parser = cli.Parser(
        prog="hpc-train plot",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=cli.examples(__doc__, "hpc-train plot"),
    )
    parser.add_argument("run", metavar="RUN", help="the run's save dir, or its job id")
    parser.add_argument("-o", "--out", type=Path, default=Path("loss.png"), help="PNG to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run = index.resolve(args.run)
    except index.RunNotFound as err:
        parser.error(str(err))
    log = run.dir.train_log
    if not log.is_file():
        parser.error(f"{log}: no train.log (has the run started?)")
    summary = summarize_text(log.read_text(errors="replace"))
    if not summary.losses and not summary.epoch_losses:
        parser.error(f"{log}: no training loss logged yet")
    restarts = restarts_from_ledger(run.dir) or restarts_from_log(summary)
    try:
        render(summary, restarts, args.out, title=str(run.save_dir))
    except OSError as err:
        parser.error(f"cannot write {args.out}: {err.strerror or err}")
    print(f"wrote {args.out}: loss to update {summary.updates}, {len(restarts)} restart(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
