"""training/run/evaluation.py: metrics at a snapshot, their statistics, and the best-metric bookkeeping."""

import json

import torch

import dnnlib
from metrics import detectors, metric_main
from training.run.evaluation import MetricEvaluator
from training.run.run_state import RunState


def _evaluator(tmp_path, monkeypatch, values, lines):
    """An evaluator of 'fid' and 'is' whose metric_main.calc_metric returns the next of `values` for fid."""
    calls = []

    def calc_metric(metric, **kwargs):
        calls.append(metric)
        if metric == 'fid50k_full':
            results = {'fid50k_full': values.pop(0)}
        else:
            results = {'is50k_mean': 9.0, 'is50k_std': 0.5}
        return dnnlib.EasyDict(results=dnnlib.EasyDict(results), metric=metric, total_time=0.0, total_time_str='0s',
                               num_gpus=1, num_gen=1, snapshot_pkl=None)
    monkeypatch.setattr(metric_main, 'calc_metric', calc_metric)
    evaluator = MetricEvaluator(['fid50k_full', 'is50k'], {}, {}, str(tmp_path), num_gpus=1, rank=0, device=torch.device('cpu'),
                                log=lines.append)
    return evaluator, calls


def test_statistics_and_best_value(tmp_path, monkeypatch):
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'), best_metric='fid50k_full')
    evaluator, calls = _evaluator(tmp_path, monkeypatch, [30.0, 25.0, 27.0], [])
    outcomes = [evaluator.evaluate(None, str(tmp_path / f'snap{i}.pkl')) for i in range(3)]
    assert [state.record_metric(results) for _, results in outcomes] == [True, True, False] and state.best == 25.0
    assert outcomes[2][0] == {'Metrics/fid50k_full': dict(num=1, mean=27.0, std=0.0),
                              'Metrics/is50k_mean': dict(num=1, mean=9.0, std=0.0),
                              'Metrics/is50k_std': dict(num=1, mean=0.5, std=0.0)}
    assert calls == ['fid50k_full', 'is50k'] * 3
    reported = [json.loads(line) for line in open(tmp_path / 'metric-fid50k_full.jsonl')]
    assert [r['results']['fid50k_full'] for r in reported] == [30.0, 25.0, 27.0]
    assert reported[1]['snapshot_pkl'].endswith('snap1.pkl')


def test_unavailable_detector_costs_the_metrics_once(tmp_path, monkeypatch):
    lines, calls, metrics = [], [], ['fid50k_full', 'is50k']

    def unavailable(metric, **kwargs):
        calls.append(metric)
        raise detectors.DetectorUnavailableError('cannot fetch the Inception detector')
    monkeypatch.setattr(metric_main, 'calc_metric', unavailable)
    evaluator = MetricEvaluator(metrics, {}, {}, str(tmp_path), num_gpus=1, rank=0, device=torch.device('cpu'),
                                log=lines.append)
    assert evaluator.evaluate(None, 'a.pkl') == ({}, {})
    assert evaluator.evaluate(None, 'b.pkl') == ({}, {})
    assert calls == ['fid50k_full'] and lines == ['Warning: cannot fetch the Inception detector; training continues without metrics']
    assert metrics == ['fid50k_full', 'is50k']  # The caller's list is left alone.


def test_metrics_of_a_tf32_training_run_run_at_full_precision(tmp_path, monkeypatch, tiny_preset):
    """A --precision=tf32 run trains with TF32 on, and every detector call of its snapshot metrics sees it off."""
    import functools
    from tests.support.detector_spy import assert_full_precision, spy_on_detectors
    from tests.support.stand_ins import make_detector, write_dataset_zip
    from tests.support.tiny_runs import tiny_experiment
    from torch_utils import devices
    from training import training_loop
    from training.step.updater import NetworkUpdater
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=10, max_real=8))
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    make_detector(str(tmp_path / 'detector.pt'))
    seen_by_steps = []
    run = NetworkUpdater.run
    monkeypatch.setattr(NetworkUpdater, 'run', lambda self, *a, **kw: (seen_by_steps.append(devices.read_switches()),
                                                                      run(self, *a, **kw))[1])
    seen_by_detectors = spy_on_detectors(monkeypatch)
    before = devices.read_switches()
    experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=2, batch=2, tick=0.002, snap=1, precision='tf32',
                                  metrics=('fid50k_full', 'is50k'), detector=str(tmp_path / 'detector.pt'))
    (tmp_path / 'run').mkdir()
    training_loop.training_loop(experiment, run_dir=str(tmp_path / 'run'))
    assert seen_by_steps and all(s['matmul_tf32'] and s['cudnn_tf32'] for s in seen_by_steps)
    assert len(seen_by_detectors) >= 2 * 2  # Two snapshots, two metrics.
    assert_full_precision(seen_by_detectors)
    assert devices.read_switches() == before
