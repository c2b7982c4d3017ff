"""The log parser on every format fairseq prints. Lines are made by fairseq's own progress bars
(JsonProgressBar, SimpleProgressBar) through its log format, not typed by hand, except the
resume/save lines and seed 004's sample output (copied from a real run's README)."""

import io
import json
import logging
import random
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.preemption import recomputed_updates
from hpc_train.runs import logparse

FAIRSEQ_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
SEED_004_DOCKER = Path(__file__).parents[1] / "data" / "seed_004_docker_wrapped.log"
# Seed 004's sample output (a fairseq MoE run on Azure ML), verbatim: the end-of-epoch JSON line
# has train_-prefixed keys and string values.
SEED_004_AML = [
    "2022-10-18 04:40:58 | INFO | fairseq_cli.train | Stopping training due to num_updates: 25 >= max_update: 25",
    "2022-10-18 04:40:58 | INFO | fairseq.checkpoint_utils | Preparing to save checkpoint for epoch 1 @ 25 updates",
    "2022-10-18 04:41:08 | INFO | fairseq.trainer | Saving checkpoint to ./checkpoint_last-rank-0-shard0.pt",
    "2022-10-18 04:41:26 | INFO | fairseq.trainer | Finished saving checkpoint to ./checkpoint_last-rank-0-shard0.pt",
    "2022-10-18 04:41:26 | INFO | fairseq.trainer | Saving checkpoint to ./checkpoint_last-shared-shard0.pt",
    "2022-10-18 04:41:48 | INFO | fairseq.trainer | Finished saving checkpoint to ./checkpoint_last-shared-shard0.pt",
    "2022-10-18 04:41:48 | INFO | fairseq.checkpoint_utils | Saved checkpoint ./checkpoint_last-rank-0-shard0.pt (epoch 1 @ 25 updates, score None) (writing took 49.164279436998186 seconds)",
    "2022-10-18 04:41:48 | INFO | fairseq_cli.train | end of epoch 1 (average epoch stats below)",
    '2022-10-18 04:41:48 | INFO | train | {"epoch": 1, "train_loss": "17.131", "train_moe_gate_loss": "19.2701", "train_overflow_expert1": "12.021", "train_overflow_expert2": "50.689", "train_entropy_gating": "2.006", "train_expert1_balance_top": "57.114", "train_expert1_balance_bottom": "4.243", "train_unused_expert1_count": "0.522", "train_expert2_balance_top": "44.746", "train_expert2_balance_bottom": "6.444", "train_unused_expert2_count": "0.357", "train_all_to_all_cpu_time_ms": "0", "train_all_to_all_cuda_time_ms": "0", "train_inner_loss": "16.853", "train_ppl": "118351", "train_wps": "22296.5", "train_ups": "0.11", "train_wpb": "196608", "train_bsz": "192", "train_num_updates": "25", "train_lr": "1.73333e-05", "train_gnorm": "12.484", "train_loss_scale": "8", "train_train_wall": "510", "train_cuda_gb_allocated": "16.5", "train_cuda_gb_reserved": "30.1", "train_cuda_gb_free": "62.9", "train_wall": "561"}',
    "2022-10-18 04:41:48 | INFO | fairseq_cli.train | done training in 559.6 seconds",
]


