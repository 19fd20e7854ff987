"""The one error type of hpcdp.io (no h5py import, so callers can catch it cheaply),
and how it reaches every rank (:data:`AGREEMENT`)."""

from __future__ import annotations

from contextlib import contextmanager

from hpcdp.failure.agreement import Agreement

EARLIER = "use an earlier checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or must not be loaded. The message names
    the checkpoint, the file and the tensor, and what to do. A ValueError, so the
    ``hpcdp`` command prints it as one error line (exit status 2)."""


# Every phase of a save or restore ends with this agreement (hpcdp.failure.agreement):
# if any rank failed, every rank raises the same CheckpointError, the lowest failing
# rank's message "... (reported by rank r)", agreed on the checkpoint's own
# communicator (a background save's agreements run in its thread, polling gently).
AGREEMENT = Agreement(CheckpointError, lowest=True, private=False)


@contextmanager
def damaged_file(where: str):
    """Reading HDF5 structures inside: any error h5py raises for damaged metadata
    (HDF5's own checksums, a broken B-tree or heap: ``OSError``, ``KeyError``,
    ``RuntimeError``, ``ValueError``, ``TypeError``, ``IndexError``...) becomes one
    :class:`CheckpointError` that names ``where`` (checkpoint, file, object) and says
    what to do, the same kind of line as a SHA-256 mismatch of the data."""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError,
            OverflowError, MemoryError) as e:
        text = str(e).strip("'\"") or type(e).__name__
        raise CheckpointError(f"{where}: HDF5 metadata is damaged ({text}): the file is corrupt; "
                              f"{EARLIER}") from None


__all__ = ["CheckpointError", "damaged_file", "EARLIER", "AGREEMENT"]
