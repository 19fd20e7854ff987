"""The in-job side of tests/cluster: pytest modules (check_*.py) run under
tests/cluster/mpiexec on the emulated cluster, one pytest per rank, with the harness of
tests/mpi (its conftest: the ranks agree on each test's outcome under a deadline) and its
helpers (test_ddp, test_zero, test_ps_support) importable as in tests/mpi."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MPI_TESTS = Path(__file__).resolve().parents[2] / "mpi"
sys.path.insert(0, str(MPI_TESTS))

_spec = importlib.util.spec_from_file_location("hpcdp_mpi_harness", MPI_TESTS / "conftest.py")
_harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness)

pytest_runtest_makereport = _harness.pytest_runtest_makereport
comm = _harness.comm
