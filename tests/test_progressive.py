"""Tests for training/progressive.py: the StyleGAN v1 schedule and the processing of reals.

Expected values are worked out by hand from the schedule's definition (600 kimg stable + 600 kimg
fade-in per resolution, starting at 8x8) and, for the reals, with numpy box averages.
"""

import numpy as np
import pytest
import torch

from training import progressive

#----------------------------------------------------------------------------
# Schedule at chosen points of a 1024x1024 run. Columns: kimg, lod, resolution, batch per GPU, lr, fading.
# kimg 0-600: 8x8 stable (lod 7); 600-1200: 16x16 fading in (lod 7 -> 6); 1200-1800: 16x16 stable; ...
# Each stable+fade pair takes 1200 kimg, so 1024x1024 (lod 0) is reached at 7 * 1200 = 8400 kimg.

FULL_RUN = [
    (0,     7.0,  8,    128, 1e-3,   False),
    (599,   7.0,  8,    128, 1e-3,   False),
    (900,   6.5,  16,   128, 1e-3,   True),   # halfway through the 16x16 fade-in: 7 - 300/600.
    (1050,  6.25, 16,   128, 1e-3,   True),
    (1200,  6.0,  16,   128, 1e-3,   False),
    (2550,  5.0,  32,   64,  1e-3,   False),  # phase 2 (2400-3600): 32x32 stable until 3000...
    (3150,  4.75, 64,   32,  1e-3,   True),   # ...then 150 kimg into the 64x64 fade-in: 7 - 2 - 150/600.
    (4200,  4.0,  64,   32,  1e-3,   False),  # phase 3 (3600-4800), end of the stable part.
    (4500,  3.5,  128,  16,  1.5e-3, True),
    (6000,  2.0,  256,  8,   1.5e-3, False),  # phase 5 starts.
    (7500,  1.0,  512,  4,   1.5e-3, False),
    (7950,  0.75, 1024, 4,   1.5e-3, True),   # phase 6 (7200-8400): 7 - 6 - 150/600.
    (8400,  0.0,  1024, 4,   1.5e-3, False),
    (25000, 0.0,  1024, 4,   1.5e-3, False),
]


@pytest.mark.parametrize('kimg, lod, resolution, batch, lr, fading', FULL_RUN)
def test_schedule_full_run(kimg, lod, resolution, batch, lr, fading):
    s = progressive.schedule(kimg * 1000, max_resolution=1024)
    assert s.lod == pytest.approx(lod, abs=1e-12)
    assert s.resolution == resolution
    assert s.batch_per_gpu == batch and s.batch == batch
    assert s.lr == lr
    assert s.fading == fading
    assert s.alpha == pytest.approx(1 - (lod - np.floor(lod)), abs=1e-12)
    assert s.ema_beta == pytest.approx(np.exp(np.log(0.5) * batch / 10000), rel=1e-12)


def test_schedule_scales_batch_with_gpus():
    s = progressive.schedule(0, max_resolution=1024, num_gpus=8)
    assert s.batch_per_gpu == 128 and s.batch == 1024
    # A half-life of 10k images: 10000 / 1024 steps of beta multiply to one half.
    assert s.ema_beta ** (10000 / 1024) == pytest.approx(0.5, rel=1e-12)


def test_schedule_capped_resolution():
    # A 256x256 run has lod 5 at the start (256 / 2**5 = 8) and reaches 256 after 5 * 1200 kimg.
    assert progressive.schedule(0, max_resolution=256).lod == 5.0
    assert progressive.schedule(5 * 1200 * 1000 - 300_000, max_resolution=256).lod == pytest.approx(0.5)
    end = progressive.schedule(6000 * 1000, max_resolution=256)
    assert (end.lod, end.resolution, end.batch, end.lr) == (0.0, 256, 8, 1.5e-3)


