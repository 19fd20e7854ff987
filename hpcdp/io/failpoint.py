"""Named points in the save where a test can kill this rank (SIGKILL) on purpose.

``HPCDP_CKPT_FAILPOINT=<name>@<step>:<rank>`` (e.g. ``ckpt-mid-write@4:1``) kills
rank 1 at that point of the save of step 4, the way a node failure or a hard time
limit would: no handler runs, no file is closed. The tests use it to show that the
previous checkpoint still loads. Points: ``ckpt-mid-write`` (half of a rank's
pieces written; it kills the process that writes the file: under an asynchronous
save with ``checkpoint.writer = "process"`` that is the rank's writer process), ``ckpt-before-index`` (every rank file is written, rank 0 about to
write the index), ``ckpt-before-marker`` (renamed into place, marker not yet
written), ``ckpt-probe@0:0`` (the metadata walk's child process of probe.py, at its
first object). Unset (the normal case), a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "HPCDP_CKPT_FAILPOINT"


def failpoint(name: str, *, step: int, rank: int) -> None:
    spec = os.environ.get(ENV)
    if spec and spec == f"{name}@{step}:{rank}":
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["failpoint", "ENV"]
