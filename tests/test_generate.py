"""generate.py: StyleGAN truncation, noise modes and style-mixing grids, and its one-line errors."""

import errno
import os

import numpy as np
import PIL.Image
import pytest
import torch
from click.testing import CliRunner

import generate
from torch_utils import persistence
from training.networks import sngan, stylegan


def save_stylegan(tmp_path_factory, name, seed, resolution, fmap_max, noise_strength):
    """A small random StyleGAN G_ema snapshot with visible noise (strengths start at zero) and a random w_avg."""
    torch.manual_seed(seed)
    G = stylegan.Generator(c_dim=0, img_resolution=resolution, img_channels=3, z_dim=8, w_dim=8, fmap_max=fmap_max,
                           mapping_kwargs=dict(num_layers=2))
    with torch.no_grad():
        G.mapping.w_avg.normal_()
        for param_name, p in G.named_parameters():
            if 'noise_strength' in param_name:
                p.fill_(noise_strength)
    path = str(tmp_path_factory.mktemp(name) / f'{name}.pkl')
    persistence.save_snapshot(path, {'G_ema': G})
    return path


@pytest.fixture(scope='module')
def stylegan_pkl(tmp_path_factory):
    return save_stylegan(tmp_path_factory, 'stylegan', seed=0, resolution=16, fmap_max=8, noise_strength=0.5)


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


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def test_noise_modes(stylegan_pkl, tmp_path, device):
    """Random noise is the default; it is drawn from the image's seed, so an image depends on its seed only. The
    expectation is computed on the device that generate.py ran on (CUDA draws other random numbers than the CPU)."""
    runs = {'default': ['--seeds=5'], 'again': ['--seeds=5'], 'batched': ['--seeds=3-7', '--batch=2'],
            'const': ['--seeds=5', '--noise-mode=const'], 'random': ['--seeds=5', '--noise-mode=random']}
    for run, args in runs.items():
        result = invoke(f'--network={stylegan_pkl}', *args, f'--outdir={tmp_path / run}', f'--device={device}')
        assert result.exit_code == 0, result.output
    images = {run: read(tmp_path / run / 'seed0005.png') for run in runs}
    for run in ('again', 'random'):
        assert np.array_equal(images[run], images['default']), run
    # In a batch of two a GPU may pick other convolution kernels: a rounding may then move a pixel by one level.
    batched_error = np.abs(images['batched'].astype(int) - images['default']).max()
    assert batched_error <= (0 if device == 'cpu' else 1)
    assert not np.array_equal(images['const'], images['default'])
    # Independently: seed 5's latent, torch's RNG seeded with 5 for the noise, quantized as a PNG.
    G = persistence.load_snapshot(stylegan_pkl).G_ema.to(device)
    torch.manual_seed(5)
    z = torch.from_numpy(np.random.RandomState(5).randn(1, G.z_dim)).float().to(device)
    img = G(z, torch.zeros(1, 0, device=device), noise_mode='random')
    expected = (img[0].permute(1, 2, 0) * 127.5 + 128).clamp(0, 255).to(torch.uint8).cpu().numpy()
    assert np.array_equal(images['default'], expected)


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


@pytest.fixture(scope='module')
def stylegan64_pkl(tmp_path_factory):
    """64x64: 10 style layers, so StyleGAN's cutoff of 8 and its fine styles (8-9) both exist."""
    return save_stylegan(tmp_path_factory, 'stylegan64', seed=1, resolution=64, fmap_max=4, noise_strength=0.3)


