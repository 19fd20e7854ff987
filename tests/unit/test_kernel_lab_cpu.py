"""The CPU kernel lab's smoke run: every fused CPU kernel and the NumPy chain it
replaces match the float64 reference, with poisoned (NaN) outputs."""

import json

import numpy as np

from kernels import cpu_lab, reference as ref


def test_cpu_lab_smoke_validates_every_kernel(tmp_path, capsys):
    out = tmp_path / "lab.json"
    assert cpu_lab.main(["--smoke", "--json", str(out), "--seed", "7"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kernel"] for r in rows} == set(cpu_lab.CASES)
    assert {r["variant"] for r in rows} == {"v1_numpy", "v2_fused"}
    assert all(r["ok"] and r["rel_err"] < 1e-5 for r in rows)
    assert "causal_softmax_fwd" in capsys.readouterr().out


def test_an_unwritten_element_fails_validation():
    # a kernel that skips the masked half: its poisoned NaNs make the error infinite
    x = np.random.default_rng(0).standard_normal((2, 5, 5)).astype(np.float32)
    y = cpu_lab.poisoned(x.shape)
    p = ref.causal_softmax(x, 0.5)
    y[..., 0] = p[..., 0]
    assert ref.rel_err(y, p) == float("inf")
