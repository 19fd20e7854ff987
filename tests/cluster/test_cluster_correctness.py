"""Correctness across nodes of the emulated cluster: tests/cluster/jobs/check_correctness.py
(every collective and algorithm against MPI's; DDP, ZeRO 1-3, hybrid ZeRO-3 and the
parameter server against one rank; exact mode's weight hash) runs as one real mpiexec job per node layout.
Uneven layouts (2 + 1, 3 x 1) run the collectives and the strategies; the exact-mode
hashes (a one-rank reference run first) only on 2 x 2."""

from __future__ import annotations

import sys

import pytest

from conftest import HERE

UNEVEN = "not exact_mode"


@pytest.mark.parametrize("layout,select", [("2,2", ""), ("2,1", UNEVEN), ("1,1,1", UNEVEN)],
                         ids=["2x2", "2+1", "3x1"])
def test_every_check_passes_across_nodes(unlimited, layout, select):
    cluster = unlimited
    used = len(layout.split(","))
    before = cluster.link_bytes()
    argv = [sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
            "-o", "python_files=check_*.py", "--timeout=240", str(HERE / "jobs" / "check_correctness.py")]
    if select:
        argv += ["-k", select]
    job = cluster.run(layout, argv, timeout=400)
    assert not job.timed_out, "the job did not end within 400 s\n" + job.out[-6000:]
    assert job.status == 0, f"exit status {job.status}\n" + job.out[-12000:]
    assert " passed" in job.out and " failed" not in job.out, job.out[-6000:]
    # the ranks really talked over the link: every node used sent and received megabytes
    carried = [a - b for a, b in zip(cluster.link_bytes(), before)]
    assert all(c > 4 << 20 for c in carried[:used]), f"bytes over each node's link: {carried}"
