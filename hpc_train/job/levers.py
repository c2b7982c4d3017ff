"""Speed levers: which GPU speed-ups a run uses, chosen from the GPU's compute capability
(issue 29). Pure: no torch, no fairseq.

Each lever is a submit option ``--NAME auto|on|off``, a field of the spec's ``Speed`` section
(``JobSpec.speed``), named by its ``LeverName``. ``auto`` takes the lever's default for the GPU
of ``--instance-type``; a lever is on by default only where it is known to help, and a lever not
yet measured on a GPU is wired but off by default and says "unmeasured"; one measured inside
the run-to-run noise stays off and says its figure (the H200 session of 2026-11-29:
docs/gpu.md). ``--dry-run`` lists the choices with their reasons; the rank receives them as one
worker argument (``worker_args``) and checks them again against the GPU it actually has
(``hpc_train.worker.speed``).

What each compute capability can run (sm70 V100 on p3dn, sm80 A100 on p4d/p4de, sm90 H100 on p5):
- ``compile``: Inductor accepts sm70+, but Triton's tensor-core matmuls are deprecated on Volta:
  there it still fuses the pointwise and norm work (bias+GELU, dropout+residual+LayerNorm) and
  the matmuls stay on cuBLAS (Inductor's default without max-autotune, on every GPU). CPU
  ranks run it too (Inductor's C++ backend): that is how its arithmetic is tested here.
- ``flash``: SDPA's FlashAttention backend needs sm80+ (PyTorch's ``sdp_utils``); sm70 gets the
  memory-efficient backend. Off: memory-efficient or math, never flash (the p3dn limits run on
  an H100).
- ``fused-adamw``: fairseq's Adam through torch's fused AdamW kernel (``worker.optim``); any
  CUDA GPU; CPU ranks keep fairseq's own ``adam`` unless asked (torch has a CPU kernel too).
- ``gelu``: GELU in the compute dtype (fairseq 0.12 computes it on ``x.float()`` and casts back:
  an fp32 round trip of the 4x-wide FFN activation in every layer, forward and backward); on
  from sm90, where it was measured 10-12 % faster (its casts: 111 ms of a 971 ms update, 3 after);
- ``pad-check``: whether a batch has padding is read on the host, from the batch before its copy
  to the GPU, not from the GPU once per encoder layer (fairseq: a host sync per layer);
- ``host-sizes``: the number of masked tokens (the loss's divisor) counted on the host from the
  same batch, so neither the gradient scaling nor the meters read it back from the GPU;
- ``lazy-stats``: fairseq rounds each update's own loss and perplexity on the host for a return
  value its loop only tests against None (two host syncs per update); left unread;
- ``foreach-grads``: fairseq's bf16 wrapper copies gradients and parameters and takes the
  gradient norm one tensor at a time (~200 launches each for roberta-base); multi-tensor
  (``torch._foreach_*``) ops do each in a few;
- ``pack``: ``--sample-break-mode none``: blocks of exactly 512 tokens, sentences cut at the
  block's end, no padding, so attention runs without a mask (FlashAttention eligible). It
  changes the samples (the loss curve: docs/gpu.md), so it is the user's choice and off unless
  asked, though measured 30 % faster on an H200: a default that a later version turned on would
  also change, at a requeue, the blocks a running job's data position counts;
- precision is not a lever here: ``job.devices`` owns it (bf16 from sm80, fp16 with fairseq's
  dynamic loss scale on V100; ``--precision``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpc_core.instances import INSTANCE_TYPES
from hpc_train.job.fields import option

CC = tuple[int, int]  # CUDA compute capability (major, minor)
SETTINGS = ("auto", "on", "off")
WORKER_FLAG = "--hpc-levers"  # the rank's argument: the levers on, comma-separated, or "none"
# What the GPU session measured (benchmarks/results/gpu-session-h200-20261129-*.json, docs/gpu.md):
# roberta-large, bf16, 64 sequences per GPU x 4, the demo corpus, words/s median after warm-up.
H200 = "measured on an H200 (2026-11-29, roberta-large bf16)"
NOISE = "two runs of one setting differ by up to 2.3 %"
GELU_ALONE = "gelu alone's 140.8k and 144.0k words/s"  # gelu is sm90's default: the base line

# The GPU models of hpc_core.instances by compute capability (NVIDIA's CUDA GPUs table).
COMPUTE_CAPABILITY: dict[str, CC] = {"V100": (7, 0), "A100": (8, 0), "H100": (9, 0)}
FALLBACK_CC: CC = (7, 0)  # a GPU this table does not know: the oldest the pinned torch runs


class LeverName(StrEnum):
    """A speed lever's name: its submit option is ``--NAME``, and the rank's argument
    (``WORKER_FLAG``) lists the names of those on. A member is the string it names: every
    module names a lever by its member (tests/hpc_train/test_vocabulary.py reads the code)."""

    COMPILE = "compile"
    FLASH = "flash"
    FUSED_ADAMW = "fused-adamw"
    GELU = "gelu"
    PAD_CHECK = "pad-check"
    HOST_SIZES = "host-sizes"
    LAZY_STATS = "lazy-stats"
    FOREACH_GRADS = "foreach-grads"
    PACK = "pack"


@dataclass(frozen=True)
class Lever:
    name: LeverName  # the submit option is --NAME
    what: str
    needs: CC  # the lowest compute capability that runs it
    cpu: bool  # CPU ranks can run it
    on_from: CC | None  # on by default from this capability up; None: off by default
    evidence: str  # what was measured, or "unmeasured"

    def runs_on(self, cc: CC | None) -> bool:
        return self.cpu if cc is None else cc >= self.needs


def anywhere(name: LeverName, what: str, evidence: str, on_from: CC | None = None) -> Lever:
    """A lever every supported GPU (sm70 up) and CPU ranks can run; off unless ``on_from``."""
    return Lever(name, what, needs=(7, 0), cpu=True, on_from=on_from, evidence=evidence)


LEVERS: tuple[Lever, ...] = (
    anywhere(
        LeverName.COMPILE,
        "torch.compile (Inductor) of each encoder layer: fused elementwise and norm work "
        "(on sm70 pointwise fusion only; matmuls stay on cuBLAS)",
        f"{H200}: with the five exact levers and pack 199k vs 192k words/s (+3.5 %, one run; "
        f"{NOISE}), and each start compiles for about 27 s (exit 7.2 s vs 3.6): off; same losses "
        "as fairseq's path on CPU (fp32, dropout 0)",
    ),
    Lever(
        LeverName.FLASH,
        "SDPA may pick its FlashAttention backend (off: memory-efficient, then math)",
        needs=(8, 0),
        cpu=False,
        on_from=(8, 0),
        evidence="PyTorch's own default where the GPU has it; not measured alone here",
    ),
    Lever(
        LeverName.FUSED_ADAMW,
        "fairseq's Adam through torch's fused AdamW kernel (off: fairseq's adam)",
        needs=(7, 0),
        cpu=True,  # torch's fused AdamW has a CPU kernel too: off there unless asked for
        on_from=(7, 0),
        evidence="measured on an H100: one step 1.1 ms vs 16.2 ms (bf16); sm70/sm80 unmeasured",
    ),
    anywhere(
        LeverName.GELU,
        "GELU in the compute dtype (off: fairseq's fp32 round trip)",
        f"{H200}: alone 141k and 144k words/s vs the defaults' 128k (+10-12 %; {NOISE}); "
        "sm70/sm80 unmeasured",
        on_from=(9, 0),
    ),
    anywhere(
        LeverName.PAD_CHECK,
        "padding read from the batch on the host, not once per layer on the GPU",
        f"{H200}: alone 128.4k vs 128.1k words/s, inside the noise (96 host syncs per update "
        "fewer, and no faster)",
    ),
    anywhere(
        LeverName.HOST_SIZES,
        "the loss's token count taken on the host, not read back from the GPU",
        f"{H200}: alone 129.3k vs 128.1k words/s; with gelu 141.1k vs {GELU_ALONE}: inside the noise",
    ),
    anywhere(
        LeverName.LAZY_STATS,
        "fairseq's unread per-update stats left on the GPU, not rounded there",
        f"{H200}: with gelu 140.1k vs {GELU_ALONE}: inside the noise",
    ),
    anywhere(
        LeverName.FOREACH_GRADS,
        "bf16 gradient/parameter copies and norm as multi-tensor ops",
        f"{H200}: with gelu 140.5k vs {GELU_ALONE}: inside the noise",
    ),
    anywhere(
        LeverName.PACK,
        "--sample-break-mode none: full 512-token blocks, no padding, no mask",
        f"{H200}: with the five exact levers 192k vs 147k words/s (+30 %, of which 2.5 % is "
        "padding): it changes the samples, so a choice, off unless asked",
    ),
)
BY_NAME: dict[LeverName, Lever] = {lever.name: lever for lever in LEVERS}


def lever_option(name: LeverName) -> Any:
    """The submit option of a lever: ``--NAME auto|on|off``, its help the lever's ``what``."""
    return option(f"--{name}", BY_NAME[name].what, default="auto", choices=SETTINGS)


