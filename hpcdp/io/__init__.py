"""Sharded HDF5 checkpoints: save on N ranks, restore on any M ranks and strategy.

- format.py      names and constants of the format (docs/checkpoints.md)
- protocol.py    what a strategy says it writes and fills (Piece, ReplicatedCheckpoint)
- snapshot.py    this rank's pieces cut per logical tensor, in host memory
- ranges.py      range arithmetic: intersect, split at parameter boundaries, coverage
- checksum.py    XXH3-128 per 4 MiB block (SHA-256 in format-1 checkpoints, still read)
- h5.py          deterministic HDF5 files, raw pwrite/pread of contiguous datasets
- direct.py      O_DIRECT writes and reads of page-aligned storage, and the fallbacks
- layouts.py     the layout registry (checkpoint.layout -> its class)
- shardfile.py   layout "split": one file per rank
- shared.py      layout "shared": one file, parallel HDF5 (h5py mpio)
- index.py       index.h5: where every tensor lives, the run's state
- reader.py      read element ranges, verifying checksums block by block
- spread.py      replicas restore 1/M each and share it (each byte read once)
- commit.py      atomic directory protocol, marker, latest, keep, --resume targets
- outcome.py     ranks agree on a save/load outcome (no hangs)
- save.py, load.py       one save / one restore across ranks
- runstate.py    config, step, data position, optimizer scalars
- background.py  the asynchronous save's thread;  stop.py  SIGTERM/SIGUSR1
- hostbuf.py     the asynchronous save's reusable, page-aligned snapshot buffers (memfd)
- writerproc.py  the asynchronous save's writer process (off the training GIL)
- inspect.py     verify, export, digests, summaries (`hpcdp ckpt`, hpcdp/commands/ckpt.py)
- errors.py      CheckpointError; damaged_file: h5py's errors on damaged files as one line
- probe.py       an untrusted file's metadata walked in a child process first (a crash -> one line)
- lock.py        one writing job per checkpoint.dir (job, host, pid; stale locks taken over)
- checkpointer.py  what train.py calls
- weights.py     a checkpoint's weights into a model built from its config, one process
                 (`hpcdp sample --resume`)
- export.py      `hpcdp ckpt export --format h5|npz|safetensors|hf-gpt2`; hf_gpt2.py  transformers'
                 GPT2LMHeadModel layout; init_from.py  `model.init_from` (weights made elsewhere)

Importing this package imports nothing heavy (h5py is imported by the modules
that write or read files).
"""
