"""The one error type of hpcdp.io (no h5py import, so callers can catch it cheaply)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or must not be loaded. The message names
    the checkpoint, the file and the tensor, and what to do. A ValueError, so the
    ``hpcdp`` command prints it as one error line (exit status 2)."""


__all__ = ["CheckpointError"]