def field_of(name: LeverName) -> str:
    """The ``Speed`` field of a lever: its member's name (``FUSED_ADAMW``: ``fused_adamw``)."""
    return name.name.lower()


@dataclass(frozen=True)
class Speed:
    """The speed levers as the user set them (``JobSpec.speed``): one field per lever, in the
    table's order (``field_of``), ``auto`` unless asked."""

    compile: str = lever_option(LeverName.COMPILE)
    flash: str = lever_option(LeverName.FLASH)
    fused_adamw: str = lever_option(LeverName.FUSED_ADAMW)
    gelu: str = lever_option(LeverName.GELU)
    pad_check: str = lever_option(LeverName.PAD_CHECK)
    host_sizes: str = lever_option(LeverName.HOST_SIZES)
    lazy_stats: str = lever_option(LeverName.LAZY_STATS)
    foreach_grads: str = lever_option(LeverName.FOREACH_GRADS)
    pack: str = lever_option(LeverName.PACK)

    @classmethod
    def of(cls, asked: Mapping[LeverName, str]) -> Speed:
        """The levers ``asked`` (name -> auto/on/off), every other at ``auto``."""
        return cls(**{field_of(name): setting for name, setting in asked.items()})

    def settings(self) -> dict[LeverName, str]:
        """Every lever's setting, by name (``choose`` and ``problem`` take it)."""
        return {lever.name: getattr(self, field_of(lever.name)) for lever in LEVERS}

    def asked(self) -> dict[LeverName, str]:
        """The levers not left at ``auto``."""
        return {name: setting for name, setting in self.settings().items() if setting != "auto"}


