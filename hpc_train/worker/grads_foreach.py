"""Lever ``foreach-grads`` (issue 36): fairseq's per-tensor gradient loops as multi-tensor ops.

With ``--bf16`` (and ``--fp16-no-flatten-grads``) fairseq 0.12's ``FP16Optimizer`` keeps one
fp32 master per parameter and, every update, walks them in Python: it copies each gradient to
its master (``_sync_fp16_grads_to_fp32``), takes each master gradient's norm apart and stacks
them (``utils.clip_grad_norm_`` without apex's ``amp_C``), copies each master back into the model
(``_sync_fp32_params_to_fp16``) and zeroes each master gradient (``zero_grad``). That is four
launches per parameter tensor, some 800 per update for roberta-base's ~200 tensors, each a
Python call and a small kernel. Here each loop is one ``torch._foreach_*`` call: the same
copies and norms (on a GPU in a few multi-tensor kernels; on a CPU torch loops in C++).

Unchanged: the flat-buffer path (fp16 on V100 flattens already), the first update (it creates
the master gradients, as fairseq does), a parameter without a gradient (fairseq's zeros), the
apex path when ``amp_C`` is there, and the arithmetic: the norm is still the fp32 norm of each
tensor's norm, the copies are copies.
"""

from __future__ import annotations

from typing import Any

import torch


def trained_pairs(self: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(model parameter, its fp32 master) for each parameter that trains (fairseq's order)."""
    pairs = zip(self.fp16_params, self.fp32_params, strict=True)
    return [(p, p32) for p, p32 in pairs if p.requires_grad]


def sync_grads_to_fp32(self: Any) -> None:
    """``_sync_fp16_grads_to_fp32`` for per-parameter masters: one multi-tensor copy once every
    master gradient exists; fairseq's own loop otherwise."""
    if not self._needs_sync:
        return
    if self.has_flat_params:
        return self._hpc_loop_sync_grads()
    pairs = trained_pairs(self)
    grads = [(p.grad, p32.grad) for p, p32 in pairs]
    if any(g is None or g32 is None for g, g32 in grads):
        return self._hpc_loop_sync_grads()
    torch._foreach_copy_([g32 for _, g32 in grads if g32 is not None],
                         [g for g, _ in grads if g is not None])  # fmt: skip
    self._needs_sync = False


def sync_params_to_fp16(self: Any) -> None:
    """``_sync_fp32_params_to_fp16`` for per-parameter masters: one multi-tensor copy."""
    if self.has_flat_params:
        return self._hpc_loop_sync_params()
    pairs = trained_pairs(self)
    torch._foreach_copy_([p.data for p, _ in pairs], [p32.data for _, p32 in pairs])


def zero_grad(self: Any) -> None:
    """``zero_grad``: per-parameter master gradients zeroed in one multi-tensor call."""
    if self.has_flat_params:
        return self._hpc_loop_zero_grad()
    for p in self.fp16_params:
        p.grad = None
    grads = [p32.grad for p32 in self.fp32_params if p32.grad is not None]
    if grads:
        torch._foreach_zero_(grads)
    self._needs_sync = False
    if self.scaler is not None:
        self._multiply_factor = 1.0 / float(self.scaler.loss_scale)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """fairseq's norm without apex: the 2-norm of the per-tensor fp32 2-norms."""
    if len(grads) == 1:
        return torch.norm(grads[0], p=2, dtype=torch.float32)
    return torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))


def clip_grad_norm_(params: Any, max_norm: float, aggregate_norm_fn: Any = None) -> torch.Tensor:
    """``fairseq.utils.clip_grad_norm_`` with the per-tensor norms as one multi-tensor call."""
    from fairseq import utils

    params = [params] if torch.is_tensor(params) else list(params)
    with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
    grads = [p.grad.detach() for p in with_grad if not hasattr(p, "expert")]
    expert_grads = [p.grad.detach() for p in with_grad if hasattr(p, "expert")]
    if not grads or utils.multi_tensor_l2norm_available:
        return utils._hpc_loop_clip_grad_norm_(params, max_norm, aggregate_norm_fn)
    norm = total_norm(grads)
    if aggregate_norm_fn is not None:
        norm = aggregate_norm_fn(norm)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (norm + 1e-6)).clamp_(max=1)
        torch._foreach_mul_(grads + expert_grads, clip_coef)
    return norm


def install() -> None:
    """Swap the four loops for the multi-tensor versions (fairseq's kept as ``_hpc_loop_*``)."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin as Mixin

    if getattr(Mixin, "_hpc_loop_sync_grads", None) is None:
        Mixin._hpc_loop_sync_grads = Mixin._sync_fp16_grads_to_fp32
        Mixin._hpc_loop_sync_params = Mixin._sync_fp32_params_to_fp16
        Mixin._hpc_loop_zero_grad = Mixin.zero_grad
        Mixin._sync_fp16_grads_to_fp32 = sync_grads_to_fp32
        Mixin._sync_fp32_params_to_fp16 = sync_params_to_fp16
        Mixin.zero_grad = zero_grad
    if getattr(utils, "_hpc_loop_clip_grad_norm_", None) is None:
        utils._hpc_loop_clip_grad_norm_ = utils.clip_grad_norm_
        utils.clip_grad_norm_ = clip_grad_norm_
