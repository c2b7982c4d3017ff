"""hpc-train plot: a real PNG drawn by matplotlib (Agg) from a train.log with a restart."""

import json
import subprocess
import sys

import pytest

from hpc_train.runs import logparse, plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def interval(n: int, loss: float) -> str:
    payload = {"epoch": 1, "loss": f"{loss:.3f}", "wps": "1000", "num_updates": f"{n}"}
    return f"2026-11-22 10:00:00,000 | INFO | train_inner | {json.dumps(payload)}"


def resumed(update: int) -> str:
    return (
        "2026-11-22 10:03:00,000 | INFO | fairseq.trainer | Loaded checkpoint "
        f"/s/checkpoint_last.pt (epoch 1 @ {update} updates)"
    )


def valid(n: int, loss: float) -> str:
    payload = {"epoch": 1, "valid_loss": f"{loss}", "valid_num_updates": f"{n}"}
    return f"2026-11-22 10:00:00,000 | INFO | valid | {json.dumps(payload)}"


def log_lines() -> list[str]:
    """Trained to 17, requeued without notice, resumed from the checkpoint at 10, on to 30."""
    lines = [interval(n, 12 - n / 10) for n in range(1, 18)] + [valid(10, 11.5)]
    lines += [resumed(10)] + [interval(n, 11.9 - n / 10) for n in range(11, 31)]
    return [*lines, valid(30, 9.5)]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_render_writes_a_png_with_each_restart_cause_in_the_legend(tmp_path):
    summary = logparse.summarize(log_lines())
    out = tmp_path / "loss.png"
    fig = plot.render(summary, [(10, "requeued (no notice)"), (24, "preempted")], out)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert 10_000 < len(data) < 2_000_000  # a drawn 900x480 figure, not an empty file
    texts = legend_texts(fig)
    assert "restart: requeued (no notice)" in texts and "restart: preempted" in texts
    assert {"train loss", "valid loss", "first pass (trained again)"} <= set(texts)
    restarts = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("restart")]
    assert [ln.get_xdata()[0] for ln in restarts] == [10, 24]
    assert not list(tmp_path.glob(".*.tmp"))  # written through atomic_writer


def test_restarts_from_log_and_repeated_causes_in_one_legend_entry(tmp_path):
    summary = logparse.summarize(log_lines())
    assert plot.restarts_from_log(summary) == [(10, "resumed")]
    fig = plot.render(summary, [(5, "preempted"), (10, "preempted")], tmp_path / "p.png")
    assert [t for t in legend_texts(fig) if t.startswith("restart")] == ["restart: preempted (x2)"]


def test_superseded_points_are_the_ones_trained_again():
    assert plot.superseded([(1, 9.0), (2, 8.0), (2, 7.5), (3, 7.0)]) == [(2, 8.0)]


def test_main_plots_a_save_dir(tmp_path, capsys):
    (tmp_path / "train.log").write_text("\n".join(log_lines()) + "\n")
    out = tmp_path / "out" / "loss.png"
    assert plot.main([str(tmp_path), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert "1 restart(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such directory, and not a job id"),
        ("no-log", "no train.log"),
        ("no-loss", "no training loss"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, setup, message):
    run = tmp_path / "run"
    if setup != "missing":
        run.mkdir()
    if setup == "no-loss":
        (run / "train.log").write_text("2026-11-22 | INFO | fairseq_cli.train | started\n")
    with pytest.raises(SystemExit) as exit_:
        plot.main([str(run), "-o", str(tmp_path / "x.png")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "x.png").exists()


def test_help_shows_an_example_and_does_not_load_matplotlib():
    code = (
        "import sys; from hpc_train.runs import plot; "
        "plot.build_parser().print_help(); print('matplotlib' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "hpc-train plot .local/runs/tiny -o loss.png" in out
    assert "default: loss.png" in out
    assert out.strip().endswith("False")


def test_a_grown_restart_is_marked_with_its_widths(tmp_path):
    """The ledger of a run that grew from 1 to 3 nodes (as task 0's launcher writes it): the
    plot's restart line at the update it resumed from says so in the legend."""
    from tests.hpc_train.runs.test_status import grown_run

    run = grown_run(tmp_path / "g", "31")
    restarts = plot.restarts_from_ledger(run)
    assert restarts == [(30, "grown from 1 to 3 node(s)")]
    fig = plot.render(logparse.summarize(log_lines()), restarts, tmp_path / "p.png")
    assert "restart: grown from 1 to 3 node(s)" in legend_texts(fig)
