"""TensorBoard events of a run (``run.tensorboard = true``): ``<run dir>/tensorboard/``.

Written with tensorboardX (``pip install 'hpcdp[tensorboard]'``: tensorboardX, protobuf
and packaging; no PyTorch, no TensorFlow), which writes TensorBoard's own event-file
format; ``tensorboard --logdir runs`` shows every run under it. Scalars per step:
``train/loss``, ``train/lr``, ``train/samples_per_s``, ``train/step_time_s``,
``data/wait_s`` (the slowest rank), and where the strategy reports them
``comm/bytes_sent`` (mean over ranks), ``comm/comm_s`` and ``comm/comm_exposed_s``
(slowest rank); per evaluation ``eval/loss`` and ``eval/accuracy``.
"""

from __future__ import annotations

import importlib.util
import math

from hpcdp.config_error import ConfigError

MEAN = {"bytes_sent": "comm/bytes_sent", "bytes_recv": "comm/bytes_recv"}
SLOWEST = {"comm_s": "comm/comm_s", "comm_exposed_s": "comm/comm_exposed_s", "data_wait_s": "data/wait_s"}


def check_available() -> None:
    if importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError("run.tensorboard = true needs the tensorboardX package: pip install "
                          "'hpcdp[tensorboard]' (no PyTorch), or set run.tensorboard = false")


class TensorBoardEvents:
    """Scalars of every step and evaluation into one event file under ``logdir``."""

    def __init__(self, logdir):
        check_available()
        from tensorboardX import SummaryWriter

        self.w = SummaryWriter(logdir=str(logdir), flush_secs=5)

    def _scalar(self, tag: str, value, step: int) -> None:
        if value is not None and math.isfinite(float(value)):
            self.w.add_scalar(tag, float(value), step)

    def step(self, record: dict, ranks: dict | None) -> None:
        s = record["step"]
        for key in ("loss", "lr", "samples_per_s", "step_time_s"):
            self._scalar(f"train/{key}", record.get(key), s)
        for key, tag in MEAN.items():
            vals = (ranks or {}).get(key)
            if vals:
                self._scalar(tag, sum(vals) / len(vals), s)
        for key, tag in SLOWEST.items():
            vals = (ranks or {}).get(key)
            if vals:
                self._scalar(tag, max(vals), s)

    def eval(self, ev: dict) -> None:
        for key in ("loss", "accuracy"):
            self._scalar(f"eval/{key}", ev.get(key), ev["step"])

    def close(self) -> None:
        self.w.close()


__all__ = ["TensorBoardEvents", "check_available"]