def to_png_pixels(img):
    return (img.permute(1, 2, 0) * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy().astype(np.int32)


def test_truncation_cutoff_defaults_to_stylegan_8(stylegan64_pkl, tmp_path):
    assert invoke(f'--network={stylegan64_pkl}', '--seeds=3', '--trunc=0.5', '--noise-mode=const',
                  f'--outdir={tmp_path / "default"}').exit_code == 0
    assert invoke(f'--network={stylegan64_pkl}', '--seeds=3', '--trunc=0.5', '--trunc-cutoff=10', '--noise-mode=const',
                  f'--outdir={tmp_path / "all"}').exit_code == 0
    G = persistence.load_snapshot(stylegan64_pkl).G_ema
    assert G.num_ws == 10
    z = torch.from_numpy(np.random.RandomState(3).randn(1, G.z_dim)).float()
    w = G.mapping(z, torch.zeros(1, 0))  # Untruncated.
    w_trunc = w.clone()
    w_trunc[:, :8] = G.mapping.w_avg + 0.5 * (w[:, :8] - G.mapping.w_avg)  # psi = 0.5 on layers 0-7 only.
    assert np.array_equal(read(tmp_path / 'default' / 'seed0003.png'), to_png_pixels(G.synthesis(w_trunc, noise_mode='const')[0]))
    assert not np.array_equal(read(tmp_path / 'default' / 'seed0003.png'), read(tmp_path / 'all' / 'seed0003.png'))


def test_style_mixing_defaults_to_stylegan_figure(stylegan64_pkl, tmp_path):
    """Six rows: coarse styles (0-3) for rows 0-2, middle (4-7) for rows 3-4, fine (8-9) for row 5,
    the ranges of NVlabs/stylegan's figure 3; constant noise as there."""
    rows, cols = [11, 12, 13, 14, 15, 16], [21, 22]
    result = invoke(f'--network={stylegan64_pkl}', f'--mix-rows={",".join(map(str, rows))}',
                    f'--mix-cols={",".join(map(str, cols))}', f'--outdir={tmp_path}')
    assert result.exit_code == 0, result.output
    figure = read(tmp_path / 'stylemix.png')
    G = persistence.load_snapshot(stylegan64_pkl).G_ema
    w = {s: G.mapping(torch.from_numpy(np.random.RandomState(s).randn(1, G.z_dim)).float(), torch.zeros(1, 0)) for s in rows + cols}
    v1_ranges = [range(0, 4)] * 3 + [range(4, 8)] * 2 + [range(8, 10)]
    for r, (row, styles) in enumerate(zip(rows, v1_ranges)):
        for c, col in enumerate(cols):
            mixed = w[row].clone()
            mixed[:, list(styles)] = w[col][:, list(styles)]
            cell = figure[(r + 1) * 64:(r + 2) * 64, (c + 1) * 64:(c + 2) * 64]
            # Up to 1 of 255: the figure maps all seeds in one batch, here one at a time.
            assert np.abs(cell - to_png_pixels(G.synthesis(mixed, noise_mode='const')[0])).max() <= 1, (r, c)
            other = w[row].clone()
            other[:, list(v1_ranges[(r + 3) % 6])] = w[col][:, list(v1_ranges[(r + 3) % 6])]  # Another group.
            assert np.abs(cell - to_png_pixels(G.synthesis(other, noise_mode='const')[0])).max() > 8, (r, c)


def test_style_ranges_of_smaller_networks():
    # 8 style layers (32x32) have no fine styles: rows split 3:2 into coarse and middle.
    assert generate._style_ranges(None, 5, 8) == [[0, 1, 2, 3]] * 3 + [[4, 5, 6, 7]] * 2
    assert generate._style_ranges(None, 3, 18) == [list(range(0, 4)), list(range(4, 8)), list(range(8, 18))]
    assert generate._style_ranges('fine', 2, 18) == [list(range(8, 18))] * 2
    assert generate._style_ranges('1,3', 1, 8) == [[1, 3]]


def assert_one_line_error(result, message):
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.output
    assert 'Traceback' not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output, result.output


@pytest.mark.parametrize('args,message', [
    (['--seeds=-1'], 'seed -1 is outside 0..4294967295'),
    (['--seeds=4294967296'], 'seed 4294967296 is outside'),
    (['--seeds='], '--seeds: no seeds given'),
    (['--seeds=0-2', '--trunc=nan'], '--trunc must be a finite number'),
    (['--seeds=0-2', '--trunc=inf'], '--trunc must be a finite number'),
    (['--mix-rows=', '--mix-cols=1'], '--mix-rows: no seeds given'),
    (['--mix-rows=0', '--mix-cols=1', '--mix-styles=fine'], 'none of them fine'),
    (['--device=mps'], '--device: use cpu, cuda or cuda:N, not mps'),
    (['--device=gpu0'], '--device: "gpu0" is not a device'),
] + ([] if torch.cuda.is_available() else [(['--device=cuda:0'], '--device: cuda:0 is not visible: torch sees 0 CUDA GPU(s) (no CUDA here)')]))
def test_bad_arguments_leave_nothing(stylegan_pkl, tmp_path, args, message):
    result = invoke(f'--network={stylegan_pkl}', *args, f'--outdir={tmp_path / "out"}')
    assert_one_line_error(result, message)
    assert not (tmp_path / 'out').exists()


def test_outdir_is_a_file(stylegan_pkl, tmp_path):
    (tmp_path / 'out').write_text('x')
    assert_one_line_error(invoke(f'--network={stylegan_pkl}', f'--outdir={tmp_path / "out"}'), 'is not a directory')
    assert (tmp_path / 'out').read_text() == 'x'
    assert_one_line_error(invoke(f'--network={stylegan_pkl}', f'--outdir={tmp_path / "out" / "sub"}'), 'cannot write')


def failing_save(error, after):
    """PIL's save, failing with `error` from the (after+1)-th image on, having written a partial file."""
    saved = []
    real_save = PIL.Image.Image.save

    def save(self, fp, *args, **kwargs):
        if len(saved) >= after:
            with open(fp, 'wb') as f:
                f.write(b'\x89PNG partial')
            raise OSError(error, os.strerror(error))
        saved.append(fp)
        return real_save(self, fp, *args, **kwargs)
    return save


@pytest.mark.parametrize('error,after', [(errno.ENOSPC, 0), (errno.ENOSPC, 2), (errno.EACCES, 0), (errno.EROFS, 0)])
def test_write_errors_leave_no_directory(stylegan_pkl, tmp_path, monkeypatch, error, after):
    """A full disk or an unwritable --outdir: one line, and the directory the run made is gone."""
    monkeypatch.setattr(PIL.Image.Image, 'save', failing_save(error, after))
    result = invoke(f'--network={stylegan_pkl}', '--seeds=0-3', f'--outdir={tmp_path / "out"}')
    assert_one_line_error(result, os.strerror(error))
    assert not (tmp_path / 'out').exists()


def test_write_error_in_existing_directory_leaves_only_complete_images(stylegan_pkl, tmp_path, monkeypatch):
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'mine.txt').write_text('x')
    monkeypatch.setattr(PIL.Image.Image, 'save', failing_save(errno.ENOSPC, 2))
    assert_one_line_error(invoke(f'--network={stylegan_pkl}', '--seeds=0-3', f'--outdir={tmp_path / "out"}'), 'No space left')
    assert sorted(os.listdir(tmp_path / 'out')) == ['mine.txt', 'seed0000.png', 'seed0001.png']
    PIL.Image.open(tmp_path / 'out' / 'seed0001.png').load()  # Complete.


