"""bench/common.py's host-work counter, and bench/train_speed.py reporting it."""

import json
import time
import types

import torch
from click.testing import CliRunner

from bench import train_speed
from bench import common as bench_common
from bench.common import count_host_work


def _three_python_calls(x):
    def double(t):
        return t * 2
    return double(double(double(x)))


def test_count_host_work_counts_ops_and_python_calls():
    x = torch.ones(3)
    work = count_host_work(lambda: _three_python_calls(x))
    assert work.python_calls == 1 + 1 + 3  # The lambda, _three_python_calls, double x 3.
    assert work.ops == 3  # Three multiplications.


def test_count_host_work_sees_the_backward_pass():
    x = torch.ones(3, requires_grad=True)
    forward_ops = count_host_work(lambda: x.mul(2).sum()).ops
    work = count_host_work(lambda: x.mul(2).sum().backward())
    assert forward_ops == 2
    assert work.ops >= forward_ops + 3  # The seed, SumBackward's expand, MulBackward's mul (and x.grad's accumulation).
    assert torch.equal(x.grad, torch.full([3], 4.0))  # Run twice: 2 + 2.


def test_train_speed_reports_ops_and_python_calls(tmp_path):
    out = tmp_path / 'speed.json'
    args = ['--cfg=quickstart', '--batch=2', '--norms=none,gn', '--fast-g=default', '--rounds=1', '--warmup=0',
            '--threads=1', f'--out={out}']
    result = CliRunner().invoke(train_speed.main, args)
    assert result.exit_code == 0, result.output
    assert 'ops/D' in result.output and 'calls/G' in result.output
    rows = json.loads(out.read_text())['results']
    for row in rows:
        for key in ['ops_per_D_step', 'python_calls_per_D_step', 'ops_per_G_step', 'python_calls_per_G_step']:
            assert row[key] > 50, (row['norm'], key)
        assert row['syncs_per_D_step'] is None and row['syncs_per_G_step'] is None  # Counted on a GPU only.
    none, gn = sorted(rows, key=lambda r: r['norm'] != 'none')
    assert gn['ops_per_D_step'] > none['ops_per_D_step']  # GN's double backward.


def test_train_speed_peak_memory_is_each_configurations_own(monkeypatch):
    """On a GPU (its memory statistics stubbed here): each configuration's memory is measured alone, after every
    configuration's graphs were freed, from a reset of the statistics; its own graphs are freed after."""
    peak, released = [0], []
    monkeypatch.setattr(torch.cuda, 'reset_peak_memory_stats', lambda device: peak.__setitem__(0, 0))
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', lambda device: peak[0])
    monkeypatch.setattr(torch.cuda, 'max_memory_reserved', lambda device: peak[0] + 2 ** 30)  # Pools hold 1 GiB more.
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device: None)
    monkeypatch.setattr(torch.cuda, 'empty_cache', lambda: None)
    preset = train_speed.build_preset('quickstart', ['none', 'gn'], 2, None, None, torch.device('cpu'))
    runs = [train_speed.Configuration(preset, norm, None, None, None, 'fp32', torch.device('cpu'), time.perf_counter)
            for norm in ('none', 'gn')]
    # GiB of each step: a timed D and G step (another row's graphs alive: not counted), then the measuring pass.
    allocations = {'none': iter([10, 3, 4, 5] + [1] * 20), 'gn': iter([0.5, 0.25, 2] + [0] * 20)}
    for run in runs:
        run.device, run.batch, run._device_time = types.SimpleNamespace(type='cuda'), lambda net: [], lambda *args: 0.0
        run.call = lambda net, batch, norm=run.norm: peak.__setitem__(0, max(peak[0], next(allocations[norm]) * 2 ** 30))
        run.training.release_graphs = lambda norm=run.norm: released.append(norm)
        run.host_work = {net: bench_common.HostWork(0, 0, None) for net in ('D', 'G')}
    for run in runs:
        for net in ('D', 'G'):
            run.step(net, record=True)
    for run in runs:
        run.measure_memory(runs)
    assert released == ['none', 'gn', 'none', 'none', 'gn', 'gn']  # All freed before each, its own after.
    assert [run.result()['peak_memory_gib'] for run in runs] == [5, 2]
    assert [run.result()['peak_reserved_gib'] for run in runs] == [6, 3]