@pytest.fixture(scope="module")
def fairseq_log() -> Iterator:
    """A function (format, updates, ...) -> the lines fairseq's progress bars log for one epoch."""
    from fairseq.logging import progress_bar

    logger = progress_bar.logger
    saved = (logger.level, logger.propagate)

    def lines(fmt, updates, interval=1, valid=True, loss0=13.0, epoch=1, size=None):
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        handler.setFormatter(logging.Formatter(FAIRSEQ_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            items = list(range(size or max(updates)))
            bar = progress_bar.progress_bar(items, fmt, interval, epoch=epoch)
            wanted = set(updates)
            for i, _ in enumerate(bar):
                n = i + 1
                if n in wanted:
                    stats = OrderedDict(loss=loss0 - n / 100, nll_loss=12.0, ppl=4096.5,
                                        wps=1000.0 + n, ups=1.5, wpb=2048, bsz=8, num_updates=n,
                                        lr=1e-4, gnorm=1.25, train_wall=3, wall=n)  # fmt: skip
                    bar.log(stats, tag="train_inner", step=n)
            last = len(items)  # the epoch's last update
            end = OrderedDict(loss=loss0 - 0.5, wps=999.0, num_updates=last, lr=1e-4, wall=9)
            bar.print(end, tag="train", step=last)
            if valid:
                vbar = progress_bar.progress_bar([], fmt, epoch=epoch,
                                                 prefix="valid on 'valid' subset")  # fmt: skip
                vbar.print(OrderedDict(loss=loss0 - 1, nll_loss=11.0, num_updates=last),
                           tag="valid", step=last)  # fmt: skip
        finally:
            logger.removeHandler(handler)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
        return buf.getvalue().splitlines()

    return lines


def resume_line(update: int, stamp: str = "2026-11-22 10:00:00,000") -> str:
    return (
        f"{stamp} | INFO | fairseq.trainer | Loaded checkpoint /s/checkpoint_last.pt "
        f"(epoch 1 @ {update} updates)"
    )


@pytest.mark.parametrize("fmt", ["json", "simple"])
def test_each_format_gives_the_same_summary(fairseq_log, fmt):
    lines = fairseq_log(fmt, range(10, 31, 10), interval=10, size=31)
    s = logparse.summarize(lines, max_update=31)
    assert s.losses == [(10, 12.9), (20, 12.8), (30, 12.7)]
    assert s.updates == 31  # from the end-of-epoch line: 31 was never a log interval
    assert s.valid_loss == 12.0 and s.valid_losses == [(31, 12.0)]
    assert s.wps == [1010.0, 1020.0, 1030.0] and s.mean_wps == 1020.0
    assert s.epoch_losses == [(31, 12.5)]
    assert s.finished


def test_records_of_each_format(fairseq_log):
    for fmt in ("json", "simple"):
        records = [logparse.parse_record(line) for line in fairseq_log(fmt, [5])]
        assert [(r.kind, r.update, r.loss) for r in records] == [
            ("train_inner", 5, 12.95),
            ("train", 5, 12.5),
            ("valid", 5, 12.0),
        ], fmt
    assert logparse.parse_record("2026-11-22 | INFO | fairseq_cli.train | end of epoch 1") is None
    assert logparse.parse_record("epoch 001 | valid on 'valid' subset | nll_loss 3") is None


def test_seed_004_sample_output():
    """The AML sample: the one-line JSON end-of-epoch line and fairseq's Stopping line."""
    s = logparse.summarize(SEED_004_AML)
    assert s.as_json() | {"restarts": None} == {
        "updates": 25, "max_update": 25, "finished": True, "first_loss": 17.131,
        "final_loss": 17.131, "valid_loss": None, "wps_mean": 22296.5, "resumed_at": [],
        "recomputed_updates": 0, "restarts": None,
    }  # fmt: skip


def test_seed_004_wrapped_sample_is_ignored_not_a_crash():
    """The seed's Docker sample, wrapped at terminal width as the seed has it (copied into
    tests/hpc_train/data): its broken JSON lines are ignored; the Stopping line still counts."""
    wrapped = logparse.summarize(SEED_004_DOCKER.read_text().splitlines())
    assert (wrapped.updates, wrapped.finished, wrapped.first_loss) == (30, True, None)


def test_seed_004_line_verbatim():
    line = (
        '2022-10-18 04:41:48 | INFO | train | {"epoch": 1, "train_loss": "17.131", '
        '"train_inner_loss": "16.853", "train_wps": "22296.5", "train_num_updates": "25", '
        '"train_wall": "561"}'
    )
    record = logparse.parse_record(line)
    assert (record.kind, record.update, record.loss) == ("train", 25, 17.131)
    assert record.metrics["inner_loss"] == 16.853


def test_end_of_epoch_line_counts_updates_but_not_as_an_interval():
    lines = [
        '{"epoch": 1, "loss": "12.0", "wps": "900", "num_updates": "5"}',
        '2026-11-22 13:00:00 | INFO | train | {"epoch": 1, "train_loss": "11.5", '
        '"train_num_updates": "8", "train_wps": "950"}',
    ]
    s = logparse.summarize(lines)
    assert s.updates == 8 and s.final_loss == 12.0 and s.wps == [900.0]


@pytest.mark.parametrize("fmt", ["json", "simple"])
@pytest.mark.parametrize("labelled", [False, True])
def test_interleaved_ranks_count_each_update_once(fairseq_log, fmt, labelled):
    """Two ranks log the same run (a resume from update 10 included); their lines interleave in
    a random order across ranks (each rank's own order kept): same summary as one rank."""
    one = fairseq_log(fmt, range(1, 11), valid=False)
    one += [resume_line(10), *fairseq_log(fmt, range(11, 21), size=20)]
    single = logparse.summarize(one)
    streams = [[f"{rank}: {line}" if labelled else line for line in one] for rank in (0, 1)]
    rng = random.Random(7)
    mixed = []
    while any(streams):
        stream = rng.choice([s for s in streams if s])
        mixed.append(stream.pop(0))
    both = logparse.summarize(mixed)
    assert both.as_json() == single.as_json()
    assert both.resumed_at == [10] and both.recomputed_updates == 0
    assert sorted(both.losses) == sorted(single.losses) and len(both.losses) == 20


def test_a_late_rank_line_for_an_earlier_update_counts_once():
    lines = [f'{{"loss": "{10 - n / 10}", "num_updates": "{n}"}}' for n in (1, 2, 3, 2, 1, 4)]
    s = logparse.summarize(lines)
    assert [n for n, _ in s.losses] == [1, 2, 3, 4] and s.recomputed_updates == 0
    late = logparse.summarize([lines[0], lines[2], lines[1]])  # 2 only from the late rank
    assert late.final_loss == 9.7 and late.updates == 3


def test_a_resume_line_repeated_by_another_rank_after_progress_is_one_start():
    """Unlabelled lines: rank 1's resume line, buffered, lands after rank 0's first update."""
    lines = [
        '{"loss": "9", "num_updates": "10"}',
        resume_line(10, "2026-11-22 10:00:00,000"),
        '{"loss": "8", "num_updates": "11"}',
        resume_line(10, "2026-11-22 10:00:02,500"),
        '{"loss": "7", "num_updates": "12"}',
    ]
    s = logparse.summarize(lines)
    assert s.resumed_at == [10] and s.recomputed_updates == 0 and s.updates == 12


def test_two_real_restarts_at_the_same_update_are_two():
    lines = [resume_line(10, "2026-11-22 10:00:00,000"), resume_line(10, "2026-11-22 10:05:00,000")]
    assert logparse.summarize(lines).resumed_at == [10, 10]


def interval(n: int, loss: float) -> str:
    payload = {"epoch": 1, "loss": f"{loss}", "wps": "1000", "num_updates": f"{n}"}
    return f"2026-11-22 10:00:00,000 | INFO | train_inner | {json.dumps(payload)}"


def test_recomputed_updates_after_a_resume_from_an_older_checkpoint():
    """Requeued without notice at ~update 17 (log interval 1): the last checkpoint was update 10,
    so updates 11..17 are trained again; then once more, stopped at 15, resumed at 10 again."""
    lines = [interval(n, 20 - n / 10) for n in range(1, 18)]
    lines += [resume_line(10, "2026-11-22 10:01:00,000")]
    lines += [interval(n, 19 - n / 10) for n in range(11, 16)]
    lines += [resume_line(10, "2026-11-22 10:02:00,000")]
    lines += [interval(n, 18 - n / 10) for n in range(11, 31)]
    s = logparse.summarize(lines, max_update=30)
    assert s.resumed_at == [10, 10]
    assert [r.recomputed for r in s.resumes] == [7, 5]
    assert s.recomputed_updates == 12
    n_logged = [n for n, _ in s.losses]
    assert s.recomputed_updates == recomputed_updates(n_logged)  # the benchmark's count agrees
    assert s.curve()[10] == (11, 18 - 1.1)  # the last stretch's loss where trained twice
    assert s.finished and s.updates == 30


def test_recomputed_counts_updates_not_log_lines():
    """Log interval 5: lines at 5, 10, 15; resumed from the checkpoint at update 10 -> 5 updates
    redone (11..15), not 1 line; a save on notice at 17 (unlogged) then counts up to 17."""
    lines = [interval(5, 9), interval(10, 8), interval(15, 7), resume_line(10)]
    assert logparse.summarize(lines).recomputed_updates == 5
    saved = "2026-11-22 | INFO | fairseq.checkpoint_utils | Saved checkpoint /s/checkpoint_last.pt"
    lines = [interval(5, 9), interval(15, 7), f"{saved} (epoch 1 @ 17 updates, score None)"]
    s = logparse.summarize([*lines, resume_line(17, "2026-11-22 11:00:00")])
    assert (s.updates, s.recomputed_updates, s.resumed_at) == (17, 0, [17])


def test_a_save_on_notice_resume_recomputes_nothing():
    lines = [interval(n, 9) for n in range(1, 13)] + [resume_line(12)]
    lines += [interval(n, 8) for n in range(13, 20)]
    s = logparse.summarize(lines)
    assert (s.resumed_at, s.recomputed_updates, len(s.losses)) == ([12], 0, 19)


@pytest.mark.parametrize("fmt", ["json", "simple"])
def test_a_partial_last_line_is_ignored(fairseq_log, fmt):
    lines = fairseq_log(fmt, [1, 2, 3], valid=False)
    inner = [line for line in lines if "train_inner" in line]
    # cut right after the digit: "num_updates=3" (simple) looks whole; the writer was not done
    cut = inner[-1][: inner[-1].index("num_updates") + len("num_updates") + 2]
    s = logparse.summarize_text("\n".join(inner[:-1]) + "\n" + cut)
    assert [n for n, _ in s.losses] == [1, 2]
    assert logparse.summarize_text("").updates == 0


def test_cut_and_glued_lines_never_crash():
    lines = [
        '2026-11-22 | INFO | train_inner | {"epoch": 1, "loss": "9.5", "num_upd',
        '{"loss": "9.5", "num_updates": "1"',
        "epoch 001:     10 / 31 loss=13.2, nll_l",
        "epoch 001 | loss",
        "Loaded checkpoint /x (epoch 1 @ ",
        '2026-11-22 | INFO | train_inner | {"loss": "1', "",
        '{"loss": "12.2", "num_updates": "42.0x"}', "\x00\xff", "{[]}", "{}",
        '2026-11-22 | INFO | train_inner | {"loss": "9.5", "num_u'
        '2026-11-22 | INFO | train_inner | {"loss": "9.0", "num_updates": "3"}',
    ]  # fmt: skip
    s = logparse.summarize(lines)
    assert s.losses == [(3, 9.0)] and s.resumed_at == []


def test_json_keys():
    s = logparse.summarize([interval(5, 9.0), interval(10, 8.0), resume_line(5)], max_update=20)
    keys = set(s.as_json())
    assert {"updates", "first_loss", "final_loss", "valid_loss", "resumed_at",
            "recomputed_updates", "finished", "wps_mean"} <= keys  # fmt: skip
    assert s.as_json()["restarts"] == [{"update": 5, "recomputed": 5}]
    assert s.as_json()["finished"] is False
    json.dumps(s.as_json())  # plain JSON, no dataclasses or sets


def test_max_update_read_from_fairseqs_stop_line_when_not_given():
    stop = "x | INFO | fairseq_cli.train | Stopping training due to num_updates: 8 >= max_update: 8"
    s = logparse.summarize([interval(5, 9.0), stop])
    assert (s.max_update, s.updates, s.finished) == (8, 8, True)
    assert logparse.summarize([interval(5, 9.0), stop], max_update=100).finished is False


def test_line_rank_and_time():
    assert logparse.line_rank("3: 2026-11-22 10:00:00 | INFO") == 3
    assert logparse.line_rank("[default2]:2026-11-22") == 2
    assert logparse.line_rank("2026-11-22 10:00:00 | INFO") is None
    later = logparse.line_time("2026-11-22 10:00:01,500 | x")
    assert later - logparse.line_time("2026-11-22 10:00:00 | x") == 1.5