def test_read_only_outdir(stylegan_pkl, tmp_path):
    if os.geteuid() == 0:
        pytest.skip('root writes into read-only directories; covered by EACCES above')
    (tmp_path / 'ro').mkdir(mode=0o555)
    assert_one_line_error(invoke(f'--network={stylegan_pkl}', f'--outdir={tmp_path / "ro" / "out"}'), 'Permission denied')
    assert os.listdir(tmp_path / 'ro') == []


def test_non_finite_weights_are_refused(tmp_path):
    G = sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, ch=4)
    with torch.no_grad():
        next(G.parameters()).view(-1)[0] = float('nan')
    path = str(tmp_path / 'nan.pkl')
    persistence.save_snapshot(path, {'G_ema': G})
    result = invoke(f'--network={path}', f'--outdir={tmp_path / "out"}')
    assert_one_line_error(result, 'non-finite weights')
    assert not (tmp_path / 'out').exists()


def test_slerp_moves_along_the_great_circle():
    torch.manual_seed(0)
    a, b = torch.randn(1, 64, dtype=torch.float64), torch.randn(1, 64, dtype=torch.float64)
    angle = torch.arccos((a * b).sum() / (a.norm() * b.norm()))
    for t in (0.0, 0.25, 0.5, 1.0):
        x = generate.slerp(a, b, t)
        # The angle to a grows as t * angle and the one to b shrinks alike (hand-derived property of the great circle).
        to_a = torch.arccos(((x * a).sum() / (x.norm() * a.norm())).clamp(-1, 1))
        to_b = torch.arccos(((x * b).sum() / (x.norm() * b.norm())).clamp(-1, 1))
        assert float(to_a) == pytest.approx(t * float(angle), abs=1e-7)
        assert float(to_b) == pytest.approx((1 - t) * float(angle), abs=1e-7)
    torch.testing.assert_close(generate.slerp(a, 2 * a, 0.5), 1.5 * a)  # Parallel: linear.


