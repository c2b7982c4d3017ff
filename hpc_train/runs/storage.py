"""A run's save dir as storage, for people (``status``, ``doctor``): the room on its file system
now (``hpc_core.space``), the size of one checkpoint (the ledger's last ``checkpoint`` event, else
``checkpoint_last.pt``'s), the last checkpoint verified (the ledger's ``verified``: what a start
resumed from, every record's CRC32 and its recorded digest checked as the rank loaded it) and
every checkpoint set aside (the ledger's ``set_aside``: the file kept beside the others, never
deleted, with why). Pure but for ``measure`` (one ``statvfs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_core import space
from hpc_core.ledger import Event, Kind
from hpc_core.rundir import RunDir
from hpc_train.faults import failures

# the room a running job needs at any moment: the next save in flight and a save on notice
NEXT_SAVES = 2


@dataclass(frozen=True)
class SaveDir:
    room: space.Space | None  # None: not measured, or its file system could not be asked
    checkpoint_bytes: int | None
    verified: Event | None
    set_aside: tuple[Event, ...] = ()

    def room_line(self) -> str:
        room = "room unknown" if self.room is None else self.room.describe()
        size = (
            ""
            if self.checkpoint_bytes is None
            else f"; a checkpoint {space.size(self.checkpoint_bytes)}"
        )
        return f"storage: {room}{size}"

    def verified_line(self) -> str:
        found = self.verified
        if found is None:
            return (
                "last verified checkpoint: none yet (each start verifies the one it resumes from)"
            )
        digest = found.get("sha256")
        how = f"sha256 {digest[:12]}..." if digest else "CRCs only: no digest recorded"
        return (f"last verified checkpoint: {found.get('file')} at update {found.get('update')} "
                f"({how}; {found.get('verify_s')} s beside a {found.get('load_s')} s load, "
                f"start {found.job}-{found.restart})")  # fmt: skip

    def lines(self) -> list[str]:
        aside = [f"set aside: {e.get('file')} ({e.get('why')}) as {e.get('moved_to')}"
                 for e in self.set_aside]  # fmt: skip
        return [self.room_line(), self.verified_line(), *aside]

    def short(self) -> str | None:
        """What is short for the next save and a save on notice (``NEXT_SAVES``); None: room."""
        if self.room is None or self.checkpoint_bytes is None:
            return None
        return space.short(self.room, NEXT_SAVES * self.checkpoint_bytes)

    def as_json(self) -> dict[str, Any]:
        room = self.room
        return {
            "free_bytes": None if room is None else room.free_bytes,
            "free_inodes": None if room is None else room.free_inodes,
            "checkpoint_bytes": self.checkpoint_bytes,
            "verified": None if self.verified is None else dict(self.verified.data),
            "set_aside": [dict(e.data) for e in self.set_aside],
        }


def measure(run: RunDir) -> space.Space | None:
    """The room on the save dir's file system now; None when it cannot be asked."""
    try:
        return space.of(run.root)
    except OSError:
        return None


def of(run: RunDir, events: Sequence[Event], room: space.Space | None) -> SaveDir:
    """The save dir's storage from the run's ledger ``events`` and its ``room``."""
    nbytes = failures.checkpoint_bytes(events, run.checkpoint_last)
    verified = [e for e in events if e.kind == Kind.VERIFIED]
    aside = tuple(e for e in events if e.kind == Kind.SET_ASIDE)
    return SaveDir(room, nbytes, verified[-1] if verified else None, aside)
