"""torch_utils.training_stats: moments against numpy, per-interval resets, and a 2-process reduction."""

import os

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_utils import compat, training_stats


def test_mean_std_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=17), rng.normal(size=5)
    collector = training_stats.Collector(r'Test1/.*')
    training_stats.report('Test1/x', torch.from_numpy(a))
    training_stats.report('Test1/x', b)
    training_stats.report('Test1/y', float('nan'))  # Not counted.
    training_stats.report('Other/z', 1.0)  # Not matched.
    collector.update()
    both = np.concatenate([a, b])
    stats = collector.as_dict()
    assert set(stats) == {'Test1/x'}
    assert stats['Test1/x'].num == 22
    assert stats['Test1/x'].mean == pytest.approx(both.mean(), rel=1e-12)
    assert stats['Test1/x'].std == pytest.approx(both.std(), rel=1e-10)
    collector.update()  # Nothing new since the last update.
    assert collector.num('Test1/x') == 0 and np.isnan(collector.mean('Test1/x'))


def test_non_finite_elements_are_masked():
    values = np.array([1.5, np.nan, -2.0, np.inf, 0.25, -np.inf, 3.0])
    finite = values[np.isfinite(values)]
    collector = training_stats.Collector(r'Test2/.*')
    training_stats.report('Test2/x', torch.tensor(values, dtype=torch.float32).reshape(7, 1))
    training_stats.report('Test2/x', [4.0, float('nan')])
    collector.update()
    expected = np.concatenate([finite, [4.0]])
    assert collector.num('Test2/x') == 5
    assert collector.mean('Test2/x') == pytest.approx(expected.mean(), rel=1e-12)
    assert collector.std('Test2/x') == pytest.approx(expected.std(), rel=1e-10)


class _OpCounter(TorchDispatchMode):
    """Dispatched ATen ops, and among them the ones that are not views (those run kernels)."""

    def __init__(self):
        super().__init__()
        self.ops, self.kernels = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


def test_reports_cost_one_view_each_and_a_flush_a_few_kernels(monkeypatch):
    """A report dispatches its detach alone, a view (torch 2.5 dispatches that detach twice); a flush of 300 reports of three names, float32 and float64,
    scalars and arrays, with NaN and Inf, runs a few kernels; automatic flushes past MAX_PENDING; the moments equal
    numpy's."""
    monkeypatch.setattr(training_stats, 'MAX_PENDING', 300)
    rng = np.random.default_rng(1)
    collector = training_stats.Collector(r'Test3/.*')
    reported = {'Test3/a': [], 'Test3/b': [], 'Test3/c': []}
    report_index = 0
    for step in range(150):
        values = {'Test3/a': rng.normal(size=4).astype(np.float32), 'Test3/b': rng.normal(size=[2, 3]) * 1e3,
                  'Test3/c': rng.normal(size=[]) + step}
        values['Test3/a'][step % 4] = [np.nan, np.inf, 1.0, -np.inf][step % 4]
        for name, value in values.items():
            reported[name].append(np.asarray(value, dtype=np.float64).reshape(-1))
            tensor = torch.from_numpy(np.asarray(value))
            counter = _OpCounter()
            with counter:
                training_stats.report(name, tensor)
            if report_index != 299:  # The 300th flushes.
                assert set(counter.ops) == {torch.ops.aten.detach.default} and counter.kernels == 0
            report_index += 1
    counter = _OpCounter()
    with counter:
        training_stats.flush()  # The last 150 reports.
    assert counter.kernels <= 20
    collector.update()
    for name, chunks in reported.items():
        values = np.concatenate(chunks)
        finite = values[np.isfinite(values)]
        assert collector.num(name) == len(finite)
        assert collector.mean(name) == pytest.approx(finite.mean(), rel=1e-12)
        assert collector.std(name) == pytest.approx(finite.std(), rel=1e-9)
    assert collector.nonfinite_names() == ['Test3/a']


def _worker(rank, init_file, result_file):
    torch.distributed.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank, world_size=2)
    collector = training_stats.Collector(r'Dist/.*')
    training_stats.report('Dist/x', torch.arange(3.0) + 10 * rank)
    if rank == 1:
        training_stats.report('Dist/only1', 5.0)
    collector.update()
    if rank == 0:
        torch.save({'mean': collector.mean('Dist/x'), 'num': collector.num('Dist/x'),
                    'only1': collector.mean('Dist/only1')}, result_file)
    if not compat.destroy_process_group():  # As the programs end a group's process (torch < 2.8: gloo may deadlock).
        os._exit(0)


def test_two_process_reduction(tmp_path):
    result_file = str(tmp_path / 'result.pt')
    torch.multiprocessing.spawn(_worker, args=(str(tmp_path / 'init'), result_file), nprocs=2)
    result = torch.load(result_file, weights_only=True)
    assert result['num'] == 6
    assert result['mean'] == pytest.approx(np.mean([0, 1, 2, 10, 11, 12]))
    assert result['only1'] == 5.0
