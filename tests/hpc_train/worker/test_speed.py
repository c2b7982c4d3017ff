"""The speed levers in the rank: the argument taken off before fairseq, what a device cannot
run dropped, and the compiled encoder layers against fairseq's own path (real fairseq, CPU)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from hpc_train.job import levers
from hpc_train.worker import speed


def test_the_levers_argument_is_taken_off_before_fairseq_parses():
    args = [
        "/data",
        "--cpu",
        levers.WORKER_FLAG,
        "none",
        "--seed",
        "1",
        levers.WORKER_FLAG,
        "compile",
    ]
    rest, asked = speed.split_args(args)
    assert rest == ["/data", "--cpu", "--seed", "1"]
    assert asked == {"compile"}  # the last one wins, as for fairseq's own flags
    assert speed.split_args(["/data"]) == (["/data"], None)  # started by hand: nothing changed
    with pytest.raises(ValueError, match="unknown lever"):
        speed.split_args([levers.WORKER_FLAG, "turbo"])


def test_a_cpu_rank_drops_what_only_gpus_run_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="hpc_train.worker.speed"):
        kept = speed.runnable(frozenset({"flash", "fused-adamw"}), None, cpu=True)
    assert kept == {"fused-adamw"}  # torch's fused AdamW has a CPU kernel; flash is GPU-only
    assert "speed lever flash: CPU ranks cannot run it" in caplog.text
    assert speed.runnable(frozenset({"flash"}), (7, 0), cpu=False) == frozenset()  # a V100
    assert speed.runnable(frozenset({"flash"}), (9, 0), cpu=False) == {"flash"}


def losses(log_text: str) -> dict[int, float]:
    """fairseq's per-update train loss from the rank's log (``--log-format json``)."""
    out = {}
    for line in log_text.splitlines():
        if "| train_inner |" in line:
            record = json.loads(line.split("| train_inner | ", 1)[1])
            out[int(record["num_updates"])] = float(record["loss"])
    return out


# ~2 min of Inductor's C++ compile on this 2-core machine (cold cache, under load): one dynamic
# graph of the layer's forward and backward, and one more for a batch with padding.
@pytest.mark.slow
def test_compiled_encoder_layers_give_fairseqs_losses_over_50_updates(corpus, tmp_path, tiny_run):
    """Same seed, fp32, dropout 0: the arithmetic alone (with dropout, Inductor draws its masks
    from its own generator: another sample of the same noise, by design)."""
    same = ("--log-interval", "1", "--dropout", "0", "--attention-dropout", "0")
    runs = {}
    for name in ("none", "compile"):
        save = tmp_path / name
        save.mkdir()
        tiny_run(corpus, save, 50, *same, levers.WORKER_FLAG, name)
        runs[name] = save
    compiled_log = (runs["compile"] / "train.log").read_text()
    assert "torch.compile: 2 module(s)" in compiled_log
    eager, compiled = losses((runs["none"] / "train.log").read_text()), losses(compiled_log)
    assert sorted(eager) == sorted(compiled) == list(range(1, 51))
    assert max(abs(eager[u] - compiled[u]) for u in eager) <= 2e-3  # logged to 3 decimals
    weights = [
        torch.load(runs[n] / "checkpoint_last.pt", weights_only=False)["model"] for n in runs
    ]
    assert weights[0].keys() == weights[1].keys()  # compiled in place: the same names
    for key, value in weights[0].items():
        torch.testing.assert_close(weights[1][key], value, rtol=1e-4, atol=1e-5, msg=key)