def test_video_walks_through_the_seeds(stylegan_pkl, tmp_path):
    import imageio.v2 as imageio
    result = invoke(f'--network={stylegan_pkl}', '--seeds=3,9', '--noise-mode=const', '--video-frames=5',
                    f'--video={tmp_path / "out" / "walk.gif"}', f'--outdir={tmp_path / "out"}')
    assert result.exit_code == 0, result.output
    frames = imageio.mimread(tmp_path / 'out' / 'walk.gif')
    assert len(frames) == 2 * 5  # 3 -> 9 and back to 3.
    # The first frame is seed 3 itself (noise const), as generate.py draws it (rounding aside).
    assert np.abs(frames[0][:, :, :3].astype(np.int32) - read(tmp_path / 'out' / 'seed0003.png')).max() <= 1
    assert np.abs(frames[5][:, :, :3].astype(np.int32) - read(tmp_path / 'out' / 'seed0009.png')).max() <= 1
    for args, message in [(['--seeds=3'], 'two or more'), (['--seeds=3,4', f'--video={tmp_path / "w.avi"}'], '.gif or .mp4'),
                          (['--seeds=3,4', f'--video={tmp_path / "nowhere" / "w.gif"}'], 'no such folder')]:
        video = [] if any(a.startswith('--video') for a in args) else [f'--video={tmp_path / "w.gif"}']
        assert_one_line_error(invoke(f'--network={stylegan_pkl}', *args, *video, f'--outdir={tmp_path / "x"}'), message)


def test_stylegan2_truncation_defaults_to_every_layer(tmp_path):
    """NVIDIA's generate.py truncates all the styles of a StyleGAN2 generator: at 64x64, all 10, not v1's first 8."""
    from training.networks import stylegan2
    torch.manual_seed(0)
    G = stylegan2.Generator(z_dim=8, c_dim=0, w_dim=8, img_resolution=64, img_channels=3, mapping_kwargs={'num_layers': 2},
                            synthesis_kwargs={'channel_base': 256, 'channel_max': 8})
    with torch.no_grad():
        G.mapping.w_avg.normal_()
    path = tmp_path / 'sg2.pkl'
    persistence.save_snapshot(str(path), {'G_ema': G.eval()})
    result = invoke(f'--network={path}', '--seeds=3', '--trunc=0.5', f'--outdir={tmp_path / "out"}')
    assert result.exit_code == 0, result.output
    assert G.num_ws == 10
    z = torch.from_numpy(np.random.RandomState(3).randn(1, G.z_dim)).float()
    with torch.no_grad():
        w = G.mapping(z, torch.zeros(1, 0))
        w_trunc = G.mapping.w_avg + 0.5 * (w - G.mapping.w_avg)  # psi = 0.5 on all 10 layers.
        expected = to_png_pixels(G.synthesis(w_trunc, noise_mode='const')[0])
        first_8 = torch.cat([w_trunc[:, :8], w[:, 8:]], dim=1)
        v1 = to_png_pixels(G.synthesis(first_8, noise_mode='const')[0])
    assert (v1 != expected).mean() > 0.5  # Layers 8 and 9 show in most pixels.
    ours = read(tmp_path / 'out' / 'seed0003.png')
    assert np.abs(ours - expected).max() <= 1 and (ours != expected).mean() < 0.001  # float rounding at .5 edges
