"""Shared by every test group: hpcdp.comm's ``[comm]`` settings follow what a test does.

Each test starts from the default ``[comm]`` (a run an earlier test trained in this
process configured its own), and ``monkeypatch.setenv`` / ``delenv`` of an ``HPCDP_``
variable makes hpcdp.comm read its settings again when next asked (they are read once
and cached: hpcdp.comm.core.settings), so a variable a test sets overrides the config as
it does for a real run, and a bad value is refused where the code first reads it."""

from __future__ import annotations

import sys

import pytest


def _invalidate(defaults: bool = False) -> None:
    mod = sys.modules.get("hpcdp.comm.core.settings")
    if mod is not None:
        mod.invalidate(defaults)


@pytest.fixture(autouse=True)
def _comm_settings_from_defaults():
    _invalidate(defaults=True)
    yield


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's monkeypatch; an ``HPCDP_`` variable it sets or deletes (or restores at
    the end) makes hpcdp.comm read its settings again."""
    setenv, delenv, undo = monkeypatch.setenv, monkeypatch.delenv, monkeypatch.undo

    def set_(name, value, prepend=None):
        setenv(name, value, prepend)
        if name.startswith("HPCDP_"):
            _invalidate()

    def del_(name, raising=True):
        delenv(name, raising=raising)
        if name.startswith("HPCDP_"):
            _invalidate()

    def undo_():
        undo()
        _invalidate()

    monkeypatch.setenv, monkeypatch.delenv, monkeypatch.undo = set_, del_, undo_
    yield monkeypatch
    _invalidate()
