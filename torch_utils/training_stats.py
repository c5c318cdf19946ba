"""Scalar statistics reported from anywhere in the code and averaged across processes.

Any code may call `report('Loss/D/loss', value)` with a scalar or a tensor of per-sample values.
Each report adds to running moments (count, sum, sum of squares) kept per name in float64, on the
device the value lives on, so reporting never waits for the GPU. A `Collector` owned by the training loop periodically calls `update()`, which sums the moments
gathered since its last update over all processes (torch.distributed) and exposes mean and std.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

import dnnlib

#----------------------------------------------------------------------------

_moments: dict[tuple[str, torch.device], torch.Tensor] = {}  # (name, device) -> float64 [count, sum, sum_sq, non-finite count].


def report(name: str, value: Any) -> Any:
    """Record `value` (number, array or tensor; every element counts as one sample) under `name`.

    Returns `value` unchanged, so it can wrap an expression. NaN/Inf elements are not counted
    (they would poison every average) but counted apart, for `Collector.nonfinite_names()`; they
    are masked rather than removed, since removing would make the GPU report back their number.
    """
    elems = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    elems = elems.flatten().to(torch.float64)
    finite = elems.isfinite()
    elems = elems.where(finite, 0.0)
    # [count, sum, sum of squares, non-finite count] with one reduction: few small kernels per report.
    moments = torch.stack([finite.to(torch.float64), elems, elems.square(), (~finite).to(torch.float64)]).sum(dim=1)
    key = (name, elems.device)
    if key in _moments:
        _moments[key] += moments
    else:
        _moments[key] = moments
    return value


def _total(name: str) -> torch.Tensor:
    """Moments of `name` since process start, summed over the devices it was reported from, on the CPU."""
    total = torch.zeros(4, dtype=torch.float64)
    for (key_name, _device), moments in _moments.items():
        if key_name == name:
            total += moments.cpu()
    return total


class Collector:
    """Averages of the statistics reported since the previous `update()`, over all processes.

    In a multi-process run every process must call `update()` at the same point (it is a
    collective operation); the names reported may differ between processes.
    """

    def __init__(self, regex: str = '.*') -> None:
        self._regex = re.compile(regex)
        self._last: dict[str, torch.Tensor] = {name: _total(name) for name in self.names()}  # Only what comes after.
        self._current: dict[str, torch.Tensor] = {}

    def names(self) -> list[str]:
        return sorted({n for n, _device in _moments if self._regex.fullmatch(n)})

    def update(self) -> None:
        names = self.names()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            gathered: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, names)
            names = sorted(set().union(*gathered))
        deltas = torch.zeros(len(names), 4, dtype=torch.float64)
        for i, name in enumerate(names):
            total = _total(name)
            deltas[i] = total - self._last.get(name, torch.zeros(4, dtype=torch.float64))
            self._last[name] = total.clone()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1 and names:
            backend_device = 'cuda' if torch.distributed.get_backend() == 'nccl' else 'cpu'
            deltas_dev = deltas.to(backend_device)
            torch.distributed.all_reduce(deltas_dev)
            deltas = deltas_dev.cpu()
        self._current = {name: deltas[i] for i, name in enumerate(names)}

    def num(self, name: str) -> float:
        m = self._current.get(name)
        return float(m[0]) if m is not None else 0.0

    def mean(self, name: str) -> float:
        m = self._current.get(name)
        if m is None or m[0] == 0:
            return float('nan')
        return float(m[1] / m[0])

    def std(self, name: str) -> float:
        m = self._current.get(name)
        if m is None or m[0] == 0:
            return float('nan')
        mean = m[1] / m[0]
        return float(torch.sqrt(torch.clamp(m[2] / m[0] - mean * mean, min=0)))

    def nonfinite_names(self) -> list[str]:
        """Names that received NaN or Inf values before the last update."""
        return [name for name, m in self._current.items() if m[3] > 0]

    def as_dict(self) -> dnnlib.EasyDict:
        """{name: {num, mean, std}} for every name seen in the last update with at least one sample."""
        return dnnlib.EasyDict({name: dnnlib.EasyDict(num=self.num(name), mean=self.mean(name), std=self.std(name))
                                for name in self._current if self.num(name) > 0})
