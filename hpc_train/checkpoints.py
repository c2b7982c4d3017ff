"""Checkpoint files in the save dir: loading under torch's weights_only default.

Trust decision: a fairseq checkpoint is a pickle. Since torch 2.6, ``torch.load`` only unpickles
tensors and allow-listed globals. Rather than switching that off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), hpc-train allow-lists exactly the classes fairseq's
checkpoints and its rank-to-rank state broadcast contain (argparse / omegaconf config objects).
A checkpoint that needs anything else is refused. The save dir is still trusted not to hold a
crafted file that abuses those classes; keep it writable only by the training user.
"""

from __future__ import annotations

import argparse
import collections
import typing
from pathlib import Path
from typing import Any


def allowed_globals() -> list[Any]:
    """The globals fairseq 0.12 checkpoints need (measured with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``)."""
    from omegaconf import base, dictconfig, listconfig, nodes

    return [
        argparse.Namespace,  # the legacy args stored in every fairseq checkpoint
        dictconfig.DictConfig,  # cfg, when rank 0 broadcasts the loaded state to other ranks
        listconfig.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        typing.Any,
        collections.defaultdict,
        dict,
        list,
        int,
    ]


def allow_fairseq_globals() -> None:
    """Allow-list those globals for every ``torch.load`` in this process (fairseq's included)."""
    import torch

    torch.serialization.add_safe_globals(allowed_globals())


def load(path: Path | str) -> dict[str, Any]:
    """Load a fairseq checkpoint on the CPU with weights_only=True and the allow-list."""
    import torch

    with torch.serialization.safe_globals(allowed_globals()):
        return torch.load(Path(path), map_location="cpu", weights_only=True)


def num_updates(state: dict[str, Any]) -> int:
    """The update counter a checkpoint was saved at."""
    return int(state["optimizer_history"][-1]["num_updates"])
