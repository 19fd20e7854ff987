"""The example configs that hpcdp's tools read, shipped as package data.

``hpcdp bench exact|ckpt|data`` and ``hpcdp scale --study staleness|ps-bytes`` train the
repository's example configs (``jobs/*.toml``). So that an installed hpcdp (a wheel, not
the source tree) runs them too, the ones they read are links here to ``jobs/`` (one copy
in the repository; building the wheel copies their content). A command names one with
:func:`config_path`; a config a command reads that is not here is a bug
(tests/unit/test_wheel.py runs those commands from a built wheel).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def config_path(name: str) -> Path:
    """The shipped example config ``name`` (e.g. ``"gpt_ddp.toml"``)."""
    path = HERE / name
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in HERE.glob("*.toml")))
        raise FileNotFoundError(f"{name}: not one of the configs shipped with hpcdp ({shipped})")
    return path


def shipped() -> list[str]:
    return sorted(p.name for p in HERE.glob("*.toml"))


__all__ = ["config_path", "shipped"]
