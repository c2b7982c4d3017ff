"""What a checkpoint costs: its bytes from a preset, its save time on the cluster's storage, and
whether a save on notice fits the windows Slurm and EC2 give it. Pure arithmetic (no Slurm, no
torch); ``cluster_throughput_mbs`` reads a ParallelCluster config.

Bytes, from how fairseq saves (``Trainer.save_checkpoint``: ``utils.move_to_cpu(state_dict())``,
then ``torch.save``; the toolkit only makes the write atomic):

- ``model``: every parameter in fp32. Under ``--fp16``/``--bf16`` the model's half tensors are cast
  to fp32 by ``move_to_cpu``; FP16Optimizer's fp32 master copy is *not* saved (it is rebuilt from
  the model on load), so precision does not change the size.
- ``last_optimizer_state``: Adam's ``exp_avg`` and ``exp_avg_sq``, fp32, one of each per parameter
  (fairseq's ``adam`` and the toolkit's ``fused_adamw`` alike): 8 bytes per parameter.
- The output projection is tied to the token embedding (``lm_head.weight``). On a CPU rank in fp32
  both names hold one storage and ``torch.save`` writes it once; on a GPU ``move_to_cpu`` copies
  each name separately (``.cpu()`` / the fp32 cast), so the embedding is written twice.
- Plus a few hundred kB of pickled args, config and per-tensor records.

Checked: against fairseq's models built at full size (tests/hpc_train/planning/test_costs.py), a real tiny
and a real roberta-base checkpoint written on CPU here, and the GPU checkpoints measured by
``make bench-gpu`` (benchmarks/results/gpu.json: 1,117,248,843 and 3,759,669,067 bytes for
roberta-base and roberta-large with a 6,881-symbol dictionary; this model is within 0.02%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_core import space
from hpc_core.ledger import Event, Kind
from hpc_train.job import presets

# RoBERTa's GPT-2 BPE dictionary: 50,260 dict.txt symbols + 4 specials + <mask>.
DEFAULT_VOCAB = 50265
SPECIAL_SYMBOLS = 4  # <s> <pad> </s> <unk>, which fairseq's Dictionary adds before dict.txt
MASK_SYMBOLS = 1  # the masked-LM task adds <mask>
FP32 = 4
ADAM_STATES = 2  # exp_avg, exp_avg_sq
# args, cfg, extra_state and a pickle record per tensor: 56 kB (tiny, 2 layers) to 0.5 MB
# (roberta-large, 24 layers, bf16 + fused_adamw) measured
OVERHEAD_BYTES = 32 * 1024
OVERHEAD_PER_LAYER_BYTES = 16 * 1024

SPOT_NOTICE_S = 120.0  # EC2 posts the instance-action this long before it reclaims the instance
SPOT_POLL_S = 5.0  # the spot watcher's default poll (watch.spot): a notice is seen up to this late


@dataclass(frozen=True)
class Dims:
    """The shape of a RoBERTa encoder, as fairseq's ``--arch`` defaults and flags set it.
    ``max_positions``: ``--max-positions`` if given, else fairseq takes ``--tokens-per-sample``."""

    layers: int
    embed_dim: int
    ffn_dim: int
    max_positions: int


# fairseq's registered architectures (fairseq/models/roberta/model.py: base_architecture and
# roberta_large_architecture; max_positions comes from the preset); a fairseq-tier test builds
# them and compares.
ARCH_DIMS: dict[str, Dims] = {
    "roberta_base": Dims(layers=12, embed_dim=768, ffn_dim=3072, max_positions=0),
    "roberta_large": Dims(layers=24, embed_dim=1024, ffn_dim=4096, max_positions=0),
}

_FLAGS = {
    "--encoder-layers": "layers",
    "--encoder-embed-dim": "embed_dim",
    "--encoder-ffn-embed-dim": "ffn_dim",
    "--max-positions": "max_positions",
}


def dims(preset: presets.Preset) -> Dims:
    """The encoder shape of ``preset``: its arch's defaults with its ``arch_args`` applied."""
    try:
        base = ARCH_DIMS[preset.arch]
    except KeyError:
        raise ValueError(f"no parameter count for arch {preset.arch!r}") from None
    values = {**vars(base), "max_positions": preset.tokens_per_sample}
    flags = dict(zip(preset.arch_args[::2], preset.arch_args[1::2], strict=False))
    for flag, name in _FLAGS.items():
        if flag in flags:
            values[name] = int(flags[flag])
    return Dims(**values)


