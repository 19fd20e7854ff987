"""The kernel lab's smoke run (tiny sizes, validation only) and its poison check."""

import math

import numpy as np

from kernels import harness, reference as ref, run_lab


def test_lab_smoke_validates_every_variant(tmp_path, capsys):
    out = tmp_path / "lab.json"
    assert run_lab.main(["--smoke", "--json", str(out)]) == 0
    import json
    rows = json.loads(out.read_text())["rows"]
    kernels = {r["kernel"] for r in rows}
    assert {"gemm_fp32", "softmax", "layernorm_fwd", "cross_entropy_fwd", "adamw"} <= kernels
    assert sum(r["kernel"] == "gemm_fp32" for r in rows) == 4
    assert all(r["ok"] and r["rel_err"] < 1e-4 for r in rows)
    assert "v4_reg128x128" in capsys.readouterr().out


def test_poisoned_output_catches_unwritten_elements():
    o = harness.poisoned((6,))
    host = o.copy_to_host()
    host[:5] = 1.0  # a kernel that forgot the last element
    assert math.isinf(ref.rel_err(host, np.ones(6)))
