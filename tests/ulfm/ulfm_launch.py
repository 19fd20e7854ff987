"""One short training job of the ULFM group under the ULFM venv's Open MPI `mpirun`
(`--with-ft ulfm` when ``ft``): the shared launcher of test_ulfm_exact.py and
test_ulfm_checkpoint.py. Skips (with the reason) when the venv is missing. Also
:func:`left_running`: the processes of a job still running after it ended."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root


def run_job(tmp_path, name, ranks, sets, *extra, ft, steps=12, **env):
    """Run ``hpcdp train`` with ``sets`` on ``ranks`` ranks into ``tmp_path/name``; assert
    it succeeded and logged one eval at ``steps``; return (that eval's weights sha256,
    the metrics records, the output, the run folder)."""
    mpirun = VENV / "bin" / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    out = tmp_path / name
    argv = [str(mpirun), *(["--with-ft", "ulfm"] if ft else []), "--oversubscribe", "-n", str(ranks),
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train", *extra]
    for s in sets + [f'run.out_dir="{out}"']:
        argv += ["--set", s]
    full = {**{k: v for k, v in os.environ.items() if k not in ("HPCDP_FAULT", "HPCDP_CKPT_FAILPOINT")},
            "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env}
    proc = subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    final = [r["eval"]["weights_sha256"] for r in recs if "eval" in r and r["eval"]["step"] == steps]
    assert len(final) == 1, text[-3000:]
    return final[0], recs, text, out


def left_running(marker: str, within: float = 0.0) -> list[str]:
    """Command lines of processes still running with ``marker`` (the run folder) in them,
    polled for up to ``within`` seconds until there are none."""
    deadline = time.monotonic() + within
    while True:
        out = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if marker in cmd:
                    out.append(f"{p.name}: {cmd}")
        if not out or time.monotonic() >= deadline:
            return out
        time.sleep(0.1)
