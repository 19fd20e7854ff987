"""hpcdp: data-parallel training of neural networks on MPI clusters.

The data flow of one training step is the folder tree:
data/ -> autograd/ + nn/ (ops dispatch to backend/) -> strategies/ (moves gradients
through comm/) -> optim/ -> io/ -> metrics. See docs/architecture.md.
"""

__version__ = "0.1.0"
