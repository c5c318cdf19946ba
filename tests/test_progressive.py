"""Tests for training/recipes/progressive.py: StyleGAN v1's lod formula and tables, and the processing of reals.

Expected values are worked out by hand from the schedule's definition (600 kimg stable + 600 kimg
fade-in per resolution, starting at 8x8) and, for the reals, with numpy box averages.
"""

import pytest

from training.recipes import progressive

#----------------------------------------------------------------------------
# lod at chosen points of a 1024x1024 run, worked out by hand (600 kimg stable + 600 kimg fade-in).
# kimg 0-600: 8x8 stable (lod 7); 600-1200: 16x16 fading in (lod 7 -> 6); 1200-1800: 16x16 stable; ...
# Each stable+fade pair takes 1200 kimg, so 1024x1024 (lod 0) is reached at 7 * 1200 = 8400 kimg.

LODS = [(0, 7.0), (599, 7.0), (900, 6.5), (1050, 6.25), (1200, 6.0), (2550, 5.0), (3150, 4.75), (4200, 4.0),
        (4500, 3.5), (6000, 2.0), (7500, 1.0), (7950, 0.75), (8400, 0.0), (25000, 0.0)]


@pytest.mark.parametrize('kimg, lod', LODS)
def test_lod_full_run(kimg, lod):
    assert progressive.lod_at(kimg * 1000, max_resolution=1024) == pytest.approx(lod, abs=1e-12)


def test_lod_capped_and_shortened():
    # A 256x256 run has lod 5 at the start (256 / 2**5 = 8) and reaches 256 after 5 * 1200 kimg.
    assert progressive.lod_at(0, max_resolution=256) == 5.0
    assert progressive.lod_at(5 * 1200 * 1000 - 300_000, max_resolution=256) == pytest.approx(0.5)
    # 2 kimg stable + 1 kimg fade-in, from 4x4 up to 16x16.
    kw = dict(max_resolution=16, start_resolution=4, phase_kimg=2, fade_kimg=1)
    for nimg, lod in [(0, 2.0), (1999, 2.0), (2250, 1.75), (3000, 1.0), (5500, 0.5), (6000, 0.0), (60000, 0.0)]:
        assert progressive.lod_at(nimg, **kw) == pytest.approx(lod), nimg


def test_lod_rejects_bad_arguments():
    with pytest.raises(ValueError):
        progressive.lod_at(0, max_resolution=1000)
    with pytest.raises(ValueError):
        progressive.lod_at(0, max_resolution=64, start_resolution=128)


def test_global_batch_table_is_stylegan_v1_8gpu_run():
    # StyleGAN v1 train.py, 8 GPUs: minibatch_dict {8: 256, 16: 128, 32: 64, 64: 32}, minibatch_base 32 above.
    assert progressive.BATCH == {8: 256, 16: 128, 32: 64, 64: 32, 128: 32, 256: 32, 512: 32, 1024: 32}
    # The paper: 1e-3 up to 64x64, 1.5e-3 above.
    assert progressive.LR == {r: 1e-3 if r <= 64 else 1.5e-3 for r in progressive.BATCH}
