"""``hpcdp bench step --ranks N``: its options say what to fix, the jobs are scheduled in
interleaved pairs, a step's time is the slowest rank's, and a real 2-rank run (hpcdp's
side, mpiexec) prints a row per contender and round. PyTorch's side (DDP, FSDP2 on
gloo) runs in tests/hf/test_hf_bench_step_ranks.py, where the torch venv is."""

from pathlib import Path

import pytest

from hpcdp.bench import step_ranks
from hpcdp.bench import step_time as bench

JOBS = Path(bench.__file__).resolve().parents[2] / "jobs"
TINY_JOB = """
[model]
kind = "gpt"
vocab_size = 16
block_size = 8
n_layer = 1
n_head = 2
n_embd = 16
tied_head = true
dropout = 0.0

[data]
kind = "synthetic_sequence"
vocab_size = 16
seq_len = 8
n_samples = 64

[train]
global_batch = 4
"""


@pytest.fixture
def gpt(monkeypatch):
    """bench's GPT and batch as module globals (set_gpt changes them): restored after."""
    monkeypatch.setattr(bench, "GPT", dict(bench.GPT))
    monkeypatch.setattr(bench, "GPT_BATCH", 16)


@pytest.mark.parametrize("argv, says", [
    (["--ranks", "2", "--models", "mlp"], "GPT only"),
    (["--ranks", "2", "--profile"], "drop it"),
    (["--ranks", "2", "--strategies", "ddp,zero2"], "zero2; choose from ddp, zero3"),
    (["--strategies", "ddp"], "add --ranks 2"),
    (["--rounds", "3"], "add --ranks 2"),
    (["--ranks", "3"], "does not split evenly over 3 ranks"),
    (["--ranks", "2", "--threads", "1,2"], "one thread count per rank"),
    (["--ranks", "2", "--rounds", "0"], "at least 1"),
    (["--ranks", "2", "--repeats", "1"], "--repeats >= 2"),
    (["--ranks", "2", "--torch-python", "/no/python"], "not an executable file"),
    (["--ranks", "2", "--gpt-config", str(JOBS / "digits_ddp.toml")], 'kind must be "gpt"'),
    (["--child-strategy", "ddp"], "internal to --ranks N; choose strategies with --strategies"),
])
def test_bad_rank_options_say_what_to_fix(gpt, argv, says, tmp_path):
    with pytest.raises(ValueError, match=says):
        bench.main([*argv, "--json", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_a_misspelt_strategies_option_is_refused_not_ignored(gpt, tmp_path, capsys):
    """--strategy (for --strategies) is no hidden option taken silently: argparse refuses it."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--ranks", "2", "--strategy", "zero3", "--json", str(tmp_path / "out.json")])
    assert e.value.code == 2 and "unrecognized arguments: --strategy zero3" in capsys.readouterr().err


def test_jobs_run_in_adjacent_pairs_reversed_every_other_round():
    assert step_ranks.schedule(["ddp", "zero3"], 2, True) == [
        (0, "hpcdp", "ddp"), (0, "torch", "ddp"), (0, "hpcdp", "zero3"), (0, "torch", "zero3"),
        (1, "torch", "zero3"), (1, "hpcdp", "zero3"), (1, "torch", "ddp"), (1, "hpcdp", "ddp")]
    assert step_ranks.schedule(["zero3"], 1, False) == [(0, "hpcdp", "zero3")]
    assert step_ranks.parse_strategies("zero3, ddp,zero3") == ["zero3", "ddp"]


def test_a_step_is_the_slowest_ranks():
    s = step_ranks.summary([[1.0, 5.0, 3.0], [2.0, 4.0, 3.5]])
    assert s["median_s"] == 3.5 and s["min_s"] == 2.0 and s["repeats"] == 3


def test_each_rank_trains_on_its_slice_of_the_global_batch(gpt, tmp_path):
    (tmp_path / "job.toml").write_text(TINY_JOB)
    bench.set_gpt(str(tmp_path / "job.toml"))
    x, y = bench._gpt_batch(__import__("numpy").random.default_rng(0))
    parts = [step_ranks.rank_slice(x, y, r, 2) for r in range(2)]
    assert [p[0].shape for p in parts] == [(2, 8), (2, 8)]
    assert (parts[0][0] == x[:2]).all() and (parts[1][1] == y[2:]).all()


def test_two_ranks_print_a_row_per_contender_and_round(gpt, tmp_path, capsys):
    """A real 2-rank job of hpcdp's ZeRO-3 (mpiexec), tiny GPT, 3 steps."""
    (tmp_path / "job.toml").write_text(TINY_JOB)
    out = tmp_path / "out.json"
    assert bench.main(["--ranks", "2", "--strategies", "zero3", "--rounds", "1", "--warmup", "1",
                       "--repeats", "3", "--gpt-config", str(tmp_path / "job.toml"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.startswith("zero3 ")]
    assert [r[:4] for r in rows] == [["zero3", "1", "hpcdp", "ZeRO-3"]] and float(rows[0][4]) > 0
    assert "2 samples per rank" in text and "FSDP2 were not measured" in text
    import json
    rec = json.loads(out.read_text())["ranks"]
    assert rec["ranks"] == 2 and rec["rows"][0]["hpcdp"]["repeats"] == 3 and "torch" not in rec["rows"][0]