def vocab_size(dict_txt: Path) -> int:
    """Embedding rows for a corpus: its dict.txt symbols, fairseq's 4 specials and <mask>."""
    with dict_txt.open(encoding="utf-8") as fh:
        symbols = sum(1 for line in fh if line.strip())
    return symbols + SPECIAL_SYMBOLS + MASK_SYMBOLS


def parameters(d: Dims, vocab: int = DEFAULT_VOCAB) -> int:
    """Trainable parameters of fairseq's RobertaModel (masked-LM head, tied output weight)."""
    D, F = d.embed_dim, d.ffn_dim
    embeddings = vocab * D + (d.max_positions + 2) * D + 2 * D  # tokens, positions, layer norm
    # attention q,k,v,out (4 D^2 + 4 D), fc1/fc2 (2 D F + F + D), two layer norms (4 D)
    layer = 4 * D * D + 2 * D * F + 9 * D + F
    head = D * D + D + 2 * D + vocab  # dense, layer norm, output bias (weight tied)
    return embeddings + d.layers * layer + head


def checkpoint_bytes(d: Dims, vocab: int = DEFAULT_VOCAB, gpu: bool = True) -> int:
    """Bytes of one fairseq checkpoint file (model + Adam state), see the module docstring."""
    params = parameters(d, vocab)
    tied_copy = vocab * d.embed_dim * FP32 if gpu else 0
    overhead = OVERHEAD_BYTES + d.layers * OVERHEAD_PER_LAYER_BYTES
    return params * FP32 * (1 + ADAM_STATES) + tied_copy + overhead


def preset_checkpoint_bytes(name: str, vocab: int = DEFAULT_VOCAB, gpu: bool = True) -> int:
    return checkpoint_bytes(dims(presets.get(name)), vocab, gpu)


# --- storage ------------------------------------------------------------------------------------

# FSx for Lustre PERSISTENT_2: baseline throughput = PerUnitStorageThroughput (MB/s per TiB) x
# StorageCapacity; AWS counts the smallest file system, 1200 GiB, as 1.2 TiB (125 -> 150 MB/s).
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html
DEFAULT_STORAGE_GIB = 1200  # what pcluster_configs/*.yaml build
DEFAULT_PER_TIB_MBS = 125


def fsx_throughput_mbs(storage_gib: float, per_tib_mbs: float) -> float:
    """Baseline MB/s (10^6 bytes) of an FSx for Lustre file system."""
    if storage_gib <= 0 or per_tib_mbs <= 0:
        raise ValueError("FSx capacity and per-TiB throughput must be > 0")
    return per_tib_mbs * storage_gib / 1000


DEFAULT_THROUGHPUT_MBS = fsx_throughput_mbs(DEFAULT_STORAGE_GIB, DEFAULT_PER_TIB_MBS)


def cluster_throughput_mbs(config: Path) -> float:
    """The Lustre throughput a ParallelCluster config builds (its first FsxLustre storage);
    ValueError when it has none or the YAML is not a mapping."""
    import yaml

    doc = yaml.safe_load(config.read_text())
    storages = doc.get("SharedStorage", []) if isinstance(doc, dict) else []
    for item in storages:
        if isinstance(item, dict) and item.get("StorageType") == "FsxLustre":
            fsx = item.get("FsxLustreSettings") or {}
            return fsx_throughput_mbs(
                float(fsx.get("StorageCapacity", DEFAULT_STORAGE_GIB)),
                float(fsx.get("PerUnitStorageThroughput", DEFAULT_PER_TIB_MBS)),
            )
    raise ValueError(f"{config}: no FsxLustre shared storage")


