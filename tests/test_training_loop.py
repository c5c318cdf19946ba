"""training/training_loop.py helpers: data sharding, EMA, image grids, batch assembly."""

import itertools
import os

import numpy as np
import pytest
import torch

from training import training_loop


def test_infinite_sampler_shards_are_disjoint_and_cover_each_pass():
    size, replicas = 10, 2
    shards = [list(itertools.islice(iter(training_loop.InfiniteSampler(size, rank=r, num_replicas=replicas, seed=3)), 5))
              for r in range(replicas)]
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(size))  # One full pass over the data.


def test_update_ema_matches_formula():
    G, G_ema = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        G.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        G_ema.weight.copy_(torch.tensor([0.0, 0.0, 6.0]))
        G.running_mean.copy_(torch.tensor([5.0, 5.0, 5.0]))
    training_loop.update_ema(G_ema, G, beta=0.75)
    assert torch.allclose(G_ema.weight, torch.tensor([0.25, 0.5, 0.75 * 6 + 0.25 * 3]))
    assert torch.equal(G_ema.running_mean, G.running_mean)  # Buffers are copied, not averaged.


def test_random_xflip_flips_whole_images():
    torch.manual_seed(0)
    img = torch.arange(2 * 1 * 3 * 4, dtype=torch.float32).reshape(2, 1, 3, 4).repeat(50, 1, 1, 1)
    out = training_loop.random_xflip(img)
    flipped = (out == img.flip(3)).flatten(1).all(1)
    same = (out == img).flatten(1).all(1)
    assert torch.all(flipped | same) and 20 < flipped.sum() < 80


class _ToyDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, idx):
        return np.full([1, 2, 2], idx, dtype=np.uint8), np.zeros([0], dtype=np.float32)


def test_real_image_stream_assembles_any_batch_size():
    stream = training_loop.RealImageStream(_ToyDataset(), chunk=3, rank=0, num_replicas=1, seed=0,
                                           device=torch.device('cpu'), num_workers=0)
    seen = []
    for batch in (5, 2, 7):
        img, c = stream.next(batch)
        assert img.shape == (batch, 1, 2, 2) and c.shape == (batch, 0)
        assert img.min() >= -1 and img.max() <= 1
        seen += [int(round((v + 1) * 127.5)) for v in img[:, 0, 0, 0].tolist()]
    assert sorted(seen[:7]) == list(range(7)) and sorted(seen[7:]) == list(range(7))  # Two full passes.


#----------------------------------------------------------------------------
# Metrics during training, with the tiny TorchScript detector of the metric tests.


def _run_with_metrics(tmp_path, monkeypatch, detector_url):
    import functools
    from metrics import metric_main
    from tests.test_metric_main import write_dataset_zip
    from training import configs
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    # The protocol's 50k images would take hours on a CPU; the wiring is the same with 8.
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=8, max_real=8))
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    cfg = configs.get_config('quickstart')
    cfg.G_kwargs.ch = cfg.D_kwargs.ch = 2
    cfg.batch_D, cfg.batch_G, cfg.total_steps = 2, 4, 4
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    training_loop.training_loop(
        run_dir=str(run_dir), cfg=cfg, num_workers=0, kimg_per_tick=0.002, image_snapshot_ticks=None,
        network_snapshot_ticks=1, metrics=['fid50k_full'], detector_url=detector_url,
        training_set_kwargs=dict(class_name='training.dataset.ImageFolderDataset', path=str(tmp_path / 'data.zip')))
    return run_dir


def test_metrics_at_every_snapshot_and_best_snapshot_kept(tmp_path, monkeypatch):
    import json
    from tests.test_metric_main import make_detector
    from torch_utils import persistence
    make_detector(str(tmp_path / 'detector.pt'))
    run_dir = _run_with_metrics(tmp_path, monkeypatch, str(tmp_path / 'detector.pt'))
    lines = [json.loads(line) for line in open(run_dir / 'metric-fid50k_full.jsonl')]
    assert len(lines) == 4  # One evaluation per snapshot (a tick is one G step of 2 reals).
    fids = [line['results']['fid50k_full'] for line in lines]
    assert all(np.isfinite(fids))
    stats = [json.loads(line) for line in open(run_dir / 'stats.jsonl')]
    assert [entry['Metrics/fid50k_full']['mean'] for entry in stats] == pytest.approx(fids)
    best = persistence.load_snapshot(str(run_dir / 'network-best.pkl'))
    assert best.progress.best_fid == pytest.approx(min(fids))
    assert best.progress.step == 1 + int(np.argmin(fids))


def test_unavailable_detector_warns_and_training_continues(tmp_path, monkeypatch, capsys):
    run_dir = _run_with_metrics(tmp_path, monkeypatch, 'http://127.0.0.1:9/inception.pt')
    out = capsys.readouterr().out
    assert out.count('training continues without metrics') == 1
    assert len([f for f in os.listdir(run_dir) if f.startswith('network-snapshot-')]) >= 1
    assert 'Exiting...' in out


def test_real_image_streams_of_two_processes_see_different_images():
    streams = [training_loop.RealImageStream(_ToyDataset(), chunk=2, rank=r, num_replicas=2, seed=5,
                                             device=torch.device('cpu'), num_workers=0) for r in range(2)]
    seen = [{int(round((v + 1) * 127.5)) for v in s.next(3)[0][:, 0, 0, 0].tolist()} for s in streams]
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 6


def test_grid_layout_one_row_per_class():
    class Labeled:
        resolution, label_dim = 32, 10
    (gw, gh), labels = training_loop.grid_layout(Labeled(), max_images=64)
    assert (gw, gh) == (16, 10) and labels.shape == (160, 10)
    assert np.array_equal(labels.argmax(1).reshape(gh, gw), np.repeat(np.arange(10)[:, None], gw, axis=1))
    Labeled.label_dim = 0
    (gw, gh), labels = training_loop.grid_layout(Labeled(), max_images=64)
    assert (gw, gh) == (16, 4) and labels.shape == (64, 0)
