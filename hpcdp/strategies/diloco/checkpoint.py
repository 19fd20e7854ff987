"""DiLoCo's checkpoints: the outer state and every replica's, in global coordinates.

Buffers (each laid out like the model's flat parameters, docs/checkpoints.md):

- ``param``: the OUTER parameters ``theta`` (the model the run produces; what
  ``hpcdp sample``, ``ckpt export`` and a DDP / ZeRO restore read);
- ``optim/<state>``: replica group 0's inner optimizer state (so a DDP or ZeRO run
  continues from the checkpoint as from one of its own);
- ``diloco/outer/momentum_buf``: the outer SGD's momentum (when outer_momentum > 0);
- ``diloco/replica/<g>/param`` for every group ``g`` (the replicas differ between
  syncs: in streaming mode always, in plain mode with mixing > 0) and
  ``diloco/replica/<g>/optim/<state>`` for ``g >= 1``.

Who writes what: the inner strategy's pieces of a group (DDP: rank ``l`` of ``L``
writes ``shard_range(numel, L, l)``; ZeRO: its owned ranges), renamed to the group's
buffers; ``theta`` and the momentum are held in chunks that every group holds alike,
so group ``g`` writes ``shard_range`` ``g`` of ``M`` of each chunk. Every buffer is
tiled once.

Saves happen with no exchange in flight: at an outer boundary (a multiple of
``sync_every``) there is none; a save elsewhere (a signal) first completes the one in
flight and applies it then (``checkpoint_begin``), which the uninterrupted run would
have done up to ``overlap`` steps later: resumes from outer boundaries are bit-identical,
others are not.

Restore on another group count or rank count: ``theta``, the momentum and the step
carry over unchanged; new group ``g`` takes the replica and inner optimizer state of
saved group ``g mod M_saved`` (with fewer groups the extra replicas' work since
their last sync is dropped, with more some replicas start as copies; the log says
which). A checkpoint of another strategy (DDP, ZeRO) starts every group from its
``param`` and ``optim/*`` with zero outer momentum.
"""

from __future__ import annotations

from hpcdp.io.protocol import Piece, optimizer_buffers, optimizer_scalars, replica_part

OUTER_MOMENTUM = "diloco/outer/momentum_buf"


def replica_buffer(group: int, buffer: str) -> str:
    """Where group ``group``'s copy of ``buffer`` ("param" or "optim/<state>") is stored."""
    if buffer.startswith("optim/") and group == 0:
        return buffer
    return f"diloco/replica/{group}/{buffer}"


class DiLoCoCheckpoint:
    """The protocol of hpcdp.io.protocol for :class:`DiLoCo` (mixed in before Strategy)."""

    _saved: dict | None = None

    # -- what this run writes ---------------------------------------------------------
    def checkpoint_buffers(self) -> list[str]:
        """Buffers besides ``param`` and ``optim/*`` (hpcdp.io's expected tensors)."""
        names = [n.removeprefix("optim/") for n in optimizer_buffers(self.optimizer)]
        out = [replica_buffer(g, "param") for g in range(self.M)]
        out += [replica_buffer(g, f"optim/{n}") for g in range(1, self.M) for n in names]
        if self.cfg.outer_momentum:
            out.append(OUTER_MOMENTUM)
        return out

    def checkpoint_begin(self, step: int, wait: bool) -> None:
        if self.pending is not None:  # a save between a send and its landing (a signal)
            self._land()

    def _outer_pieces(self) -> list[Piece]:
        out = [Piece("param", c.offset, c.theta) for c in self.chunks]
        if self.cfg.outer_momentum:
            for c in self.chunks:
                out.append(Piece(OUTER_MOMENTUM, c.offset, optimizer_buffers(c.opt, c.size)["optim/momentum_buf"]))
        return [p for p in out if p.size]

    def checkpoint_pieces(self) -> list[Piece]:
        mine = [Piece(replica_buffer(self.g, p.buffer), p.offset, p.array)
                for p in self.inner.checkpoint_pieces()]
        return mine + replica_part(self._outer_pieces(), self.g, self.M)

    def checkpoint_scalars(self) -> dict:
        return {**optimizer_scalars(self.optimizer), "diloco_groups": self.M, "diloco_group": self.g,
                "diloco_steps": self.t}

    # -- restore ----------------------------------------------------------------------
    def checkpoint_saved(self, info: dict) -> None:
        """What the checkpoint holds (hpcdp.io.checkpointer, before the targets are
        asked for): its buffer names, step and per-rank scalars."""
        self._saved = info

    def _source_group(self) -> int | None:
        """The saved group whose replica this group restores (None: not a DiLoCo checkpoint)."""
        info = self._saved or {}
        groups = info.get("arrays", {}).get("rank_diloco_groups")
        if not groups or "diloco/replica/0/param" not in set(info.get("buffers", ())):
            return None
        return self.g % int(max(groups))

    def checkpoint_targets(self) -> list[Piece]:
        src = self._source_group()
        inner = self.inner.checkpoint_targets()
        if src is not None:
            inner = [Piece(replica_buffer(src, p.buffer), p.offset, p.array) for p in inner]
        out = inner + [Piece("param", c.offset, c.theta) for c in self.chunks if c.size]
        have = set((self._saved or {}).get("buffers", ()))
        if self.cfg.outer_momentum:
            for c in self.chunks:
                buf = optimizer_buffers(c.opt, c.size)["optim/momentum_buf"]
                buf[...] = 0
                if OUTER_MOMENTUM in have and c.size:
                    out.append(Piece(OUTER_MOMENTUM, c.offset, buf))
        return out

    def checkpoint_restored(self) -> None:
        self.inner.checkpoint_restored()
        info = self._saved or {}
        self.t = int(info.get("step", 0))
        self._last_landed = [self.schedule.last_landing(p, self.t) for p in range(len(self.chunks))]
        self.pending = None
        self._check_groups_identical("after the restore")

    def restore_note(self) -> str:
        """One line for the log: which saved replica each group took."""
        info = self._saved or {}
        groups = info.get("arrays", {}).get("rank_diloco_groups")
        if self._source_group() is None:
            return "DiLoCo: every replica group starts from the checkpoint's parameters (not a DiLoCo checkpoint)"
        m = int(max(groups))
        if m == self.M:
            return f"DiLoCo: {m} replica group(s) restored as saved"
        return (f"DiLoCo: the checkpoint has {m} replica group(s), this run {self.M}: group g takes saved "
                f"replica g mod {m}" + (" (the other replicas' work since their last sync is dropped)"
                                        if self.M < m else ""))


__all__ = ["DiLoCoCheckpoint", "replica_buffer", "OUTER_MOMENTUM"]
