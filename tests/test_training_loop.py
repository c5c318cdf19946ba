"""training/training_loop.py end to end: metrics and the best snapshot, Adam resets, divergence, exact resume,
fp16, and accumulation rounds through the loop itself."""

import os

import numpy as np
import pytest
import torch

from tests.support.tiny_runs import tiny_experiment
from training import training_loop
from training.data.data_stream import RealImageStream
from training.experiment import Experiment
from training.run.reporter import TrainingDiverged

pytestmark = pytest.mark.usefixtures('tiny_preset')  # --cfg=tiny (tests/support/tiny_runs.py)

#----------------------------------------------------------------------------
# Metrics during training, with the tiny TorchScript detector of the metric tests.


def _stylegan_experiment(**options) -> Experiment:
    """gn-stylegan, 4 feature maps, on the digits."""
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')
    return Experiment.build(cfg='gn-stylegan', data=data, img_resolution=32, img_channels=1, cmax=4, **options)


def _run_with_metrics(tmp_path, monkeypatch, detector_url):
    import functools
    from metrics import metric_main
    from tests.support.stand_ins import write_dataset_zip
    monkeypatch.setenv('GNGAN_CACHE_DIR', str(tmp_path / 'cache'))
    # The protocol's 50k images would take hours on a CPU; the wiring is the same with 8.
    monkeypatch.setattr(metric_main, 'calc_metric', functools.partial(metric_main.calc_metric, num_gen=8, max_real=8))
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    training_loop.training_loop(tiny_experiment(
        str(tmp_path / 'data.zip'), steps=4, batch=2, tick=0.002, snap=1, metrics=('fid50k_full',),
        best_metric='fid50k_full', detector=detector_url), run_dir=str(run_dir))
    return run_dir


def test_metrics_at_every_snapshot_and_best_snapshot_kept(tmp_path, monkeypatch):
    import json
    from tests.support.stand_ins import make_detector
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


#----------------------------------------------------------------------------
# Adam reset at phase changes, divergence, exact resume.


