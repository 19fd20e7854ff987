"""One restore, on any number of ranks and any strategy.

- reader.py      read element ranges, verifying checksums block by block
- spread.py      replicas restore 1/M each and share it (each byte read once)
- load.py        one restore across ranks
- weights.py     a checkpoint's weights into a model built from its config, one process
                 (`hpcdp sample --resume`)
"""
