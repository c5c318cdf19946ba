"""Scalar statistics reported from anywhere in the code and averaged across processes.

Any code may call `report('Loss/D/loss', value)` with a scalar or a tensor of per-sample values.
A report costs one operation (a detach) and a list append: the values wait, on their device, until
the next flush, which turns all of them at once into running moments (count, sum, sum of squares,
non-finite count) in float64, one row per name in one accumulator per device, with a handful of
fused operations (a concatenation, the moments, one index_add_). So reporting never waits for the
GPU and adds no kernels per report to a training step. A flush happens at every `Collector.update()`
(the training loop's tick) and whenever `MAX_PENDING` reports wait. A reported tensor is read at
the flush, so it must not be modified in place after `report` (the losses' are not). On CUDA,
index_add_ adds in no fixed order unless deterministic algorithms are on, so the float64 sums may
differ in their last bits between runs (the training itself does not read them).

A training step replayed as a CUDA graph (training/step/graphs.py) runs its reports' Python once, at
capture: it adds them inside the graph with `flush_into`, to an accumulator of its own (`new_accumulator`),
row by row with in-place adds and no host-to-device copy, so that every replay adds its step's moments.

A `Collector` owned by the training loop periodically calls `update()`, which sums the moments
gathered since its last update over all processes (torch.distributed) and exposes mean and std.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from typing import Any, Hashable, Iterator

import numpy as np
import torch

import dnnlib

#----------------------------------------------------------------------------

MAX_PENDING = 1024  # Reports that may wait for a flush (a bound on memory where nothing calls update()).

_rows: dict[str, int] = {}  # name -> its row in every device's accumulator.
# device (or a captured step's own key) -> float64 [rows, 4]: count, sum, sum of squares, non-finite count.
_accumulators: dict[Hashable, torch.Tensor] = {}
_captured_keys = itertools.count()
_pending: list[tuple[int, torch.Tensor]] = []  # (row, values) reported since the last flush.


def report(name: str, value: Any) -> Any:
    """Record `value` (number, array or tensor; every element counts as one sample) under `name`.

    Returns `value` unchanged, so it can wrap an expression. NaN/Inf elements are not counted
    (they would poison every average) but counted apart, for `Collector.nonfinite_names()`; they
    are masked rather than removed, since removing would make the GPU report back their number.
    """
    row = _rows.setdefault(name, len(_rows))
    _pending.append((row, value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))))
    if len(_pending) >= MAX_PENDING:
        flush()
    return value


def flush() -> None:
    """Add the moments of every pending report to its name's row, per device: a few operations for all of them."""
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for row, values in _pending:
        by_device.setdefault(values.device, []).append((row, values))
    _pending.clear()
    for device, reports in by_device.items():
        elems = torch.cat([values.reshape(-1) for _row, values in reports]).to(torch.float64)  # cat promotes dtypes.
        rows = torch.tensor([row for row, _values in reports]).repeat_interleave(
            torch.tensor([values.numel() for _row, values in reports])).to(device, non_blocking=True)
        _accumulator(device).index_add_(0, rows, _moments(elems))


def _moments(values: torch.Tensor) -> torch.Tensor:
    """[count of finite values, their sum, their sum of squares, count of non-finite values] of a float64 vector,
    per element: [numel, 4]."""
    finite = values.isfinite()
    values = values.where(finite, 0.0)
    return torch.stack([finite.to(torch.float64), values, values.square(), (~finite).to(torch.float64)], dim=1)


def new_accumulator(device: torch.device) -> torch.Tensor:
    """A zeroed accumulator of every name known so far, counted in the statistics from now on, for `flush_into`."""
    accumulator = torch.zeros([len(_rows), 4], dtype=torch.float64, device=device)
    _accumulators[('captured', next(_captured_keys))] = accumulator
    return accumulator


def flush_into(accumulator: torch.Tensor) -> None:
    """Add the moments of every pending report to `accumulator` (from `new_accumulator`), one in-place row add per
    report: no index built on the host, so a CUDA graph can capture it. A name it has no row for is a ValueError."""
    reports = list(_pending)
    _pending.clear()
    for row, values in reports:
        if row >= accumulator.shape[0]:
            raise ValueError(f'statistic {list(_rows)[row]} was first reported after its accumulator was made')
        accumulator[row].add_(_moments(values.reshape(-1).to(torch.float64)).sum(dim=0))


@contextlib.contextmanager
def discarded() -> Iterator[None]:
    """Drop the reports made inside (a step computed only to be compared, whose statistics count elsewhere)."""
    flush()
    try:
        yield
    finally:
        _pending.clear()


def _accumulator(device: torch.device) -> torch.Tensor:
    """The moments of every name on `device`, grown to a row per name known so far."""
    accumulator = _accumulators.get(device)
    if accumulator is None or accumulator.shape[0] < len(_rows):
        grown = torch.zeros([len(_rows), 4], dtype=torch.float64, device=device)
        if accumulator is not None:
            grown[:accumulator.shape[0]] = accumulator
        accumulator = _accumulators[device] = grown
    return accumulator


def _totals() -> torch.Tensor:
    """Moments of every name since process start, [len(_rows), 4], summed over devices, on the CPU (one read each)."""
    flush()
    totals = torch.zeros([len(_rows), 4], dtype=torch.float64)
    for accumulator in _accumulators.values():
        totals[:accumulator.shape[0]] += accumulator.cpu()
    return totals


class Collector:
    """Averages of the statistics reported since the previous `update()`, over all processes.

    In a multi-process run every process must call `update()` at the same point (it is a
    collective operation); the names reported may differ between processes.
    """

    def __init__(self, regex: str = '.*') -> None:
        self._regex = re.compile(regex)
        totals = _totals()
        self._last: dict[str, torch.Tensor] = {name: totals[_rows[name]] for name in self.names()}  # What comes after.
        self._current: dict[str, torch.Tensor] = {}

    def names(self) -> list[str]:
        return sorted(n for n in _rows if self._regex.fullmatch(n))

    def update(self) -> None:
        names = self.names()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            gathered: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, names)
            names = sorted(set().union(*gathered))
        totals = _totals()
        deltas = torch.zeros(len(names), 4, dtype=torch.float64)
        for i, name in enumerate(names):
            if name in _rows:  # Else reported by another process only.
                deltas[i] = totals[_rows[name]] - self._last.get(name, torch.zeros(4, dtype=torch.float64))
                self._last[name] = totals[_rows[name]]
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
