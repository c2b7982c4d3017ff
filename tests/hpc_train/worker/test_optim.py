"""fused_adamw against fairseq's adam: the update rule, resuming fairseq's state, real training.

The real runs are tiny RoBERTa on one CPU process (``python -m hpc_train.worker.train``), 50 updates with
each optimizer, in fp32 and in bf16 (fairseq's FP16Optimizer with fp32 master weights).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fairseq.optim.adam import Adam

from hpc_train.runs import logparse
from hpc_train.worker.optim import FusedAdamW, torch_eps

BETAS, EPS, WD, LR = (0.9, 0.98), 1e-6, 0.01, 1e-3
UPDATES = 50


def shapes_params(flat: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 5)]
    if flat:
        shapes = [(sum(torch.Size(s).numel() for s in shapes),)]
    return [torch.randn(s, generator=gen) for s in shapes]


def step_both(opt_a: torch.optim.Optimizer, opt_b: torch.optim.Optimizer, grads: list) -> None:
    for opt in (opt_a, opt_b):
        for p, g in zip(opt.param_groups[0]["params"], grads, strict=True):
            p.grad = g.clone()
        opt.step()


def max_rel_diff(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> float:
    pairs = zip(a.param_groups[0]["params"], b.param_groups[0]["params"], strict=True)
    pairs = ((x.detach(), y.detach()) for x, y in pairs)
    return max(float(((x - y).abs() / y.abs().clamp_min(1e-3)).max()) for x, y in pairs)


@pytest.mark.parametrize("flat", [False, True], ids=["per-parameter", "flat"])
@pytest.mark.parametrize("grad_scale", [1.0, 1e-6], ids=["gradients", "tiny-gradients"])
def test_same_update_rule_as_fairseq_adam(flat: bool, grad_scale: float) -> None:
    """Tiny gradients make sqrt(v) comparable to eps, where the eps placement shows."""
    params = shapes_params(flat)
    theirs = Adam([p.clone().requires_grad_() for p in params], LR, BETAS, EPS, WD)
    ours = FusedAdamW([p.clone().requires_grad_() for p in params], LR, BETAS, EPS, WD)
    plain = torch.optim.AdamW(
        [p.clone().requires_grad_() for p in params], LR, BETAS, EPS, WD, fused=True
    )
    gen = torch.Generator().manual_seed(1)
    for _ in range(UPDATES):
        grads = [torch.randn(p.shape, generator=gen) * grad_scale for p in params]
        step_both(theirs, ours, grads)
        for p, g in zip(plain.param_groups[0]["params"], grads, strict=True):
            p.grad = g.clone()
        plain.step()
    assert max_rel_diff(ours, theirs) < 1e-5
    if grad_scale < 1:  # the control: torch's own eps placement is measurably different here
        assert max_rel_diff(plain, theirs) > 1e-3


def test_torch_eps_moves_eps_under_the_bias_correction() -> None:
    assert torch_eps(1e-6, 0.98, 1) == pytest.approx(1e-6 / 0.02**0.5)
    assert torch_eps(1e-6, 0.98, 10_000) == pytest.approx(1e-6)


def test_resumes_the_state_of_fairseq_adam() -> None:
    """A checkpoint trained with fairseq's adam (int step counts) goes on with fused_adamw."""
    params = shapes_params(flat=True)
    theirs = Adam([p.clone().requires_grad_() for p in params], LR, BETAS, EPS, WD)
    gen = torch.Generator().manual_seed(2)
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(10)]
    for g in grads[:5]:
        for p, gi in zip(theirs.param_groups[0]["params"], g, strict=True):
            p.grad = gi.clone()
        theirs.step()
    ours = FusedAdamW(
        [p.detach().clone().requires_grad_() for p in theirs.param_groups[0]["params"]],
        LR,
        BETAS,
        EPS,
        WD,
    )
    ours.load_state_dict(copy.deepcopy(theirs.state_dict()))  # as read from a checkpoint
    assert ours.param_groups[0]["fairseq_step"] == 5 and ours.param_groups[0]["fused"]
    for g in grads[5:]:
        step_both(theirs, ours, g)
    assert max_rel_diff(ours, theirs) < 1e-5


# --- real fairseq training --------------------------------------------------------------------


def train(run_tiny: Callable[..., None], corpus: Path, save: Path, *extra: str) -> list[float]:
    """Per-update training losses of a 50-update tiny run (one CPU process)."""
    run_tiny(corpus, save, UPDATES, "--log-interval", "1", "--save-interval-updates", "25", *extra)
    lines = (save / "train.log").read_text().splitlines()
    found = [m for line in lines if "train_inner" in line and (m := logparse.parse_metrics(line))]
    return [m["loss"] for m in found]


def weights(save: Path) -> dict[str, torch.Tensor]:
    return torch.load(save / "checkpoint_last.pt", weights_only=False)["model"]


@pytest.fixture(scope="module")
def runs(
    corpus: Path, tmp_path_factory: pytest.TempPathFactory, tiny_run: Callable[..., None]
) -> dict[str, tuple[Path, list]]:
    base = tmp_path_factory.mktemp("optim")
    out = {}
    for precision in ("fp32", "bf16"):
        flags = ["--bf16"] if precision == "bf16" else []
        for optimizer in ("adam", "fused_adamw"):
            save = base / f"{precision}-{optimizer}"
            out[f"{precision}-{optimizer}"] = (
                save,
                train(tiny_run, corpus, save, "--optimizer", optimizer, *flags),
            )
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_losses_match_fairseq_adam_over_50_updates(runs: dict, precision: str) -> None:
    adam_dir, adam = runs[f"{precision}-adam"]
    fused_dir, fused = runs[f"{precision}-fused_adamw"]
    assert len(adam) == len(fused) == UPDATES
    assert adam[-1] < adam[0] - 0.5  # it trained
    assert fused == pytest.approx(adam, abs=2e-3)  # losses are logged to 3 decimals
    ours, theirs = weights(fused_dir), weights(adam_dir)
    # bf16 weights are the fp32 master weights rounded: a last-bit difference in fp32 can move
    # one across a bf16 rounding boundary (one bf16 step is 2**-8 relative)
    rtol, atol = (1e-3, 1e-4) if precision == "fp32" else (2**-7, 4e-3)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name].float(), tensor.float(), rtol=rtol, atol=atol)


def test_resume_from_a_fused_adamw_checkpoint(
    runs: dict, tmp_path: Path, corpus: Path, tiny_run: Callable[..., None]
) -> None:
    """The optimizer state (moments, step counts) survives a checkpoint: updates 26-50 trained
    from the update-25 checkpoint repeat the uninterrupted run's."""
    first, losses = runs["fp32-fused_adamw"]
    resumed = train(
        tiny_run, corpus, tmp_path / "resumed", "--optimizer", "fused_adamw",
        "--restore-file", str(first / "checkpoint_1_25.pt"),
    )  # fmt: skip
    assert resumed == pytest.approx(losses[25:], abs=2e-3)
