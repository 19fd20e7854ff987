"""The subcommands of ``hpcdp``, one module each (the tools layer, docs/architecture.md).

The convention: ``hpcdp NAME ...`` runs ``main(argv) -> int`` of ``hpcdp/commands/NAME.py``
(a ``-`` in NAME is ``_`` in the file name: ``hpcdp check-exact`` is ``check_exact.py``);
``hpcdp bench NAME`` runs ``main(argv) -> int`` of the module that :mod:`hpcdp.commands.bench`
names for it. ``argv`` is the list after the subcommand's name; the status is the process's
exit status. hpcdp.cli turns a ValueError or FileNotFoundError (bad input) into one error
line and status 2. A new subcommand is one new file here plus its line in
``hpcdp.cli.COMMANDS`` (its help).
"""
