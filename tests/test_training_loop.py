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


def _quickstart_options(data: str, steps: int, batch: int, **overrides) -> dict:
    """training_loop kwargs of a width-2 quickstart run on `data`."""
    from training import configs
    cfg = configs.get_config('quickstart')
    cfg.G_kwargs.ch = cfg.D_kwargs.ch = 2
    cfg.resolution = None  # The CNN takes any resolution; the tests use tiny images.
    from training.dataset import ImageFolderDataset
    dataset = ImageFolderDataset(path=data)
    opts = configs.training_options(cfg, resolution=dataset.resolution, channels=dataset.num_channels, label_dim=0,
                                    batch=batch, steps=steps)
    opts.update(training_set_kwargs=dict(class_name='training.dataset.ImageFolderDataset', path=data), num_workers=0)
    opts.update(overrides)
    return opts


def _run_with_metrics(tmp_path, monkeypatch, detector_url):
    import functools
    from metrics import metric_main
    from tests.test_metric_main import write_dataset_zip
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    # The protocol's 50k images would take hours on a CPU; the wiring is the same with 8.
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=8, max_real=8))
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    training_loop.training_loop(**_quickstart_options(
        str(tmp_path / 'data.zip'), steps=4, batch=2, run_dir=str(run_dir), kimg_per_tick=0.002,
        image_snapshot_ticks=None, network_snapshot_ticks=1, metrics=['fid50k_full'], best_metric='fid50k_full',
        metric_kwargs=dict(detector_url=detector_url)))
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
    assert best.progress.best == pytest.approx(min(fids))
    assert best.progress.step == 1 + int(np.argmin(fids))
    # Every snapshot records the best FID including its own (metrics run before the snapshot is written).
    for i, name in enumerate(sorted(f for f in os.listdir(run_dir) if f.startswith('network-snapshot-'))):
        assert persistence.load_snapshot(str(run_dir / name)).progress.best == pytest.approx(min(fids[:i + 1]))


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
    reals = training_loop.grid_reals(Digits(), labels, np.random.default_rng(0))
    shown = reals[:, 0, 0, 0].astype(int)
    assert list(shown[:6] % 3) == [0, 0, 1, 1, 2, 2]  # Rows of a class show images of that class.
    assert all(0 <= i < 30 for i in shown[6:])  # An empty class falls back to any image.
    assert len(set(shown[:6])) > 3  # Random images, not the first of each class.

#----------------------------------------------------------------------------
# Gradient accumulation over rounds equals one full batch.


def _networks(arch: str):
    from training import configs
    torch.manual_seed(0)
    if arch == 'stylegan':
        cfg = configs.get_config('gn-stylegan')
        opts = configs.training_options(cfg, resolution=16, channels=3, label_dim=0, cmax=8)
    else:
        cfg = configs.get_config('cifar10-resnet')
        cfg.G_kwargs.ch = cfg.D_kwargs.ch = 4
        opts = configs.training_options(cfg, resolution=32, channels=3, label_dim=0)
    import dnnlib
    dtype = torch.float32 if arch == 'stylegan' else torch.float64  # StyleGAN computes in float32 internally.
    G = dnnlib.util.construct_class_by_name(**opts.G_kwargs).to(dtype)
    D = dnnlib.util.construct_class_by_name(**opts.D_kwargs).to(dtype)
    if arch == 'stylegan':
        G.set_lod(0.5)  # Mid fade-in: both the new and the previous level take part.
        D.set_lod(0.5)
        G.style_mixing_prob = 0  # Random per call, like the noise below: not comparable between batchings.
    else:
        G.eval()  # BatchNorm statistics are per round by design (as per GPU); compare the rest exactly.
    return G, D, opts.schedule_kwargs.get('group_size', 1), dtype


