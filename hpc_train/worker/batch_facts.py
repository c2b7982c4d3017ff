"""Facts about a batch read on the host, before its copy to the GPU (levers ``pad-check`` and
``host-sizes``, issue 36).

fairseq 0.12 asks the GPU two questions about every batch that the batch, still in host memory,
answers for free:
- *does it hold padding?* The encoder computes ``padding_mask.any()`` on the device and tests
  it in Python before the embedding and again for every layer (``transformer_encoder.py``:
  ``encoder_padding_mask if has_pads else None``): a host sync per layer, 12 per forward in
  roberta-base, 24 in roberta-large;
- *how many tokens are masked?* The masked-LM criterion returns that count (the gradient's
  divisor) as a device tensor; the trainer then tests it in Python (``sample_size or 1.0``) and
  the loss meter compares it with 0: a host sync each.

``install`` answers both on the host as fairseq prepares the batch (``Trainer._prepare_sample``,
before ``move_to_cuda``), on the token tensors still in the loader's memory, and pins the answer
to the batch's ``src_tokens`` tensor (``FACTS``). The encoder then takes its padding decision
from it (``forward_scriptable`` below: fairseq's arithmetic, the mask passed to every layer only
when there is padding, as fairseq does), and the criterion returns the count as a Python int.
A batch without the pinned facts (one prepared elsewhere) is asked once per forward, not once
per layer. The arithmetic is unchanged: same outputs and gradients (tests/hpc_train/worker/
test_levers_rank.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hpc_train.worker import host_reads

FACTS = "hpc_batch_facts"  # the attribute on a batch's src_tokens tensor


@dataclass(frozen=True)
class Facts:
    has_pads: bool
    masked: int  # target tokens that are not padding: the masked-LM loss's sample size


def read(sample: Any, pad: int) -> Facts | None:
    """The facts of ``sample`` from its host tensors; None when it has no masked-LM tensors or
    they are already on the device (nothing to read for free)."""
    net_input = sample.get("net_input") if isinstance(sample, dict) else None
    tokens = net_input.get("src_tokens") if isinstance(net_input, dict) else None
    target = sample.get("target")
    if not (torch.is_tensor(tokens) and torch.is_tensor(target)):
        return None
    if tokens.device.type != "cpu" or target.device.type != "cpu":
        return None
    with host_reads.host_side():
        return Facts(bool(tokens.eq(pad).any()), int(target.ne(pad).sum()))


def pinned(tokens: Any) -> Facts | None:
    return getattr(tokens, FACTS, None)


def _pin(sample: Any, facts: Facts) -> None:
    setattr(sample["net_input"]["src_tokens"], FACTS, facts)


def prepare_with_facts(original: Any) -> Any:
    """``Trainer._prepare_sample`` that reads the facts on the host first and pins them to the
    prepared batch (the dummy batch, prepared again from device tensors, keeps its own)."""

    def _prepare_sample(self: Any, sample: Any, is_dummy: bool = False) -> Any:
        facts = read(sample, self.task.source_dictionary.pad()) if sample else None
        prepared, dummy = original(self, sample, is_dummy)
        if facts is not None and prepared is not None:
            _pin(prepared, facts)
        return prepared, dummy

    _prepare_sample.hpc_facts = True  # type: ignore[attr-defined]
    return _prepare_sample


def forward_scriptable(
    self: Any,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor | None = None,
    return_all_hiddens: bool = False,
    token_embeddings: torch.Tensor | None = None,
) -> dict[str, list[Any]]:
    """fairseq 0.12's ``TransformerEncoderBase.forward_scriptable``, its padding decision taken
    once, from the batch's pinned facts when it has them."""
    padding_mask = src_tokens.eq(self.padding_idx)
    facts = pinned(src_tokens)
    has_pads = facts.has_pads if facts is not None else bool(padding_mask.any())
    x, embedding = self.forward_embedding(src_tokens, token_embeddings)
    if has_pads:  # fairseq multiplies by (1 - mask * has_pads) either way: x * 1 without pads
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
    x = x.transpose(0, 1)  # B x T x C -> T x B x C
    layer_mask = padding_mask if has_pads else None
    states: list[torch.Tensor] = [x] if return_all_hiddens else []
    fc_results: list[Any] = []
    for layer in self.layers:
        out = layer(x, encoder_padding_mask=layer_mask)
        x, fc_result = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        if return_all_hiddens:
            states.append(x)
            fc_results.append(fc_result)
    if self.layer_norm is not None:
        x = self.layer_norm(x)
    lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)
    return {
        "encoder_out": [x],  # T x B x C
        "encoder_padding_mask": [padding_mask],  # B x T
        "encoder_embedding": [embedding],  # B x T x C
        "encoder_states": states,
        "fc_results": fc_results,
        "src_tokens": [],
        "src_lengths": [lengths.contiguous()],
    }


def criterion_with_host_size(original: Any) -> Any:
    """The masked-LM criterion's ``forward`` returning the pinned token count (a Python int)
    as its sample size; the loss itself is unchanged (a sum, fairseq divides later)."""

    def forward(self: Any, model: Any, sample: Any, reduce: bool = True) -> Any:
        loss, sample_size, logging_output = original(self, model, sample, reduce)
        facts = pinned(sample["net_input"]["src_tokens"])
        if facts is not None:
            sample_size = logging_output["sample_size"] = facts.masked
        return loss, sample_size, logging_output

    forward.hpc_facts = True  # type: ignore[attr-defined]
    return forward


def install(pad_check: bool, host_sizes: bool) -> None:
    """Read the facts as fairseq prepares each batch, and use them where asked."""
    from fairseq.criterions.masked_lm import MaskedLmLoss
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
    from fairseq.trainer import Trainer

    if not (pad_check or host_sizes):
        return
    if not getattr(Trainer._prepare_sample, "hpc_facts", False):
        Trainer._prepare_sample = prepare_with_facts(Trainer._prepare_sample)
    if pad_check:
        TransformerEncoderBase.forward_scriptable = forward_scriptable
    if host_sizes and not getattr(MaskedLmLoss.forward, "hpc_facts", False):
        MaskedLmLoss.forward = criterion_with_host_size(MaskedLmLoss.forward)