def config_for(instance_type: str, configs: Path) -> Path | None:
    """The template in ``configs`` (pcluster_configs/) whose compute resources use
    ``instance_type``, the plain on-demand template first (``p3dn.yaml`` before
    ``p3dn-spot.yaml``, ``p5.yaml`` before ``p5-odcr.yaml`` and ``p5-capacity-block.yaml``)."""
    import yaml

    for path in sorted(configs.glob("*.yaml"), key=lambda p: ("-" in p.stem, p.name)):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        queues = (doc or {}).get("Scheduling", {}).get("SlurmQueues", [])
        for queue in queues:
            for resource in queue.get("ComputeResources", []):
                if resource.get("InstanceType") == instance_type:
                    return path
    return None


def save_seconds(nbytes: int, throughput_mbs: float, files: int = 1) -> float:
    """Seconds to write ``files`` copies of ``nbytes`` at ``throughput_mbs`` (10^6 bytes/s).

    A notice-save writes checkpoint_last.pt only (``files=1``); an interval save writes
    checkpoint_E_U.pt and fairseq copies it to checkpoint_last.pt (``files=2``; a new best adds
    checkpoint_best.pt)."""
    if throughput_mbs <= 0:
        raise ValueError("storage throughput must be > 0")
    return nbytes * files / (throughput_mbs * 1e6)


# --- windows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoticeWindow:
    """Seconds between a notice and the kill, and where they come from."""

    name: str
    seconds: float


@dataclass(frozen=True)
class Margin:
    """What a notice-save needs beyond the write: ``factor`` x the write (a slower disk than
    estimated, other jobs on the file system) plus ``fixed_s`` (reach the next update, all ranks
    agree, fsync, and today the DataLoader workers' teardown before torchrun exits: 0.7-40 s
    measured in issue 11) plus one update (the save happens at the next update boundary)."""

    factor: float = 1.5
    fixed_s: float = 15.0


@dataclass(frozen=True)
class WindowFit:
    window: NoticeWindow
    needed_s: float

    @property
    def fits(self) -> bool:
        return self.needed_s <= self.window.seconds

    def line(self) -> str:
        word = "fits" if self.fits else "does NOT fit"
        return (
            f"save on notice needs ~{self.needed_s:.0f} s: {word} the {self.window.name} "
            f"({self.window.seconds:.0f} s)"
        )


def windows(
    signal_delay_s: float | None, grace_time_s: float | None = None, spot: bool = False
) -> list[NoticeWindow]:
    """The windows that apply to a job: the time-limit signal (submitit's USR2, ``signal_delay_s``
    before the limit), the partition's GraceTime when it preempts, EC2's spot notice (less the
    watcher's poll interval) on spot capacity."""
    found: list[NoticeWindow] = []
    if signal_delay_s is not None:
        found.append(NoticeWindow("time-limit signal (USR2 before the limit)", signal_delay_s))
    if grace_time_s is not None:
        found.append(NoticeWindow("partition GraceTime at preemption", grace_time_s))
    if spot:
        seconds = SPOT_NOTICE_S - SPOT_POLL_S
        found.append(NoticeWindow("EC2 spot notice, less the watcher's poll", seconds))
    return found


def notice_save_needed_s(save_s: float, update_s: float = 0.0, margin: Margin = Margin()) -> float:
    return margin.factor * save_s + margin.fixed_s + update_s


def window_check(
    save_s: float,
    applicable: Sequence[NoticeWindow],
    update_s: float = 0.0,
    margin: Margin = Margin(),
) -> list[WindowFit]:
    """One verdict per window: does a notice-save of ``save_s`` seconds (plus the margin) fit?"""
    if save_s < 0 or update_s < 0:
        raise ValueError("save and update seconds must be >= 0")
    needed = notice_save_needed_s(save_s, update_s, margin)
    return [WindowFit(w, needed) for w in applicable]