@pytest.mark.parametrize('arch', ['resnet', 'stylegan'])
@pytest.mark.parametrize('phase', ['D', 'G'])
def test_accumulation_rounds_give_full_batch_gradients(arch, phase):
    from training.loss import GANLoss
    G, D, group, dtype = _networks(arch)
    n, rounds = 16, 4
    torch.manual_seed(1)
    res = 16 if arch == 'stylegan' else 32  # StyleGAN at lod 0.5 works at 16x16 (fading in over 8x8).
    real = torch.rand(n, 3, res, res, dtype=dtype) * 2 - 1
    z = torch.randn(n, G.z_dim, dtype=dtype)
    c = torch.zeros(n, 0, dtype=dtype)
    trained = D if phase == 'D' else G
    trained.requires_grad_(True)
    loss = GANLoss(G=G, D=D, loss='hinge', norm='gn')

    def grads(batches):
        for p in trained.parameters():
            p.grad = None
        for batch, gain in batches:
            loss.accumulate_gradients(phase, *batch, gain=gain)
        # StyleGAN's per-pixel noise is drawn per call, so its strengths' gradients differ between a
        # full batch and rounds by construction; every other parameter must agree.
        # Layers of inactive levels get no gradient in either computation.
        return {name: p.grad.clone() for name, p in trained.named_parameters()
                if 'noise_strength' not in name and p.grad is not None}

    full = grads([((real, c, z, c), 1.0)])
    split = grads([(tuple(training_loop.split_round(x, r, rounds, group) for x in (real, c, z, c)), 1 / rounds)
                   for r in range(rounds)])
    assert full.keys() == split.keys() and len(full) > 4
    # Per tensor, the error relative to the tensor's own gradient, with a floor relative to the whole
    # gradient: StyleGAN's first layer instance-normalizes the learned constant (near zero variance at
    # init), so its constant's gradient is huge and its bias's is pure cancellation, both ill-conditioned
    # in float32. A wrong gain or a round that splits stddev groups errs by 10-300% everywhere.
    rel = 1e-5 if dtype == torch.float32 else 1e-10
    total = torch.cat([g.flatten() for g in full.values()]).norm()
    for name in full:
        error = (split[name] - full[name]).norm()
        assert error <= rel * full[name].norm() + rel / 10 * total, (name, float(error), float(full[name].norm()))


def test_split_round_keeps_minibatch_stddev_groups():
    # Batch of 8 in groups of 4: groups are {i, i + 2}: (0, 2, 4, 6) and (1, 3, 5, 7).
    x = torch.arange(8)
    rounds = [training_loop.split_round(x, r, 2, group_size=4).tolist() for r in range(2)]
    assert rounds == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [training_loop.split_round(x, r, 4).tolist() for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]

#----------------------------------------------------------------------------
# Adam reset at phase changes, divergence, exact resume.


def test_adam_state_is_reset_exactly_at_phase_changes(tmp_path):
    from training import configs, progressive
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')
    cfg = configs.get_config('gn-stylegan')
    opts = configs.training_options(cfg, resolution=32, channels=1, label_dim=0, cmax=4, batch=4, kimg=0.1, lod_kimg=0.02)
    counts = {}  # The highest Adam step count among each optimizer's parameters, after every step.

    def record(optimizer, args, kwargs):
        counts.setdefault(id(optimizer), []).append(max(int(s['step']) for s in optimizer.state.values()))
    from torch.optim.optimizer import register_optimizer_step_post_hook
    handle = register_optimizer_step_post_hook(record)
    try:
        opts.update(training_set_kwargs=dict(class_name='training.dataset.ImageFolderDataset', path=data),
                    num_workers=0, run_dir=str(tmp_path), image_snapshot_ticks=None, network_snapshot_ticks=None,
                    kimg_per_tick=1)
        training_loop.training_loop(**opts)
    finally:
        handle.remove()
    # 4 images per step; phases of 20 images: lod changes floor/ceil after images 20 (fade starts), 40, 60, 80.
    lods = [progressive.lod_at(4 * i, 32, phase_kimg=0.02, fade_kimg=0.02) for i in range(25)]
    expected, count = [], 0
    for i, lod in enumerate(lods):
        changed = i > 0 and (np.floor(lod), np.ceil(lod)) != (np.floor(lods[i - 1]), np.ceil(lods[i - 1]))
        count = 1 if changed else count + 1
        expected.append(count)
    assert list(counts.values()) == [expected, expected]  # G and D alike.
    assert expected.count(1) == 5  # The start and four resets.


def test_nonfinite_gradient_stops_the_run_naming_step_and_network(tmp_path, monkeypatch):
    from tests.test_metric_main import write_dataset_zip
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    calls = []
    next_batch = training_loop.RealImageStream.next

    def poisoned_next(self, batch):  # One NaN pixel in the reals of the 4th D step (G step 4, counted from 1).
        img, c = next_batch(self, batch)
        calls.append(1)
        if len(calls) == 4:
            img = img.clone()
            img[0, 0, 0, 0] = float('nan')
        return img, c
    monkeypatch.setattr(training_loop.RealImageStream, 'next', poisoned_next)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    with pytest.raises(training_loop.TrainingDiverged, match=r'G step 4: non-finite gradient of D \(loss terms: .*Loss/D/real'):
        training_loop.training_loop(**_quickstart_options(str(tmp_path / 'data.zip'), steps=8, batch=2,
                                                          run_dir=str(run_dir), kimg_per_tick=0.004,
                                                          network_snapshot_ticks=1, image_snapshot_ticks=None))
    names = sorted(f for f in os.listdir(run_dir) if f.startswith('network-snapshot-'))
    assert names == ['network-snapshot-000000.004.pkl']  # Written at step 2; the tick after the NaN wrote nothing.
    from torch_utils import persistence
    snap = persistence.load_snapshot(str(run_dir / names[0]))
    assert all(torch.isfinite(p).all() for p in snap.D.parameters())


