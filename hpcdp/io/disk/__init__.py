"""Bytes to and from the data files past the page cache (no HDF5, no format).

- direct.py      O_DIRECT writes and reads of page-aligned storage, page-aligned memory, the
                 page-cache fallbacks, pwrite_all; ALIGN / ALIGN_THRESHOLD (what h5.create aligns)
- coalesce.py    a restore's many small reads merged into few large extents, read ahead
"""
