"""A host-memory image of what this rank writes: its pieces cut per logical tensor.

The strategy hands flat-buffer pieces (:mod:`hpcdp.io.protocol`); here they are cut
at parameter boundaries into pieces of logical tensors (``param/<name>``,
``optim/m/<name>``...) and brought to host memory. A synchronous save may use views
of the live host buffers (it writes before training goes on); an asynchronous save
copies them (``copy=True``): that copy is the whole training stall of an
asynchronous save.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..format.names import tensor_name
from ..protocol import to_host
from ..format.ranges import split_by_layout


@dataclass
class TensorPiece:
    tensor: str          # logical tensor, e.g. "optim/m/h.0.mlp.c_fc.weight"
    offset: int          # element offset within the flattened tensor
    data: np.ndarray     # 1-D host array

    @property
    def size(self) -> int:
        return int(self.data.shape[0])


@dataclass
class Snapshot:
    pieces: list = field(default_factory=list)    # TensorPiece, in a fixed order
    scalars: dict = field(default_factory=dict)   # this rank's numbers (file attributes)

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self.pieces)


def take_snapshot(pieces, layout, backend=None, *, copy: bool, scalars=None) -> Snapshot:
    """Cut ``pieces`` (protocol Pieces) at the ``layout``'s parameter boundaries.

    Order is deterministic (buffer, then flat offset), so the same state gives the
    same file. ``copy=False`` keeps views of host buffers (device buffers are always
    copied to host).
    """
    out = []
    for piece in sorted(pieces, key=lambda p: (p.buffer, p.offset)):
        host = to_host(piece.array, backend)
        if copy and host is piece.array:
            host = np.array(host, copy=True)
        for param, span, pos in split_by_layout(layout, piece.offset, piece.size):
            out.append(TensorPiece(tensor_name(piece.buffer, param), span.offset,
                                   host[pos:pos + span.size]))
    return Snapshot(out, dict(scalars or {}))


__all__ = ["TensorPiece", "Snapshot", "take_snapshot"]
