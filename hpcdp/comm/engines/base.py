"""What an engine is (hpcdp.comm.engines.registry says what each field means)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _always(*_args) -> bool:
    return True


@dataclass(frozen=True)
class Engine:
    name: str
    runs: Callable
    launch: Callable
    takes: Callable = _always
    available: Callable = _always
    progresses: bool = False
    selectable: bool = True
