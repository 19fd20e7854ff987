"""``hpcdp bench step --ranks 2`` against PyTorch: hpcdp's DDP and ZeRO-3 (mpiexec) and
PyTorch's DDP and FSDP2 (2 processes of the torch venv on gloo) each train the tiny GPT
and the table has every contender, with a ratio per strategy and round (the options
and hpcdp's side alone: tests/unit/test_bench_step_ranks.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from test_bench_step_ranks import TINY_JOB  # noqa: E402  the tiny GPT job

from hpcdp.bench import step_time as bench  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_two_ranks_beside_pytorch_ddp_and_fsdp2(tmp_path, capsys, monkeypatch):
    python = os.path.abspath(os.environ.get("HPCDP_HF_PYTHON", str(ROOT / ".venv-hf" / "bin" / "python")))
    if not Path(python).exists():
        pytest.skip(f"no torch venv at {python}: run bash tests/hf/setup_venv_hf.sh (tests/run_all.sh does)")
    monkeypatch.setattr(bench, "GPT", dict(bench.GPT))
    monkeypatch.setattr(bench, "GPT_BATCH", bench.GPT_BATCH)
    (tmp_path / "job.toml").write_text(TINY_JOB)
    out = tmp_path / "out.json"
    assert bench.main(["--ranks", "2", "--strategies", "ddp,zero3", "--rounds", "1", "--warmup", "1",
                       "--repeats", "3", "--gpt-config", str(tmp_path / "job.toml"), "--torch-python", python,
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    names = {" ".join(line.split()[2:4]) for line in text.splitlines() if line.startswith(("ddp ", "zero3 "))}
    assert names == {"hpcdp DDP", "PyTorch DDP", "hpcdp ZeRO-3", "PyTorch FSDP2"}
    rows = json.loads(out.read_text())["ranks"]["rows"]
    assert [r["strategy"] for r in rows] == ["ddp", "zero3"]
    for r in rows:
        assert r["ratio"] > 0 and r["torch"]["repeats"] == 3 and r["torch_version"].startswith("2.")
        assert r["hpcdp_params"] == r["torch_params"]  # the same GPT on both sides
