"""The memory probe behind ``hpc_train.job.devices``: peak GPU memory and speed per batch size.

    python -m benchmarks.gpu probe --data DIR --out benchmarks/results/gpu-probe.json

One process per preset builds fairseq's real trainer from the toolkit's own arguments (the
instance type's precision, ``fused_adamw``) and runs full training steps (forward, backward,
optimizer) on synthetic 512-token batches of growing size: a few warm-up steps, then timed ones,
then the memory the CUDA allocator has reserved. The first out-of-memory ends the sweep. Synthetic batches (random tokens, 15 % masked) need no data loader, so the speed is an
upper bound that ranks batch sizes; the benchmark measures real training.

Also: one optimizer step over the preset's parameter shapes, fairseq's ``adam`` against
``fused_adamw``, both on fp32 master weights kept per parameter (as fairseq's ``--bf16`` does)
and flattened into one tensor (as ``--fp16`` does).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from hpc_train.job import command_lines, devices
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training

GiB = 1 << 30
MASK_PROB = 0.15


def probe_args(
    preset: str, data: Path, save_dir: Path, instance_type: str, batch: int
) -> list[str]:
    """The toolkit's fairseq arguments for one GPU at ``batch`` sequences per step."""
    spec = JobSpec(
        Training(preset, data, save_dir),
        Sizing(gpus_per_node=1, instance_type=instance_type, global_batch=batch,
               batch_per_device=batch),
    )  # fmt: skip
    args, _ = command_lines.fairseq_args(spec, world_size=1, gpu=True)
    return args


def synthetic_sample(
    batch: int, length: int, vocab: int, pad: int, nspecial: int
) -> dict[str, Any]:
    """A masked-LM batch as fairseq's masked_lm task yields it: random tokens, targets at 15 %."""
    import torch

    tokens = torch.randint(nspecial, vocab, (batch, length))
    masked = torch.rand(batch, length) < MASK_PROB
    masked[:, 0] = True  # at least one target per row
    target = torch.where(masked, tokens, torch.full_like(tokens, pad))
    return {
        "id": torch.arange(batch),
        "nsentences": batch,
        "ntokens": batch * length,
        "net_input": {"src_tokens": tokens, "src_lengths": torch.full((batch,), length)},
        "target": target,
    }


def build_trainer(args: list[str]) -> tuple[Any, Any]:
    """fairseq's Trainer and task for ``args`` (the worker's own config parsing)."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    from hpc_train.worker import optim  # noqa: F401  registers fused_adamw
    from hpc_train.worker.train import fairseq_config

    cfg = fairseq_config(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), task


def sweep(
    preset: str,
    data: Path,
    sizes: list[int],
    instance_type: str = "p5.48xlarge",
    warmup: int = 2,
    steps: int = 4,
) -> dict[str, Any]:
    """Peak GiB and words/s per batch size, until the first out-of-memory."""
    import torch

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as save:
        args = probe_args(preset, data, Path(save), instance_type, max(sizes))
        if not cuda:
            args.append("--cpu")
        trainer, task = build_trainer(args)
        vocab = task.source_dictionary
        length = int(args[args.index("--tokens-per-sample") + 1])
        rows: list[dict[str, Any]] = []
        for batch in sizes:
            sample = synthetic_sample(batch, length, len(vocab), vocab.pad(), vocab.nspecial)
            seconds = timed_steps(trainer, sample, warmup, steps, cuda)
            if seconds is None:
                rows.append({"batch": batch, "oom": True})
                break
            rows.append(
                {
                    "batch": batch,
                    "oom": False,
                    "words_per_s": round(batch * length * steps / seconds),
                    # fairseq's train_step resets torch's peak counters every step (for its
                    # gb_free metric), so the allocated peak is lost; what the caching allocator
                    # reserved is what must fit (it only grows along the sweep).
                    "reserved_gib": round(torch.cuda.max_memory_reserved() / GiB, 2)
                    if cuda
                    else None,
                }
            )
        params = sum(p.numel() for p in trainer.model.parameters())
        shapes = [tuple(p.shape) for p in trainer.model.parameters()]
    return {
        "preset": preset,
        "instance_type": instance_type,
        "precision": devices.precision(instance_type),
        "tokens_per_sample": length,
        "params": params,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "rows": rows,
        "optimizer_step_ms": optimizer_steps(shapes, "cuda" if cuda else "cpu"),
    }


def timed_steps(
    trainer: Any, sample: dict[str, Any], warmup: int, steps: int, cuda: bool
) -> float | None:
    """Seconds `steps` training steps on `sample` take after `warmup` untimed ones (the GPU's
    peak counters reset between them); None at the first out-of-memory."""
    import torch

    try:
        for _ in range(warmup):
            trainer.train_step([sample], raise_oom=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        for _ in range(steps):
            trainer.train_step([sample], raise_oom=True)
        if cuda:
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        return None
    return time.perf_counter() - started


def optimizer_steps(
    shapes: list[tuple[int, ...]], device: str, steps: int = 10
) -> dict[str, float]:
    """Milliseconds per step: fairseq's adam vs fused_adamw, per-parameter and flat fp32."""
    import torch
    from fairseq.optim.adam import Adam

    from hpc_train.worker.optim import FusedAdamW

    out: dict[str, float] = {}
    for layout in ("per_param", "flat"):
        if layout == "flat":
            params = [torch.randn(sum(torch.Size(s).numel() for s in shapes), device=device)]
        else:
            params = [torch.randn(s, device=device) for s in shapes]
        for name, make in (
            ("fairseq_adam", lambda p: Adam(p, lr=1e-4, betas=(0.9, 0.98), eps=1e-6)),
            ("fused_adamw", lambda p: FusedAdamW(p, 1e-4, (0.9, 0.98), 1e-6, 0.01)),
        ):
            opt = make([torch.nn.Parameter(p.clone()) for p in params])
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.randn_like(p)
            opt.step()  # state allocation out of the timing
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            out[f"{name}_{layout}"] = round((time.perf_counter() - started) * 1000 / steps, 2)
            del opt
    return out
