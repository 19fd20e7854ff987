"""``hpcdp check-exact``: the verdict table, and real mpiexec jobs that agree (exact
mode) or do not (fast mode), with the exit status saying which; across a checkpoint
restart on another rank count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.commands.check_exact import format_table, parse_ranks, strategy_sets

A, B = "a" * 64, "b" * 64


def test_table_marks_the_differing_hash_and_job():
    rows = [{"label": "ddp x1", "hashes": [(5, A), (10, A)]},
            {"label": "ddp x2", "hashes": [(5, A), (10, B)]},
            {"label": "ddp x2->x3 @5", "hashes": [(10, A)]}]  # a resumed job: later evals only
    table, ok = format_table(rows)
    assert not ok
    lines = table.splitlines()
    assert lines[1].endswith("yes") and lines[3].endswith("yes")
    assert lines[2].endswith("NO") and f"{B[:16]}*" in lines[2]
    assert format_table([rows[0], rows[2]])[1]
    # a job that never reached the last eval is not "the same"
    assert not format_table([rows[0], {"label": "short", "hashes": [(5, A)]}])[1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="--ranks '1,x'"):
        parse_ranks("1,x")
    with pytest.raises(ValueError, match="'zero4' is not a strategy check-exact knows"):
        strategy_sets("zero4")
    assert parse_ranks("3,1,3") == [3, 1]


CONFIG = """
[run]
seed = 1
log_every = 100
eval_every = 2
[model]
kind = "gpt"
vocab_size = 8
block_size = 8
n_layer = 1
n_head = 2
n_embd = 8
dropout = 0.2
[data]
kind = "synthetic_sequence"
vocab_size = 8
seq_len = 8
n_samples = 200
[train]
steps = 4
epochs = 0
global_batch = 8
exact_micro_batch = 2
[optim]
kind = "adamw"
lr = 0.01
"""


def _check(tmp_path, *extra):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "hpcdp.cli", "check-exact", "--config", str(cfg),
                           "--ranks", "1,2", "--strategies", "ddp", "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)


def test_exact_jobs_agree_and_fast_jobs_do_not(tmp_path):
    proc = _check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exact: all 2 jobs agree" in proc.stdout
    # a second check into the same --out does not delete the first one's results silently
    first = (tmp_path / "out" / "ddp-n2" / "metrics.jsonl").read_text()
    proc = _check(tmp_path, "--set", 'train.reproducible="fast"')
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"hpcdp: error: --out {tmp_path / 'out'}: it holds an earlier check's results "
                                   "(ddp-n1, ddp-n2); choose another --out (or none: a new folder), or add "
                                   "--replace to delete them")
    assert (tmp_path / "out" / "ddp-n2" / "metrics.jsonl").read_text() == first
    # the same matrix in fast mode: float sums in another order on 2 ranks (--replace: said, then done)
    proc = _check(tmp_path, "--set", 'train.reproducible="fast"', "--replace")
    assert f"--replace: deleting {tmp_path / 'out' / 'ddp-n1'}" in proc.stdout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT exact" in proc.stdout and proc.stdout.count("NO") >= 1


def test_restart_on_another_rank_count(tmp_path):
    """2 ranks save after step 3; 3 ranks resume and finish: the same hashes as the
    uninterrupted 1- and 2-rank runs, under ddp and ZeRO-3 (sharded parameters)."""
    proc = _check(tmp_path, "--steps", "6", "--restart-at", "3", "--restart-ranks", "3",
                  "--strategies", "ddp,zero3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("ddp", "zero3"):
        assert (tmp_path / "out" / f"{name}-n2-checkpoints" / "step-00000003").is_dir()
        rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(f"{name} x")]
        assert [r[1] for r in rows] == ["x1", "x2", "x2->x3"] and all(r[-1] == "yes" for r in rows)
        # evals every 2 steps: the resumed job (from step 3) has no step-2 hash, and its
        # step-4 and step-6 hashes are the uninterrupted runs'
        assert rows[2][3:6] == ["-", rows[0][3], rows[0][4]] and rows[0][2:5] == rows[1][2:5]
    assert proc.stdout.count("--resume") == 2  # the two x3 jobs really resumed
    assert "exact: all 6 jobs agree" in proc.stdout


def test_an_unset_micro_batch_is_chosen_for_every_rank_count(tmp_path):
    """The README's form (no train.exact_micro_batch): check-exact picks one that 1, 2
    and 4 ranks all hold (global batch 8: micro-batches of 2), says so, and agrees."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace("exact_micro_batch = 2\n", ""))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "check-exact", "--config", str(cfg),
                           "--ranks", "1,2,4", "--steps", "2"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "train.exact_micro_batch unset: 2 samples per micro-batch" in proc.stdout
    assert "exact: all 3 jobs agree" in proc.stdout
    # without --out: a folder of this check's own, next to any earlier one
    (folder,) = (tmp_path / "runs").glob("check-exact-*")
    assert f"jobs in {folder.relative_to(tmp_path)}" in proc.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["ddp-n1", "ddp-n2", "ddp-n4"]


def test_restart_arguments(tmp_path):
    proc = _check(tmp_path, "--restart-at", "3")
    assert proc.returncode == 2 and "--restart-at and --restart-ranks go together" in proc.stderr
    proc = _check(tmp_path, "--restart-at", "4", "--restart-ranks", "3")  # train.steps = 4
    assert proc.returncode == 2 and "save before the last step (train.steps = 4)" in proc.stderr
