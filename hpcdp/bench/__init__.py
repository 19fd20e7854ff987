"""Benchmarks: ``step`` (training-step time vs NumPy / PyTorch), ``collectives``
(OSU-style tables) and ``scale`` (scaling studies). Performance is measured here,
never asserted in tests."""
