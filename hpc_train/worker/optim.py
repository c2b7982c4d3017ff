"""``--optimizer fused_adamw``: fairseq's ``adam`` update through torch's fused AdamW kernel.

Without apex, fairseq's ``adam`` is a Python loop over parameters, about ten element-wise kernels
each; with ``--bf16`` fairseq keeps one fp32 master tensor per parameter (no flattening), so a
roberta-base update launches some two thousand small kernels. ``torch.optim.AdamW(fused=True)``
does the same arithmetic in a few multi-tensor kernels (``foreach`` is the fallback choice).
Importing this module registers the optimizer with fairseq (the training worker does).

Semantics: fairseq's ``adam`` (``fairseq.optim.adam.Adam``, amsgrad off), on the fp32 master
weights that fairseq's FP16Optimizer keeps for ``--fp16`` / ``--bf16``::

    m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
    p = p - lr wd p                                 (decoupled weight decay, AdamW)
    p = p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)

Where eps enters differs: torch divides ``sqrt(v)`` by ``sqrt(1 - b2^t)`` *before* adding eps.
The two agree exactly when torch is given ``eps_t = eps / sqrt(1 - b2^t)``, which this optimizer
sets before every step from its own step count (``fairseq_step`` in each param group). Left over:
float rounding (another order of operations), about one ulp per step; and the step count is
per group, not per parameter, so a parameter that gets no gradient in some update would see a
slightly different bias correction afterwards than under fairseq's ``adam`` (never the case for
masked-LM RoBERTa, where every parameter gets a gradient every update).

A checkpoint written with fairseq's ``adam`` under ``--fp16``/``--bf16`` (the optimizer fairseq
records there is ``FP16Optimizer`` either way) resumes with this one: integer step counts become
tensors and the group step count is taken from the state.
"""

# No ``from __future__ import annotations`` here: fairseq reads the config dataclass's field types
# at run time to build its argparse options.
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from hpc_train.job.presets import GPU_OPTIMIZER

IMPLS = ChoiceEnum(["fused", "foreach"])


class FusedAdamW(torch.optim.AdamW):
    """torch's AdamW with fairseq's eps placement (see the module docstring)."""

    supports_flat_params = True  # FP16Optimizer may hand over one flat fp32 tensor
    supports_memory_efficient_fp16 = False  # fp16 moments would lose precision

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        fairseq_eps: float,
        weight_decay: float,
        impl: str = "fused",
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=fairseq_eps,
            weight_decay=weight_decay,
            fused=impl == "fused",
            foreach=impl == "foreach",
        )
        for group in self.param_groups:
            group.setdefault("fairseq_eps", fairseq_eps)
            group.setdefault("fairseq_step", 0)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            group["fairseq_step"] += 1
            group["eps"] = torch_eps(group["fairseq_eps"], group["betas"][1], group["fairseq_step"])
        return super().step(closure)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(from_fairseq_adam(state_dict, self.param_groups))


def torch_eps(eps: float, beta2: float, step: int) -> float:
    """The eps that makes torch's AdamW step equal fairseq's Adam step at ``step`` (1-based)."""
    return eps / math.sqrt(1.0 - beta2**step)


def from_fairseq_adam(state_dict: dict[str, Any], current: list[dict[str, Any]]) -> dict[str, Any]:
    """A state dict of fairseq's ``Adam`` (or of this optimizer) in the form this one loads.

    fairseq's ``Adam`` counts steps in Python ints and has no ``fairseq_*`` group entries nor
    torch's implementation flags; torch restores the saved groups as they are, so missing
    entries are taken from the optimizer's ``current`` groups. Returns a new dict.
    """
    state = {
        key: {
            name: torch.tensor(float(value))
            if name == "step" and not torch.is_tensor(value)
            else value
            for name, value in entry.items()
        }
        for key, entry in state_dict["state"].items()
    }
    groups = []
    for saved, mine in zip(state_dict["param_groups"], current, strict=True):
        group = {**{k: v for k, v in mine.items() if k != "params"}, **saved}
        if "fairseq_step" not in saved:
            steps = [int(state[i]["step"]) for i in saved["params"] if "step" in state.get(i, {})]
            group["fairseq_step"] = max(steps, default=0)
            group["fairseq_eps"] = saved.get("eps", mine["fairseq_eps"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


@dataclass
class FusedAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    adam_impl: IMPLS = field(  # type: ignore[valid-type]
        default="fused", metadata={"help": "torch AdamW implementation: fused or foreach"}
    )
    lr: list[float] = II("optimization.lr")  # noqa: RUF009 - fairseq interpolates the lr


@register_optimizer(GPU_OPTIMIZER, dataclass=FusedAdamWConfig)
class FairseqFusedAdamW(FairseqOptimizer):
    """fairseq's ``adam`` arithmetic through ``torch.optim.AdamW(fused=True)``."""

    def __init__(self, cfg: FusedAdamWConfig, params: Iterable[Any]) -> None:
        super().__init__(cfg)
        self._optimizer = FusedAdamW(params, impl=str(cfg.adam_impl), **self.optimizer_config)

    @property
    def optimizer_config(self) -> dict[str, Any]:
        """Constructor arguments, also applied over a resumed checkpoint's (fairseq's rule)."""
        lr = self.cfg.lr
        betas = self.cfg.adam_betas
        return {
            "lr": next(iter(lr)) if isinstance(lr, Collection) else lr,
            # fairseq's own parsing of --adam-betas "(0.9, 0.98)"
            "betas": tuple(eval(betas) if isinstance(betas, str) else betas),
            "fairseq_eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
        }
