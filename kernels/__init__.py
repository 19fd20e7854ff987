"""The kernel lab: float64 references, kernel variants, validation and benchmarks
for hpcdp's numba.cuda kernels. Run ``python kernels/run_lab.py`` (see README.md)."""
