"""``hpcdp scale``: the scaling study and the workload half of the cost model (docs/scaling.md).

- study.py: the weak/strong sweep (child ``mpiexec`` jobs), its attribution and tables;
  report.py its table, plot and predictions; compute_only.py the no-communication baseline;
  collect.py the table of points run as separate jobs.
- model.py: a training config's step priced strategy by strategy, on the link costs of
  hpcdp.comm.model.cost (the collective half of the model).
- calibrate.py (+ linkprobe.py, the probe it launches), predict.py, validate.py: measure a
  machine profile, predict from one, check one against held-out points.
- ps_study.py, zero_study.py: the parameter-server and ZeRO studies.
- reproduce.py (+ published/*.toml, package data): the model against scaling tables other
  people measured, from the inputs their publications give.
- goodput.py: the checkpoint interval and the goodput with failures per rank count.

The entry point is hpcdp.commands.scale. This package sits above the micro-benchmarks
(hpcdp.bench, whose collectives table validate runs) and below the commands.
"""
