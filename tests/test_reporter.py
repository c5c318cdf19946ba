"""training/run/reporter.py: image grids, the progress line, statistics files and the divergence stop."""

import json
import time

import numpy as np
import pytest
import torch

from torch_utils import training_stats
from training.recipes import schedule as schedule_lib
from training.run.reporter import TickReporter, TrainingDiverged, grid_layout, grid_reals
from training.experiment import Experiment
from training.run.run_state import RunState, snapshot_label
from training.step.updater import NetworkUpdater


def test_grid_layout_one_row_per_class():
    class Labeled:
        resolution, label_dim = 32, 10
    (gw, gh), labels = grid_layout(Labeled(), max_images=64)
    assert (gw, gh) == (16, 10) and labels.shape == (160, 10)
    assert np.array_equal(labels.argmax(1).reshape(gh, gw), np.repeat(np.arange(10)[:, None], gw, axis=1))
    Labeled.label_dim = 0
    (gw, gh), labels = grid_layout(Labeled(), max_images=64)
    assert (gw, gh) == (16, 4) and labels.shape == (64, 0)


def test_grid_reals_show_the_class_of_their_row():
    class Digits:  # Image i is filled with the value i; its class is i % 3 (class 3 has no images).
        label_dim = 4

        def __len__(self):
            return 30

        def get_label(self, i):
            return np.eye(4, dtype=np.float32)[i % 3]

        def __getitem__(self, i):
            return np.full([1, 2, 2], i, dtype=np.uint8), self.get_label(i)

    labels = np.eye(4, dtype=np.float32)[[0, 0, 1, 1, 2, 2, 3, 3]]
    reals = grid_reals(Digits(), labels, np.random.default_rng(0))
    shown = reals[:, 0, 0, 0].astype(int)
    assert list(shown[:6] % 3) == [0, 0, 1, 1, 2, 2]  # Rows of a class show images of that class.
    assert all(0 <= i < 30 for i in shown[6:])  # An empty class falls back to any image.
    assert len(set(shown[:6])) > 3  # Random images, not the first of each class.

#----------------------------------------------------------------------------


def _reporter(tmp_path, schedule, lines):
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'))
    reporter = TickReporter(str(tmp_path), schedule, state, kimg_per_tick=0.1, start_time=time.time(),
                            device=torch.device('cpu'), log=lines.append)
    return reporter, state


def _updaters():
    nets = [torch.nn.Linear(2, 1) for _ in 'DG']
    return [NetworkUpdater(name, net, torch.optim.SGD(net.parameters(), lr=0.1), torch.amp.GradScaler('cpu', enabled=False))
            for name, net in zip('DG', nets)]


def test_progress_line_pairs_the_lod_with_its_phase(tmp_path):
    schedule = schedule_lib.ProgressiveSchedule(max_resolution=32, phase_kimg=1, fade_kimg=1, total_kimg=5)
    lines = []
    reporter, state = _reporter(tmp_path, schedule, lines)
    for cur_nimg, phase, lod in [(1000, 'fade-in 16x16 0%', 2.0), (1500, 'fade-in 16x16 50%', 1.5),
                                 (2000, 'stable 16x16 0%', 1.0)]:
        state.cur_nimg = cur_nimg
        reporter.tick(_updaters(), state, done=False)
        assert f'phase {phase:<18s} lod {lod:<5.2f}' in lines[-1]


def test_the_last_progress_line_gives_the_kimg_of_the_last_snapshot(tmp_path):
    """gn-stylegan2 --kimg=1 at batch 32 on 32x32 data: round(1000 / 32) = 31 G steps, 992 images. The dry run's
    schedule, the progress line and the snapshot name all say 0.992 kimg (not 1.0)."""
    e = Experiment.build(cfg='gn-stylegan2', img_resolution=32, img_channels=1, kimg=1)
    assert (e.steps, e.batch) == (31, 32)
    assert e.schedule.describe()[0] == '31 G steps, each after 1 D step(s): 0.992 kimg of reals'
    paper = Experiment.build(cfg='cifar10-resnet', img_resolution=32, img_channels=3)  # 200k G steps x 5 D steps x 64.
    assert paper.schedule.describe()[0] == '200,000 G steps, each after 5 D step(s): 64,000 kimg of reals'
    lines = []
    reporter, state = _reporter(tmp_path, e.schedule, lines)
    for step, cur_nimg, label, kimg in [(31, 992, '000000.992', '0.992'), (2000, 64_000, '000064', '64.000'),
                                        (2004, 64_128, '000064.128', '64.128')]:
        state.step, state.cur_nimg = step, cur_nimg
        reporter.tick(_updaters(), state, done=True)
        assert snapshot_label(cur_nimg) == label and float(label) == float(kimg)
        assert lines[-1].split()[4:6] == ['kimg', kimg], lines[-1]


