"""Model presets: the fairseq masked-LM hyperparameters of each named run. Pure data.

roberta-base / roberta-large carry the pretraining recipe of fairseq's RoBERTa tutorial as used in
the Ray fairseq example (``ray_train.sh``): polynomial decay with warmup, Adam (0.9, 0.98),
eps 1e-6, weight decay 0.01, dropout 0.1, 512-token blocks of complete sentences, a fixed global
batch of 2048 sequences. ``tiny`` is the same recipe shrunk to run on a CPU in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str
    # --batch-size on a CPU rank, and the seed recipe's per-GPU batch; GPUs take theirs from
    # hpc_train.job.devices (by the instance type's GPU memory)
    batch_per_device: int
    tokens_per_sample: int
    peak_lr: float
    warmup_updates: int
    max_update: int  # default --max-update (and --total-num-update for the lr schedule)
    global_batch: int  # default sequences per update, kept fixed across node counts
    save_interval_updates: int
    log_interval: int
    arch_args: tuple[str, ...] = field(default=())

    def updates(self, asked: int | None) -> int:
        """Updates to train: ``--max-update`` when given, else this preset's (submit's spec
        and ``hpc-train plan`` both ask here)."""
        return self.max_update if asked is None else asked

    def describe(self) -> str:
        """One line for ``--help``: the model (with its overrides: tiny is a shrunk base) and
        the recipe's batch."""
        model = self.arch
        if self.arch_args:
            flags = dict(zip(self.arch_args[::2], self.arch_args[1::2], strict=False))
            layers = flags.get("--encoder-layers", "?")
            model = f"{self.arch} shrunk to {layers} layers, dim {flags.get('--encoder-embed-dim', '?')}"
        return (
            f"{model}, {self.tokens_per_sample} tokens, {self.global_batch} sequences per update, "
            f"{self.max_update} updates"
        )


# The optimizer: Adam with fairseq's semantics. On GPUs through torch's fused AdamW kernel
# (hpc_train.worker.optim registers it with fairseq); on CPU ranks fairseq's own.
GPU_OPTIMIZER = "fused_adamw"
CPU_OPTIMIZER = "adam"

# The recipe shared by every preset (fairseq flags; the optimizer is chosen per device above).
RECIPE: tuple[str, ...] = (
    "--task", "masked_lm",
    "--criterion", "masked_lm",
    "--sample-break-mode", "complete",
    "--adam-betas", "(0.9, 0.98)",
    "--adam-eps", "1e-6",
    "--clip-norm", "0.0",
    "--lr-scheduler", "polynomial_decay",
    "--dropout", "0.1",
    "--attention-dropout", "0.1",
    "--weight-decay", "0.01",
)  # fmt: skip

# ~0.5M parameters (most in the embeddings): trains at ~25 updates/s on one CPU core.
TINY_ARCH: tuple[str, ...] = (
    "--encoder-layers", "2",
    "--encoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2",
    "--max-positions", "64",
)  # fmt: skip

# The seed recipe (ray_train.sh): 125k updates, 10k warmup, peak lr 5e-4, 2048 sequences/update.
ROBERTA_BASE = Preset(
    name="roberta-base",
    arch="roberta_base",
    batch_per_device=16,
    tokens_per_sample=512,
    peak_lr=0.0005,
    warmup_updates=10000,
    max_update=125000,
    global_batch=2048,
    save_interval_updates=1000,
    log_interval=10,
)
# 355M parameters; the seed recipe's 8 sequences per GPU.
ROBERTA_LARGE = replace(
    ROBERTA_BASE, name="roberta-large", arch="roberta_large", batch_per_device=8
)
TINY = replace(
    ROBERTA_BASE,
    name="tiny",
    batch_per_device=8,
    tokens_per_sample=64,
    peak_lr=0.001,
    warmup_updates=10,
    max_update=200,
    global_batch=16,
    save_interval_updates=50,
    log_interval=5,
    arch_args=TINY_ARCH,
)

PRESETS: dict[str, Preset] = {p.name: p for p in (ROBERTA_LARGE, ROBERTA_BASE, TINY)}


def get(name: str) -> Preset:
    """The preset called ``name``; ValueError lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (choose from: {', '.join(PRESETS)})") from None