def test_adam_state_is_reset_exactly_at_phase_changes(tmp_path):
    from training.recipes import progressive
    experiment = _stylegan_experiment(batch=4, kimg=0.1, lod_kimg=0.02, snap=None, tick=1)
    counts = {}  # The highest Adam step count among each optimizer's parameters, after every step.

    def record(optimizer, args, kwargs):
        counts.setdefault(id(optimizer), []).append(max(int(s['step']) for s in optimizer.state.values()))
    from torch.optim.optimizer import register_optimizer_step_post_hook
    handle = register_optimizer_step_post_hook(record)
    try:
        training_loop.training_loop(experiment, run_dir=str(tmp_path))
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
    from tests.support.stand_ins import write_dataset_zip
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    calls = []
    next_batch = RealImageStream.next

    def poisoned_next(self, batch, lod=None):  # One NaN pixel in the reals of the 4th D step (G step 4, counted from 1).
        img, c = next_batch(self, batch, lod)
        calls.append(1)
        if len(calls) == 4:
            img = img.clone()
            img[0, 0, 0, 0] = float('nan')
        return img, c
    monkeypatch.setattr(RealImageStream, 'next', poisoned_next)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    with pytest.raises(TrainingDiverged, match=r'G step 4: non-finite gradient of D \(loss terms: .*Loss/D/real'):
        training_loop.training_loop(tiny_experiment(str(tmp_path / 'data.zip'), steps=8, batch=2, tick=0.004, snap=1),
                                    run_dir=str(run_dir))
    names = sorted(f for f in os.listdir(run_dir) if f.startswith('network-snapshot-'))
    assert names == ['network-snapshot-000000.004.pkl']  # Written at step 2; the tick after the NaN wrote nothing.
    from torch_utils import persistence
    snap = persistence.load_snapshot(str(run_dir / names[0]))
    assert all(torch.isfinite(p).all() for p in snap.D.parameters())


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def test_resume_continues_bit_for_bit(tmp_path, device):
    """8 G steps in one go, and the same run stopped after step 4 and resumed: same weights and losses (on a GPU with
    the deterministic switch)."""
    import json
    from tests.support.stand_ins import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)

    def run(name, **kw):
        run_dir = tmp_path / name
        run_dir.mkdir()
        experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=8, batch=2, tick=0.004, snap=1, device=device,
                                      deterministic=True)
        training_loop.training_loop(experiment, run_dir=str(run_dir), device=device, **kw)
        losses = [(s['Loss/D/loss']['mean'], s['Loss/G/loss']['mean']) for s in map(json.loads, open(run_dir / 'stats.jsonl'))]
        return run_dir, losses

    full_dir, full_losses = run('full')
    _, resumed_losses = run('resumed', resume=persistence.load_snapshot(str(full_dir / 'network-snapshot-000000.008.pkl')))
    assert resumed_losses == full_losses[2:]  # Ticks of 2 steps: the resumed run starts at the third.
    a = persistence.load_snapshot(str(full_dir / 'network-snapshot-000000.016.pkl'))
    b = persistence.load_snapshot(str(tmp_path / 'resumed' / 'network-snapshot-000000.016.pkl'))
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(a[name].state_dict().items(), b[name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'


def test_ada_resume_continues_p_bit_for_bit(tmp_path):
    """--aug=ada: 8 G steps in one go, and the same run stopped after step 6 (2 D steps into ADA's interval of 4) and
    resumed: the same p, statistic and weights."""
    from tests.support.stand_ins import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)

    def run(name, **kw):
        (tmp_path / name).mkdir()
        experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=8, batch=2, tick=0.004, snap=1, aug='ada',
                                      p=0.5, ada_kimg=0.1)  # p moves by 8 reals / 100 = 0.08 every 4 D steps.
        training_loop.training_loop(experiment, run_dir=str(tmp_path / name), **kw)
        return persistence.load_snapshot(str(tmp_path / name / 'network-snapshot-000000.016.pkl'))

    full = run('full')
    stopped = persistence.load_snapshot(str(tmp_path / 'full' / 'network-snapshot-000000.012.pkl'))
    assert stopped.loss_states[0]['ada_count'].item() == 4 and stopped.loss_states[0]['ada_steps'].item() == 2
    resumed = run('resumed', resume=stopped)
    assert full.loss_states[0]['augment_p'].item() != np.float32(0.5)  # p moved.
    for key in full.loss_states[0]:
        assert torch.equal(full.loss_states[0][key], resumed.loss_states[0][key]), key
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(full[name].state_dict().items(), resumed[name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'


def test_stylegan2_resume_continues_bit_for_bit(tmp_path):
    """gn-stylegan2 with path length regularization (at every 4th G step) and style mixing: 6 G steps in one go, and
    the same run stopped after step 3 and resumed (the path length average goes on from the snapshot)."""
    from tests.support.stand_ins import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=12, resolution=8)

    def run(name, **kw):
        (tmp_path / name).mkdir()
        experiment = Experiment.build(cfg='gn-stylegan2', data=str(tmp_path / 'data.zip'), img_resolution=8,
                                      img_channels=3, cmax=4, map_dim=8, batch=4, kimg=0.024, tick=0.012, snap=1,
                                      pl_weight=2)
        training_loop.training_loop(experiment, run_dir=str(tmp_path / name), **kw)
        return persistence.load_snapshot(str(tmp_path / name / 'network-snapshot-000000.024.pkl'))

    full = run('full')
    half = persistence.load_snapshot(str(tmp_path / 'full' / 'network-snapshot-000000.012.pkl'))
    assert half.loss_states[0]['pl_mean'].item() > 0  # Updated at G step 0; used again at step 4.
    resumed = run('resumed', resume=half)
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(full[name].state_dict().items(), resumed[name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'
    assert torch.equal(full.loss_states[0]['pl_mean'], resumed.loss_states[0]['pl_mean'])


def test_switches_hold_for_the_run_and_are_restored(tmp_path, monkeypatch, switches):
    """TF32 off for an fp32 run, deterministic algorithms on when asked, cuDNN benchmarking off on a CPU; as before
    once the run ends."""
    from tests.support.stand_ins import write_dataset_zip
    from torch_utils import devices
    from training.step.updater import NetworkUpdater
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    seen = []
    run = NetworkUpdater.run
    monkeypatch.setattr(NetworkUpdater, 'run', lambda self, *a, **kw: (seen.append(devices.read_switches()),
                                                                      run(self, *a, **kw))[1])
    switches(matmul_tf32=True, cudnn_tf32=True, cudnn_benchmark=True)
    before = devices.read_switches()
    experiment = tiny_experiment(str(tmp_path / 'data.zip'), steps=1, batch=2, tick=1, precision='fp32',
                                  deterministic=True)
    training_loop.training_loop(experiment, run_dir=str(tmp_path))
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0] == dict(before, matmul_tf32=False, cudnn_tf32=False, cudnn_benchmark=False, cudnn_deterministic=True,
                           deterministic=True, deterministic_warn_only=True)
    assert devices.read_switches() == before


def test_fp16_run_with_loss_scaling(tmp_path):
    """fp16 through the loop: GradScaler's scale goes in as the gain, is unscaled before Adam, and the
    scaled gradients' overflows (which only skip a step) are not taken for divergence."""
    from tests.support.stand_ins import write_dataset_zip
    from torch_utils import persistence
    write_dataset_zip(str(tmp_path / 'data.zip'), num_images=8, resolution=8)
    training_loop.training_loop(tiny_experiment(str(tmp_path / 'data.zip'), steps=3, batch=2, tick=1, precision='fp16'),
                                run_dir=str(tmp_path))
    snap = persistence.load_snapshot(str(tmp_path / 'network-snapshot-000000.006.pkl'))
    # The first steps of a GradScaler (scale 65536) overflow and are skipped; Adam's state then holds
    # fewer than 3 steps, and every weight is finite.
    assert all(torch.isfinite(p).all() for net in (snap.G, snap.D) for p in net.parameters())
    assert snap.progress.step == 3


def test_loop_rounds_average_to_the_one_round_gradient(tmp_path):
    """Through the loop itself: the first D step's gradient with --batch-gpu=4 (2 rounds of 4) equals the
    one-round gradient of the same 8 reals and latents (StyleGAN: no BatchNorm; mixing off, noise strengths 0)."""
    grads = []
    for batch_gpu in (None, 4):
        experiment = _stylegan_experiment(batch=8, batch_gpu=batch_gpu, kimg=0.008, lod_kimg=1, style_mixing=0, snap=None)
        seen = []

        def record(optimizer, args, kwargs):
            if not seen:  # The first optimizer step of the run is D's.
                seen.append([p.grad.clone() for p in optimizer.param_groups[0]['params'] if p.grad is not None])
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        handle = register_optimizer_step_pre_hook(record)
        try:
            training_loop.training_loop(experiment, run_dir=str(tmp_path))
        finally:
            handle.remove()
        grads.append(seen[0])
    assert len(grads[0]) == len(grads[1]) > 2
    for one, two in zip(*grads):
        torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-6 * one.abs().max().item())
