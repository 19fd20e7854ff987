"""Micro-benchmarks, ``hpcdp bench NAME`` (hpcdp.commands.bench names them): step_time
(training-step time vs NumPy / PyTorch), collectives (OSU-style tables), comm_overhead,
faults (fault injection), soak, data, startup, exact, ckpt. Performance is measured here,
never asserted in tests. The scaling study is its own package (hpcdp.scale)."""
