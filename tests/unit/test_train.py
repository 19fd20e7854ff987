"""train.py end to end: the command in a subprocess, and the loop's arithmetic in process."""

import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from hpcdp.config_error import ConfigError
from hpcdp.config import load_config
from hpcdp.nn import build_model
from hpcdp.train import run_training

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


def _cli(args, cwd, timeout=180):
    return subprocess.run([sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def test_hpcdp_train_digits_writes_run_dir_config_and_metrics(tmp_path):
    proc = _cli(["train", "--config", str(ROOT / "jobs/digits_mlp.toml"), "--set", "train.steps=12",
                 "--set", "run.log_every=5", "--set", "run.eval_every=6", "--set", "run.name=t1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("t1-")
    run = run_dirs[0]
    cfg = tomllib.loads((run / "config.toml").read_text())
    assert cfg["train"]["steps"] == 12 and cfg["train"]["epochs"] == 0
    assert cfg["run"]["out_dir"] == str(Path("runs") / run.name)
    assert cfg["optim"]["nesterov"] is True  # from the job file
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x]
    evals = [x["eval"] for x in lines if "eval" in x]
    assert [x["step"] for x in steps] == list(range(1, 13))
    for rec in steps:
        assert {"loss", "lr", "samples_per_s", "step_time_s", "global_batch", "ranks"} <= set(rec)
        assert rec["global_batch"] == 64 and rec["ranks"]["samples"] == [64]
        assert np.isfinite(rec["loss"]) and rec["samples_per_s"] > 0
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert [e["step"] for e in evals] == [6, 12]
    assert evals[-1]["n"] == 359 and 0.0 <= evals[-1]["accuracy"] <= 1.0
    # log: steps 1, 5, 10, 12 and the evals, on stdout
    logged = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("step ")]
    assert logged == ["1/12", "5/12", "10/12", "12/12"]
    assert sum(ln.startswith("eval @ step") for ln in proc.stdout.splitlines()) == 2


@pytest.mark.parametrize("args, message", [
    (["--set", "optim.kind=adam"], "optim.kind: 'adam' is not allowed; choose one of 'sgd', 'adamw'"),
    (["--set", "optim.speed=1"], "optim.speed: unknown key"),
    (["--set", "model.sizes=[63, 10]"], "model.sizes: the first size must be the number of input features"),
    (["--set", "data.kind=npz", "--set", "data.path=missing.npz"], "data.path: file not found: 'missing.npz'"),
    (["--config", "nope.toml"], "--config 'nope.toml': no such file"),
    (["--set", "parallel.strategy=warp"], "parallel.strategy: 'warp' is not available; choose one of 'none'"),
])
def test_cli_bad_input_is_one_line_exit_2_no_traceback(tmp_path, args, message):
    proc = _cli(["train", *args], tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"hpcdp: error: {proc.stderr.strip()[len('hpcdp: error: '):]}"
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_strategy_none_under_mpiexec_fails_clearly_on_every_rank(tmp_path):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH")
    proc = subprocess.run(["timeout", "120", mpiexec, "-n", "2", sys.executable, "-m", "hpcdp.cli", "train",
                           "--set", "parallel.strategy=none"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert errors == [errors[0]] and "multi-rank training (2 ranks) needs a strategy" in errors[0]  # rank 0 only
    assert "Traceback" not in proc.stderr


# -- the loop's arithmetic, in process (float64, tiny MLP) -------------------------------

def _cfg(*sets):
    return load_config(None, ["run.dtype=float64", "model.sizes=[64, 16, 10]", "train.steps=3",
                              "train.global_batch=24", "run.eval_every=0", "run.log_every=100", *sets])


def _train(tmp_path, name, *sets):
    cfg = _cfg(f'run.out_dir="{tmp_path / name}"', *sets)
    model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu")
    summary = run_training(cfg, model=model, out=io.StringIO())
    return model.flat.data.copy(), summary


def test_grad_accumulation_gives_the_same_update(tmp_path):
    base, s1 = _train(tmp_path, "a1", "train.grad_accum=1")
    acc, s3 = _train(tmp_path, "a3", "train.grad_accum=5")  # 24 samples -> 5,5,5,5,4
    np.testing.assert_allclose(acc, base, rtol=1e-11, atol=1e-13)
    assert s3["loss"] == pytest.approx(s1["loss"], rel=1e-11)


def test_short_last_batch_keep_weights_by_the_actual_global_count(tmp_path):
    # 1438 digits samples, batch 1000: keep -> a step of 1000 then one of 438
    params, _ = _train(tmp_path, "k", "train.global_batch=1000", "train.last_batch=keep", "train.steps=2",
                       "optim.momentum=0.0")
    cfg = _cfg("train.global_batch=1000", "optim.momentum=0.0")
    from hpcdp.autograd import Tensor
    from hpcdp.data import load_dataset
    from hpcdp.data.sampler import GlobalSampler

    ds = load_dataset(cfg.data, "classification", "float64")
    model = build_model(cfg.model, dtype="float64", device="cpu")
    sampler = GlobalSampler(ds.n_train, 1000, cfg.data.seed, "keep")
    for step in range(2):
        idx = sampler.global_indices(step)
        model.flat.zero_grad()
        model.loss(Tensor(ds.x_train[idx]), Tensor(ds.y_train[idx])).backward()
        model.flat.data -= cfg.optim.lr * model.flat.grad
    assert len(sampler.global_indices(1)) == 438
    np.testing.assert_allclose(params, model.flat.data, rtol=1e-11, atol=1e-13)


def test_metrics_record_the_short_batch(tmp_path):
    _train(tmp_path, "m", "train.global_batch=1000", "train.last_batch=keep", "train.steps=3")
    lines = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [x["global_batch"] for x in lines if "step" in x] == [1000, 438, 1000]


def test_existing_run_dir_is_not_overwritten(tmp_path):
    _train(tmp_path, "same")
    with pytest.raises(ConfigError, match="already holds a run"):
        _train(tmp_path, "same")


def test_gpt_on_markov_sequences_reports_the_loss_floor(tmp_path):
    out = io.StringIO()
    cfg = load_config(ROOT / "jobs/gpt_small.toml", [
        "train.steps=2", "data.n_samples=64", "model.n_embd=16", "model.n_layer=1", "train.global_batch=8",
        f'run.out_dir="{tmp_path / "g"}"', "run.eval_every=0"])
    summary = run_training(cfg, out=out)
    assert summary["eval"]["loss_floor"] == pytest.approx(1.6671, abs=1e-3)
    assert "loss floor (exact conditional entropy) 1.667" in out.getvalue()
    assert "(loss floor 1.6671, uniform guess 2.7726: " in out.getvalue()  # ln 16: 16 tokens
    assert "a uniform guess 2.7726" in out.getvalue()
    loss, floor, uniform = summary["eval"]["loss"], summary["eval"]["loss_floor"], np.log(16)
    assert f"{100 * (uniform - loss) / (uniform - floor):.0f}% of the way from the uniform guess" in out.getvalue()
    ev = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines() if "eval" in x]
    assert ev[0]["eval"]["n"] == 8 * 32  # 8 test sequences x 32 tokens


def test_model_that_does_not_fit_the_data_names_the_key():
    with pytest.raises(ConfigError, match=r"model\.block_size: .* needs >= 32, found 16"):
        run_training(load_config(ROOT / "jobs/gpt_small.toml", ["model.block_size=16", "data.n_samples=16"]))


def test_the_memory_line_says_which_ranks_it_lists():
    from hpcdp.train import memory_line

    ranks = {k: [2**20, 2 * 2**20] for k in ("mem_persistent_bytes", "mem_params_bytes", "mem_grads_bytes",
                                              "mem_optim_bytes", "mem_peak_bytes", "rss_peak_bytes")}
    assert "(MiB per rank): model state [1.0, 2.0]" in memory_line(1, ranks)
    line = memory_line(1, ranks, servers=2)
    assert "(MiB per worker rank; the 2 server rank(s) are not listed): model state [1.0, 2.0]" in line
