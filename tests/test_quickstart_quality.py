"""bench/quickstart_quality.py: what it feeds the digit classifier."""

import click
import numpy as np
import pytest
import torch

from bench import quickstart_quality
from torch_utils import persistence
from training.networks import stylegan


def test_growing_stylegan_snapshot_is_judged_at_32x32(tmp_path):
    """A progressive G snapshotted at lod 2 draws 8x8 images; each becomes 4x4 blocks of its own pixels."""
    torch.manual_seed(0)
    G = stylegan.Generator(c_dim=0, img_resolution=32, img_channels=1, z_dim=8, w_dim=8, fmap_base=32, fmap_max=8)
    G.eval().set_lod(2)  # (as loaded: eval mode, no style mixing)
    path = str(tmp_path / 'snapshot.pkl')
    persistence.save_snapshot(path, dict(G_ema=G))
    torch.manual_seed(1)  # the per-layer noise of both calls below
    images, classes = quickstart_quality.generate(path, num=5, seed=3)
    torch.manual_seed(1)
    z = torch.from_numpy(np.random.default_rng(3).standard_normal([5, 8])).float()
    with torch.no_grad():
        small = G(z, torch.zeros([5, 0]))
    assert classes is None and small.shape == (5, 1, 8, 8) and images.shape == (5, 1, 32, 32)
    for i in range(4):
        for j in range(4):
            torch.testing.assert_close(images[:, :, i::4, j::4], small, rtol=1e-5, atol=1e-6)


def test_generator_grown_to_16x16_is_judged_and_a_64x64_one_refused(tmp_path):
    """train.py --resolution=16 gives a G whose final images are 16x16: each becomes 2x2 blocks of its pixels.
    A G for another resolution than the digits' divisors is refused with one line."""
    torch.manual_seed(0)
    G = stylegan.Generator(c_dim=0, img_resolution=16, img_channels=1, z_dim=8, w_dim=8, fmap_base=32, fmap_max=8).eval()
    path = str(tmp_path / 'snapshot16.pkl')
    persistence.save_snapshot(path, dict(G_ema=G))
    torch.manual_seed(1)
    images, _ = quickstart_quality.generate(path, num=3, seed=5)
    torch.manual_seed(1)
    z = torch.from_numpy(np.random.default_rng(5).standard_normal([3, 8])).float()
    with torch.no_grad():
        small = G(z, torch.zeros([3, 0]))
    assert small.shape == (3, 1, 16, 16) and images.shape == (3, 1, 32, 32)
    for i in range(2):
        for j in range(2):
            torch.testing.assert_close(images[:, :, i::2, j::2], small, rtol=1e-5, atol=1e-6)

    big = stylegan.Generator(c_dim=0, img_resolution=64, img_channels=1, z_dim=8, w_dim=8, fmap_base=32, fmap_max=8)
    persistence.save_snapshot(str(tmp_path / 'snapshot64.pkl'), dict(G_ema=big))
    with pytest.raises(click.ClickException, match='holds no 8x8, 16x16 or 32x32 grayscale digit generator'):
        quickstart_quality.generate(str(tmp_path / 'snapshot64.pkl'), num=2, seed=0)


def test_classifier_and_features_at_full_precision_whatever_the_switches(tmp_path, monkeypatch, switches):
    """With TF32 allowed when the script starts, every classifier call (training and judging) sees it off; it is on
    again afterwards."""
    from click.testing import CliRunner
    from torch_utils import devices
    switches(matmul_tf32=True, cudnn_tf32=True)
    load = quickstart_quality.load_digits
    monkeypatch.setattr(quickstart_quality, 'load_digits', lambda path: tuple(t[:300] for t in load(path)))  # Faster.
    seen = []
    features = quickstart_quality.DigitClassifier.features
    monkeypatch.setattr(quickstart_quality.DigitClassifier, 'features',
                        lambda self, x: (seen.append(devices.read_switches()), features(self, x))[1])
    torch.manual_seed(0)
    G = stylegan.Generator(c_dim=0, img_resolution=16, img_channels=1, z_dim=8, w_dim=8, fmap_base=32, fmap_max=8).eval()
    path = str(tmp_path / 'snapshot.pkl')
    persistence.save_snapshot(path, dict(G_ema=G))
    before = devices.read_switches()
    result = CliRunner().invoke(quickstart_quality.main, [f'--network={path}', '--num=20', '--epochs=1', '--device=cpu'])
    assert result.exit_code == 0, result.output
    assert len(seen) >= 4 + 3 and all(not s['matmul_tf32'] and not s['cudnn_tf32'] for s in seen)  # 4 training batches, then judging.
    assert devices.read_switches() == before