def test_resume_continues_bit_for_bit(tmp_path):
    """8 G steps in one go, and the same run stopped after step 4 and resumed: same weights and losses."""
    import json
    from tests.test_metric_main import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)

    def run(name, **kw):
        run_dir = tmp_path / name
        run_dir.mkdir()
        training_loop.training_loop(**_quickstart_options(str(tmp_path / 'data.zip'), steps=8, batch=2,
                                                          run_dir=str(run_dir), kimg_per_tick=0.004,
                                                          network_snapshot_ticks=1, image_snapshot_ticks=None, **kw))
        losses = [(s['Loss/D/loss']['mean'], s['Loss/G/loss']['mean']) for s in map(json.loads, open(run_dir / 'stats.jsonl'))]
        return run_dir, losses

    full_dir, full_losses = run('full')
    stale = full_dir / '.network-snapshot-000000.012.pkl.4194305.0123abcd.tmp'  # A writer killed mid-write (no such pid).
    stale.write_bytes(b'partial')
    _, resumed_losses = run('resumed', resume_pkl=str(full_dir / 'network-snapshot-000000.008.pkl'))
    assert not stale.exists()  # Resuming cleans up after the interrupted run.
    assert resumed_losses == full_losses[2:]  # Ticks of 2 steps: the resumed run starts at the third.
    a = persistence.load_snapshot(str(full_dir / 'network-snapshot-000000.016.pkl'))
    b = persistence.load_snapshot(str(tmp_path / 'resumed' / 'network-snapshot-000000.016.pkl'))
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(a[name].state_dict().items(), b[name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'


def test_fp16_run_with_loss_scaling(tmp_path):
    """fp16 through the loop: GradScaler's scale goes in as the gain, is unscaled before Adam, and the
    scaled gradients' overflows (which only skip a step) are not taken for divergence."""
    from tests.test_metric_main import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    opts = _quickstart_options(str(tmp_path / 'data.zip'), steps=3, batch=2, run_dir=str(tmp_path),
                               kimg_per_tick=1, image_snapshot_ticks=None)
    opts.loss_kwargs.precision = 'fp16'
    training_loop.training_loop(**opts)
    snap = persistence.load_snapshot(str(tmp_path / 'network-snapshot-000000.006.pkl'))
    # The first steps of a GradScaler (scale 65536) overflow and are skipped; Adam's state then holds
    # fewer than 3 steps, and every weight is finite.
    assert all(torch.isfinite(p).all() for net in (snap.G, snap.D) for p in net.parameters())
    assert snap.progress.step == 3


def test_loop_rounds_average_to_the_one_round_gradient(tmp_path):
    """Through the loop itself: the first D step's gradient with --batch-gpu=4 (2 rounds of 4) equals the
    one-round gradient of the same 8 reals and latents (StyleGAN: no BatchNorm; mixing off, noise strengths 0)."""
    from training import configs
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')
    grads = []
    for batch_gpu in (None, 4):
        opts = configs.training_options(configs.get_config('gn-stylegan'), resolution=32, channels=1, label_dim=0,
                                        cmax=4, batch=8, batch_gpu=batch_gpu, kimg=0.008, lod_kimg=1)
        opts.G_kwargs.style_mixing_prob = 0
        opts.update(training_set_kwargs=dict(class_name='training.dataset.ImageFolderDataset', path=data),
                    num_workers=0, run_dir=str(tmp_path), image_snapshot_ticks=None, network_snapshot_ticks=None)
        seen = []

        def record(optimizer, args, kwargs):
            if not seen:  # The first optimizer step of the run is D's.
                seen.append([p.grad.clone() for p in optimizer.param_groups[0]['params'] if p.grad is not None])
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        handle = register_optimizer_step_pre_hook(record)
        try:
            training_loop.training_loop(**opts)
        finally:
            handle.remove()
        grads.append(seen[0])
    assert len(grads[0]) == len(grads[1]) > 2
    for one, two in zip(*grads):
        torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-6 * one.abs().max().item())
