"""generate.py: StyleGAN truncation, noise modes and style-mixing grids, and its one-line errors."""

import numpy as np
import PIL.Image
import pytest
import torch
from click.testing import CliRunner

import generate
from torch_utils import persistence
from training.networks import sngan, stylegan


@pytest.fixture(scope='module')
def stylegan_pkl(tmp_path_factory):
    torch.manual_seed(0)
    G = stylegan.Generator(c_dim=0, img_resolution=16, img_channels=3, z_dim=8, w_dim=8, fmap_max=8,
                           mapping_kwargs=dict(num_layers=2))
    with torch.no_grad():
        for name, p in G.named_parameters():
            if 'noise_strength' in name:
                p.fill_(0.5)  # Noise strengths start at zero; make noise visible.
        G.mapping.w_avg.normal_()
    path = str(tmp_path_factory.mktemp('snap') / 'stylegan.pkl')
    persistence.save_snapshot(path, {'G_ema': G})
    return path


def invoke(*args):
    return CliRunner().invoke(generate.main, list(args))


def read(path):
    return np.asarray(PIL.Image.open(path)).astype(np.int32)


def test_truncation_psi_zero_gives_one_image(stylegan_pkl, tmp_path):
    result = invoke(f'--network={stylegan_pkl}', '--seeds=0-2', '--trunc=0', '--noise-mode=none', f'--outdir={tmp_path}')
    assert result.exit_code == 0, result.output
    images = [read(tmp_path / f'seed{s:04d}.png') for s in range(3)]
    assert images[0].shape == (16, 16, 3)
    assert np.array_equal(images[0], images[1]) and np.array_equal(images[0], images[2])
    invoke(f'--network={stylegan_pkl}', '--seeds=0-1', '--noise-mode=none', f'--outdir={tmp_path / "free"}')
    assert not np.array_equal(read(tmp_path / 'free' / 'seed0000.png'), read(tmp_path / 'free' / 'seed0001.png'))


def test_noise_modes(stylegan_pkl, tmp_path):
    for run in ('a', 'b'):
        for mode in ('const', 'random'):
            assert invoke(f'--network={stylegan_pkl}', '--seeds=5', f'--noise-mode={mode}',
                          f'--outdir={tmp_path / run / mode}').exit_code == 0
    assert np.array_equal(read(tmp_path / 'a' / 'const' / 'seed0005.png'), read(tmp_path / 'b' / 'const' / 'seed0005.png'))
    assert not np.array_equal(read(tmp_path / 'a' / 'random' / 'seed0005.png'), read(tmp_path / 'b' / 'random' / 'seed0005.png'))


def test_style_mixing_grid(stylegan_pkl, tmp_path):
    result = invoke(f'--network={stylegan_pkl}', '--mix-rows=0-1', '--mix-cols=3-5', '--mix-styles=0-3',
                    '--noise-mode=const', f'--outdir={tmp_path}')
    assert result.exit_code == 0, result.output
    grid = read(tmp_path / 'stylemix.png')
    assert grid.shape == (3 * 16, 4 * 16, 3)
    # With all styles taken from the column seed, a cell equals that column's header image.
    invoke(f'--network={stylegan_pkl}', '--mix-rows=0', '--mix-cols=3', '--mix-styles=0-5', '--noise-mode=const',
           f'--outdir={tmp_path / "all"}')
    full = read(tmp_path / 'all' / 'stylemix.png')
    assert np.array_equal(full[16:, 16:], full[:16, 16:])
    assert np.all(full[:16, :16] == 0)  # The empty corner is black.


def test_errors_are_one_line(stylegan_pkl, tmp_path):
    sngan_pkl = str(tmp_path / 'sngan.pkl')
    persistence.save_snapshot(sngan_pkl, {'G_ema': sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, ch=4)})
    cases = [([f'--network={sngan_pkl}', '--trunc=0.5'], 'need a StyleGAN snapshot'),
             ([f'--network={stylegan_pkl}', '--mix-rows=0'], 'go together'),
             ([f'--network={stylegan_pkl}', '--mix-rows=0', '--mix-cols=1', '--mix-styles=0-9'], '--mix-styles'),
             ([f'--network={stylegan_pkl}', '--seeds=x'], 'Invalid'),
             ([f'--network={stylegan_pkl}', '--class=1'], 'unconditional'),
             ([f'--network={tmp_path / "missing.pkl"}'], 'No such file')]
    for args, message in cases:
        result = invoke(*args, f'--outdir={tmp_path / "out"}')
        assert result.exit_code != 0 and message in result.output, (args, result.output)
        assert isinstance(result.exception, SystemExit)  # A click error, not a traceback.
