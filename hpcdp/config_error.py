"""``ConfigError``: the one error class for a bad config value or key.

Its one home (a foundation module that imports nothing): the config parser, the
per-strategy option classes and every later layer that refuses a config raise it,
and ``hpcdp train`` turns it into one ``hpcdp: error: ...`` line (status 2) on every
rank. Import it from here.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value or key; the message names the dotted key and what to set."""


__all__ = ["ConfigError"]
