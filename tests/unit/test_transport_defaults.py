"""The CLI turns UCX's own detection of a silent peer off before MPI starts (hpcdp's
deadline finds a lost peer; MPICH crashed sending to a connection UCX had declared
failed: hpcdp.failure.transport). A user's own setting wins."""

import os
import subprocess
import sys
from pathlib import Path

from hpcdp.failure.transport import TRANSPORT_DEFAULTS, leave_peer_loss_to_hpcdp

ROOT = Path(__file__).resolve().parents[2]


def test_unset_keepalives_are_turned_off_and_a_users_setting_wins():
    env = {"UCX_KEEPALIVE_INTERVAL": "5s"}
    assert leave_peer_loss_to_hpcdp(env) == ["UCX_TCP_KEEPIDLE"]
    assert env == {"UCX_KEEPALIVE_INTERVAL": "5s", "UCX_TCP_KEEPIDLE": "inf"}
    assert set(TRANSPORT_DEFAULTS) == {"UCX_TCP_KEEPIDLE", "UCX_KEEPALIVE_INTERVAL"}


def test_the_cli_sets_them_before_mpi_starts():
    code = ("import os, sys; from hpcdp.cli import _main; _main(['--version']); "
            "print('mpi4py.MPI' in sys.modules, os.environ['UCX_TCP_KEEPIDLE'], "
            "os.environ['UCX_KEEPALIVE_INTERVAL'])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[-3:] == ["False", "inf", "inf"], out
