"""The transformers group (tests/run_all.sh builds its venv: tests/hf/setup_venv_hf.sh).

hpcdp runs from the test's own Python (.venv); the transformers side runs in
``HPCDP_HF_PYTHON`` (default .venv-hf/bin/python) through tests/hf/oracle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # interop_jobs: the GPT job helpers


@pytest.fixture(scope="session")
def oracle():
    # absolute (the calls run in each test's folder), not resolved (a venv's python is a symlink)
    python = os.path.abspath(os.environ.get("HPCDP_HF_PYTHON", str(ROOT / ".venv-hf" / "bin" / "python")))
    if not Path(python).exists():
        pytest.skip(f"no transformers venv at {python}: run bash tests/hf/setup_venv_hf.sh "
                    "(tests/run_all.sh does)")

    def call(command: str, spec, cwd):
        path = Path(cwd) / f"oracle-{command}.json"
        path.write_text(json.dumps(spec))
        proc = subprocess.run([python, str(ROOT / "tests" / "hf" / "oracle.py"), command, str(path)],
                              cwd=cwd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                   "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    return call
