"""What a checkpoint is on disk (docs/checkpoints.md), and reading and writing its files.

- names.py       names and constants of the format (file names, tensor names, BLOCK_BYTES, LIBVER)
- checksum.py    XXH3-128 per 4 MiB block (SHA-256 in format-1 checkpoints, still read)
- ranges.py      range arithmetic: intersect, split at parameter boundaries, coverage
- h5.py          deterministic HDF5 files, raw pread of contiguous datasets
- probe.py       an untrusted file's metadata walked in a child process first (a crash -> one line)
- layouts.py     the layout registry (checkpoint.layout -> its class)
- shardfile.py   layout "split": one file per rank
- shared.py      layout "shared": one file, parallel HDF5 (h5py mpio)
- index.py       index.h5: where every tensor lives, the run's state
- runstate.py    config, step, data position, optimizer scalars
- commit.py      atomic directory protocol, marker, latest, keep, --resume targets
"""
