"""One save, from this rank's pieces to a committed checkpoint.

- snapshot.py    this rank's pieces cut per logical tensor, in host memory
- save.py        one save across ranks (every phase ends with an agreement)
- background.py  the asynchronous save's thread
- hostbuf.py     the asynchronous save's reusable, page-aligned snapshot buffers (memfd)
- writerproc.py  the asynchronous save's writer process (off the training GIL)
"""
