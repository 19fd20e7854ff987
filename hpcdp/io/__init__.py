"""Sharded HDF5 checkpoints: save on N ranks, restore on any M ranks and strategy.

Each folder is one concern; imports run down this list (docs/architecture.md, "io/"):

- errors.py, failpoint.py   CheckpointError (+ damaged_file: h5py's errors as one line);
                            named points where a test kills a rank on purpose
- disk/          bytes past the page cache: O_DIRECT writes and reads, coalesced reads
- format/        what is on disk: names, checksums, ranges, deterministic HDF5, probe,
                 layouts (split, shared), index.h5, run state, the commit protocol
- protocol.py    what a strategy says it writes and fills (Piece, ReplicatedCheckpoint)
- save/          one save: snapshot, save, the asynchronous save's thread, buffers, writer process
- restore/       one restore: reader, spread (each byte read once), load, weights (one process)
- interop/       inspect (`hpcdp ckpt`), export, transformers' GPT-2 layout, model.init_from
- stop.py        SIGTERM/SIGUSR1;  lock.py  one writing job per checkpoint folder
- checkpointer.py  what train.py calls

Every phase of a save or restore ends with an agreement (errors.AGREEMENT, the one
agreement helper of hpcdp.failure.agreement), so one rank's error stops all of them.

Importing this package imports nothing heavy (h5py is imported by the modules
that write or read files).
"""