def test_schedule_shortened():
    # 2 kimg stable + 1 kimg fade-in, from 4x4 up to 16x16.
    kw = dict(max_resolution=16, start_resolution=4, phase_kimg=2, fade_kimg=1,
              batch_per_gpu={4: 8, 8: 4, 16: 2}, lr={4: 1.0, 8: 2.0, 16: 3.0})
    points = [(0, 2.0, 4, 8), (1999, 2.0, 4, 8), (2250, 1.75, 8, 4), (3000, 1.0, 8, 4),
              (5500, 0.5, 16, 2), (6000, 0.0, 16, 2), (60000, 0.0, 16, 2)]
    for nimg, lod, resolution, batch in points:
        s = progressive.schedule(nimg, **kw)
        assert (s.lod, s.resolution, s.batch) == (pytest.approx(lod), resolution, batch), nimg
        assert s.lr == kw['lr'][resolution]
    assert progressive.schedule(1000, **kw, ema_kimg=0.004).ema_beta == pytest.approx(0.5 ** 2)


def test_min_batch_and_string_keys():
    assert progressive.min_batch(dict(max_resolution=1024), num_gpus=1) == 4
    assert progressive.min_batch(dict(max_resolution=64), num_gpus=2) == 32  # 8..64 use 128, 128, 64, 32 per GPU.
    kw = dict(max_resolution=16, start_resolution=4, phase_kimg=0.5, fade_kimg=0.25,
              batch_per_gpu={'4': 6, '8': 3, '16': 5}, lr={'4': 1.0, '8': 1.0, '16': 1.0})  # As after a JSON round trip.
    assert progressive.min_batch(kw, num_gpus=1) == 3
    assert progressive.schedule(1600, **kw).batch == 5  # 1.6 kimg: phase 2 (1.5-2.25), stable at 16x16.


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError):
        progressive.schedule(0, max_resolution=1000)
    with pytest.raises(ValueError):
        progressive.schedule(0, max_resolution=64, start_resolution=128)
    with pytest.raises(ValueError):  # No batch size for 2048.
        progressive.schedule(0, max_resolution=2048, start_resolution=2048)

#----------------------------------------------------------------------------
# Reals.


def _box_down(x: np.ndarray, factor: int) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // factor, factor, w // factor, factor).mean(axis=(3, 5))


def test_process_reals_stable_level():
    rng = np.random.default_rng(0)
    x = rng.standard_normal([2, 3, 32, 32])
    out = progressive.process_reals(torch.tensor(x), lod=2.0, max_resolution=32)
    assert out.shape == (2, 3, 8, 8)
    # Directly at the loop level: mean over each 4x4 block, written out element by element.
    expected = np.empty([2, 3, 8, 8])
    for i in range(8):
        for j in range(8):
            expected[:, :, i, j] = x[:, :, 4 * i:4 * i + 4, 4 * j:4 * j + 4].mean(axis=(2, 3))
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)


def test_process_reals_fade_blend():
    rng = np.random.default_rng(1)
    x = rng.standard_normal([2, 3, 64, 64])
    lod = 1.25  # Active resolution 64 / 2 = 32, a quarter of the way from the 32x32 level towards 16x16.
    out = progressive.process_reals(torch.tensor(x), lod=lod, max_resolution=64)
    x32 = _box_down(x, 2)
    x16_up = np.kron(_box_down(x32, 2), np.ones([1, 1, 2, 2]))
    expected = 0.75 * x32 + 0.25 * x16_up
    assert out.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)


def test_process_reals_capped_run_and_errors():
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    # Dataset at 64 but the run capped at 32: lod 0 means 32x32.
    np.testing.assert_allclose(progressive.process_reals(x, 0.0, 32).numpy(), _box_down(x.numpy(), 2), atol=1e-12)
    with pytest.raises(ValueError):
        progressive.process_reals(x, 0.0, 128)  # Reals smaller than the active resolution.
    with pytest.raises(ValueError):
        progressive.process_reals(x, 5.0, 64)  # lod beyond 4x4.