def warnings(verdicts: Sequence[WindowFit]) -> list[str]:
    """The lines to print at submit: one per window the save does not fit."""
    return [f"warning: {v.line()}" for v in verdicts if not v.fits]


def submit_warnings(
    preset: str,
    gpu: bool,
    signal_delay_s: float,
    grace_time_s: float | None = None,
    spot: bool = False,
    throughput_mbs: float = DEFAULT_THROUGHPUT_MBS,
    vocab: int = DEFAULT_VOCAB,
) -> list[str]:
    """What ``submit`` prints: the preset's estimated notice-save against the job's windows."""
    nbytes = preset_checkpoint_bytes(preset, vocab, gpu)
    verdicts = window_check(
        save_seconds(nbytes, throughput_mbs), windows(signal_delay_s, grace_time_s, spot)
    )
    return warnings(verdicts)


# what a save dir holds at its fullest, in checkpoints besides the kept interval ones
# (checkpoint_last.pt is a hard link of the newest: no more bytes): the save on notice (a
# checkpoint_last.pt of its own), one save in flight (written before fairseq deletes the oldest)
# and checkpoint_best.pt (a link to the best save, which can be older than every kept one)
SAVE_DIR_EXTRA = ("the save on notice", "one in flight", "checkpoint_best.pt")


def save_dir_bytes(checkpoint_bytes: int, kept: int) -> int:
    """The bytes a run's save dir holds at its fullest (``SAVE_DIR_EXTRA``)."""
    return (kept + len(SAVE_DIR_EXTRA)) * checkpoint_bytes


def space_warning(
    room: space.Space, checkpoint_bytes: int, kept: int, aside: Sequence[Path] = ()
) -> str | None:
    """What ``submit`` says when the save dir's file system cannot hold what the run keeps
    (``save_dir_bytes``) or has too few inodes; None when it can."""
    found = space.short(room, save_dir_bytes(checkpoint_bytes, kept), aside)
    if found is None:
        return None
    count = f"{kept} kept + {' + '.join(SAVE_DIR_EXTRA)}"
    return (
        f"warning: the save dir's file system cannot hold this run's checkpoints: {found} "
        f"({count}, x {space.size(checkpoint_bytes)} each)"
    )


def notice_wait_s(
    preset: str,
    gpu: bool,
    ceiling_s: float,
    floor_s: float = 25.0,
    measured_s: float | None = None,
) -> float:
    """How long the launcher waits for the save on notice before requeueing anyway: the
    need (``notice_save_needed_s``) of the run's own measured save (``measured_save_s``) once
    there is one, else of the preset's checkpoint at the default Lustre throughput; at least
    ``floor_s``, at most ``ceiling_s`` (the longest window: after it Slurm ends the step
    whatever the launcher waits for)."""
    save_s = estimated_save_s(preset, gpu) if measured_s is None else measured_s
    return min(ceiling_s, max(floor_s, notice_save_needed_s(save_s)))


RECENT_SAVES = 5


def measured_save_s(events: Sequence[Event]) -> float | None:
    """What a save to durable took in this run: the slowest of its last ``RECENT_SAVES``
    checkpoint events (the ledger's), snapshot + background write for an async save (a save on
    notice waits for both), the stall for a synchronous one; None before the first save."""
    saves = [e for e in events if e.kind == Kind.CHECKPOINT and e.get("seconds") is not None]
    durations = [
        e.get("snapshot_s") + e.get("write_s") if e.get("write_s") is not None else e.get("seconds")
        for e in saves[-RECENT_SAVES:]
    ]
    return max(durations) if durations else None


def estimated_save_s(preset: str, gpu: bool) -> float:
    """The preset's checkpoint_last.pt written at the default Lustre throughput."""
    return save_seconds(preset_checkpoint_bytes(preset, gpu=gpu), DEFAULT_THROUGHPUT_MBS)