@dataclass(frozen=True)
class Choice:
    lever: Lever
    on: bool
    why: str

    def line(self) -> str:
        state = "on " if self.on else "off"
        return f"{self.lever.name:<12} {state} {self.why} [{self.lever.evidence}]"


def compute_capability(instance_type: str | None) -> CC:
    """The compute capability of ``instance_type``'s GPU; ``FALLBACK_CC`` for a type or GPU
    this table does not know (only what every supported GPU runs is on by default)."""
    itype = INSTANCE_TYPES.get(instance_type or "")
    return COMPUTE_CAPABILITY.get(itype.gpu_model, FALLBACK_CC) if itype else FALLBACK_CC


def where(cc: CC | None) -> str:
    return "CPU ranks" if cc is None else f"sm{cc[0]}{cc[1]}"


def choose_one(lever: Lever, cc: CC | None, asked: str = "auto") -> Choice:
    """One lever's state on ``cc`` (None: CPU ranks) for the setting ``asked``. A lever the
    device cannot run is off whatever was asked (``problem`` refuses that at submit)."""
    if not lever.runs_on(cc):
        return Choice(lever, False, f"{where(cc)} cannot run it")
    if asked == "on":
        return Choice(lever, True, "asked for")
    if asked == "off":
        return Choice(lever, False, "turned off")
    default = lever.on_from is not None and cc is not None and cc >= lever.on_from
    return Choice(lever, default, f"the default for {where(cc)}")


def choose(cc: CC | None, asked: Mapping[LeverName, str] | None = None) -> tuple[Choice, ...]:
    """Every lever's state on ``cc`` (None: CPU ranks); ``asked``: lever name -> auto/on/off."""
    asked = asked or {}
    return tuple(choose_one(lever, cc, asked.get(lever.name, "auto")) for lever in LEVERS)


def problem(cc: CC | None, asked: Mapping[LeverName, str], gpu_text: str) -> str | None:
    """One line when a setting cannot be honoured: an unknown lever or setting, or ``on`` for a
    lever the device cannot run (``gpu_text`` names it for the user)."""
    for name, setting in asked.items():
        if name not in BY_NAME:
            return f"unknown speed lever {name!r} (choose from: {', '.join(BY_NAME)})"
        if setting not in SETTINGS:
            return f"--{name} {setting}: choose from {', '.join(SETTINGS)}"
        lever = BY_NAME[name]
        if setting == "on" and not lever.runs_on(cc):
            return f"--{name} on: {gpu_text} ({where(cc)}) cannot run it"
    return None


def on_names(choices: Sequence[Choice]) -> list[LeverName]:
    return [c.lever.name for c in choices if c.on]


def worker_args(choices: Sequence[Choice]) -> list[str]:
    """The rank's argument carrying the levers that are on (``parse_worker_value`` reads it)."""
    return [WORKER_FLAG, ",".join(on_names(choices)) or "none"]


def parse_worker_value(text: str) -> frozenset[LeverName]:
    """The lever names in ``WORKER_FLAG``'s value; ValueError for an unknown one."""
    names = frozenset(n for n in text.split(",") if n and n != "none")
    unknown = sorted(names - BY_NAME.keys())
    if unknown:
        raise ValueError(f"{WORKER_FLAG}: unknown lever(s) {', '.join(unknown)}")
    return frozenset(LeverName(n) for n in names)


def describe(choices: Sequence[Choice], cc: CC | None) -> list[str]:
    """``--dry-run``'s lines: one per lever, with its reason and its evidence."""
    head = f"# speed levers for {where(cc)} (--NAME auto|on|off; docs/gpu.md):"
    return [head, *(f"#   {c.line()}" for c in choices)]