def test_statistics_go_to_stats_jsonl(tmp_path):
    schedule = schedule_lib.FixedSchedule(batch_D=4, batch_G=8, n_dis=1, lr_G=1e-3, lr_D=1e-3, total_steps=10)
    lines = []
    reporter, state = _reporter(tmp_path, schedule, lines)
    training_stats.report('Loss/D/loss', torch.tensor([1.0, 3.0]))
    state.step, state.cur_nimg = 4, 16
    stats = reporter.tick(_updaters(), state, done=False)
    assert 'step 4 ' in lines[-1] and 'done  40.0%' in lines[-1] and 'loss_D 2.000' in lines[-1]
    reporter.end_tick(stats, state, chart=True)
    reporter.close()
    entry = json.loads(open(tmp_path / 'stats.jsonl').read())
    # Moments are running float64 sums since the process started (other tests report this name too), the tick's
    # share their difference: exact up to float64 rounding of those sums.
    assert entry['Loss/D/loss'] == dict(num=2, mean=pytest.approx(2.0, rel=1e-12), std=pytest.approx(1.0, rel=1e-12))
    assert entry['Progress/step']['mean'] == 4 and entry['Progress/kimg']['mean'] == 0.016
    assert (tmp_path / 'progress.png').is_file()


def test_divergence_names_the_first_bad_step_and_network(tmp_path):
    schedule = schedule_lib.FixedSchedule(batch_D=4, batch_G=8, n_dis=1, lr_G=1e-3, lr_D=1e-3, total_steps=10)
    reporter, state = _reporter(tmp_path, schedule, [])
    updaters = _updaters()
    updaters[1].first_bad_step = torch.tensor(3)
    updaters[0].first_bad_step = torch.tensor(5)
    training_stats.report('Loss/G/loss', torch.tensor([float('nan')]))
    training_stats.report('Loss/D/real', torch.tensor([float('inf')]))
    with pytest.raises(TrainingDiverged, match=r'at G step 3: non-finite gradient of G \(loss terms: Loss/G/loss\); '
                                               r'the last snapshot .* resume from it'):
        reporter.tick(updaters, state, done=False)


def test_divergence_by_a_nonfinite_weight(tmp_path):
    schedule = schedule_lib.FixedSchedule(batch_D=4, batch_G=8, n_dis=1, lr_G=1e-3, lr_D=1e-3, total_steps=10)
    reporter, state = _reporter(tmp_path, schedule, [])
    updaters = _updaters()
    with torch.no_grad():
        updaters[0].module.bias.fill_(float('nan'))
    state.step = 6
    with pytest.raises(TrainingDiverged, match=r'between G steps 1 and 6: non-finite weight D.bias'):
        reporter.tick(updaters, state, done=False)
    reporter.tick(_updaters(), state, done=False)  # Finite networks and flags: no stop.


def test_progress_line_says_when_the_cpu_is_starved(tmp_path, monkeypatch):
    import os
    schedule = schedule_lib.FixedSchedule(batch_D=4, batch_G=8, n_dis=1, lr_G=1e-3, lr_D=1e-3, total_steps=10)
    lines = []
    reporter, state = _reporter(tmp_path, schedule, lines)
    monkeypatch.setattr(os, 'cpu_count', lambda: 2)
    for load, expected in [(2.4, None), (3.1, 'starved (load 3.1 on 2 cores)')]:
        monkeypatch.setattr(os, 'getloadavg', lambda load=load: (load, load, load))
        reporter.tick(_updaters(), state, done=False)
        assert ('starved' in lines[-1]) == (expected is not None) and (expected is None or expected in lines[-1])
