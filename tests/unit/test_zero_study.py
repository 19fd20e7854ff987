"""hpcdp scale --study memory / zero-step (hpcdp/scale/zero_study.py): the table and
the hookup, without launching jobs."""

import pytest

from hpcdp.commands.scale import build_parser
from hpcdp.scale import study as scale, zero_study


def test_memory_table_shows_measured_beside_formula_and_the_worst_deviation():
    mib = 1 << 20
    result = {"points": [
        {"strategy": "zero3", "ranks": 2, "mem_persistent_bytes": [4 * mib, 4 * mib],
         "formula_bytes": [4 * mib, 4.2 * mib], "mem_peak_bytes": [6 * mib, 6 * mib],
         "mem_working_peak_bytes": [2 * mib, 2 * mib], "rss_peak_bytes": [200 * mib, 210 * mib]}]}
    lines = zero_study.memory_table(result).splitlines()
    assert lines[0].split()[:4] == ["strategy", "ranks", "state", "MiB"]
    row = lines[1].split()
    assert row[:4] == ["zero3", "2", "4.000", "4.100"] and row[4] == "4.76%"  # |4 - 4.2| / 4.2
    assert row[5:8] == ["6.000", "2.000", "205.0"]


def test_scale_routes_the_zero_studies_and_checks_steps():
    args = build_parser().parse_args(["--config", "jobs/gpt_ddp.toml", "--study", "memory",
                                            "--steps", "2", "--warmup", "2"])
    with pytest.raises(SystemExit, match="--steps 2 must exceed --warmup 2"):
        scale.run(args)
    assert set(zero_study.STRATEGIES) == {"ddp", "zero1", "zero2", "zero3"}
