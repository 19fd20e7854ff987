"""failure.on_rank_loss = "continue" with train.reproducible = "exact" and the same global
batch: after a repair the weights are bit-identical to a run launched on the survivors'
rank count from the checkpoint of the agreed step.

Three jobs of the same 12-step MLP run (exact mode, Open MPI 5 of the ULFM venv):
A on 3 ranks under `--with-ft ulfm`, rank 2 SIGKILLed in step 5 (HPCDP_FAULT), the
survivors repair and finish; B on 3 ranks with a checkpoint after every step, nothing
killed; C on 2 ranks resumed from B's checkpoint of A's agreed step. A's final weights
hash (the eval record's sha256) equals C's, and B's (exact mode: any rank count)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root
SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", "train.steps=12",
        'train.reproducible="exact"', "train.exact_micro_batch=5", "run.log_every=1", "run.eval_every=0",
        "parallel.strategy=ddp", "comm.timeout=30", "optim.kind=adamw", "optim.lr=0.01"]


def _job(tmp_path, name, ranks, sets, *extra, ft=False, **env):
    mpirun = VENV / "bin" / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    out = tmp_path / name
    argv = [str(mpirun), *(["--with-ft", "ulfm"] if ft else []), "--oversubscribe", "-n", str(ranks),
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train", *extra]
    for s in SETS + sets + [f'run.out_dir="{out}"']:
        argv += ["--set", s]
    full = {**{k: v for k, v in os.environ.items() if k != "HPCDP_FAULT"}, "PYTHONPATH": str(ROOT),
            "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env}
    proc = subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    final = [r["eval"]["weights_sha256"] for r in recs if "eval" in r and r["eval"]["step"] == 12]
    assert len(final) == 1, text[-3000:]
    return final[0], recs, text


def test_exact_weights_after_a_repair_equal_a_smaller_run_resumed_from_that_step(tmp_path):
    a, recs, text = _job(tmp_path, "a", 3, ['failure.on_rank_loss="continue"'], ft=True, HPCDP_FAULT="2:5:kill")
    repairs = [r["repair"] for r in recs if "repair" in r]
    assert len(repairs) == 1 and repairs[0]["world_after"] == 2, text[-6000:]
    at = repairs[0]["committed_step"]
    assert at in (4, 5), repairs
    b, _, _ = _job(tmp_path, "b", 3, ["checkpoint.every=1"])
    ckpt = tmp_path / "b" / "checkpoints"
    (path,) = [p for p in ckpt.iterdir() if p.name.startswith("step-") and int(p.name[5:]) == at]
    c, recs_c, text_c = _job(tmp_path, "c", 2, [], "--resume", str(path))
    assert min(r["step"] for r in recs_c if "loss" in r) == at + 1, text_c[-3000:]
    assert a == c, f"after the repair at step {at}: {a} (3 -> 2 ranks) != {c} (2 ranks from the checkpoint)"
    assert a == b  # exact mode: the same weights for any rank count
