"""CR augmentations: flip + translation with black fill, per sample, batched; checked against numpy."""

import numpy as np
import pytest
import torch

from training.step.augment import consistency_augment, draw_shifts, flip_translate


def reference_flip_translate(img, flip, dy, dx, fill):
    """One image [C, H, W] in numpy: optional left-right mirror, then shift by (dy, dx) with constant fill."""
    img = img[:, :, ::-1] if flip else img
    C, H, W = img.shape
    out = np.full_like(img, fill)
    ys, xs = slice(max(dy, 0), H + min(dy, 0)), slice(max(dx, 0), W + min(dx, 0))
    yd, xd = slice(max(-dy, 0), H + min(-dy, 0)), slice(max(-dx, 0), W + min(-dx, 0))
    out[:, ys, xs] = img[:, yd, xd]
    return out


def test_flip_translate_matches_reference():
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, size=(6, 3, 7, 9))
    flip = np.array([False, True, False, True, True, False])
    shift = np.array([[0, 0], [1, -2], [-3, 4], [6, 0], [0, -8], [-7, 9]])  # Includes shifts past the border.
    out = flip_translate(torch.tensor(images), torch.tensor(flip), torch.tensor(shift), fill=-1.0).numpy()
    for i in range(len(images)):
        np.testing.assert_array_equal(out[i], reference_flip_translate(images[i], flip[i], *shift[i], -1.0))


def _recover(original, augmented, limit):
    """All (flip, dy, dx) with |dy|, |dx| <= limit that map `original` to `augmented` exactly."""
    return [(flip, dy, dx)
            for flip in (False, True) for dy in range(-limit, limit + 1) for dx in range(-limit, limit + 1)
            if np.array_equal(reference_flip_translate(original, flip, dy, dx, -1.0), augmented)]


def test_consistency_augment_shape_range_and_parameters():
    torch.manual_seed(0)
    images = torch.rand(64, 3, 10, 10) * 1.8 - 0.9  # Distinct values in (-1, 1): the transform is identifiable.
    out = consistency_augment(images)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert out.min() >= -1 and out.max() <= 1
    params = [_recover(images[i].numpy(), out[i].numpy(), limit=2) for i in range(len(images))]
    assert all(len(p) == 1 for p in params)  # Every output is the input flipped and shifted by at most 20%.
    flips = [p[0][0] for p in params]
    shifts = {p[0][1:] for p in params}
    assert 0.25 < np.mean(flips) < 0.75
    assert {dy for dy, _ in shifts} == {-2, -1, 0, 1, 2} and {dx for _, dx in shifts} == {-2, -1, 0, 1, 2}


def test_consistency_augment_is_per_sample_and_keeps_input():
    torch.manual_seed(1)
    images = torch.rand(1, 3, 16, 16).repeat(32, 1, 1, 1)
    before = images.clone()
    out = consistency_augment(images)
    assert torch.equal(images, before)
    assert len({tuple(o.flatten().tolist()) for o in out}) > 8  # Identical inputs get different augmentations.


@pytest.mark.parametrize('size', [32, 48])
def test_shifts_follow_the_authors_rounding_of_a_uniform_draw(size):
    # torchvision's RandomAffine(translate=(0.2, 0.2)) draws round(u), u ~ U[-0.2 size, 0.2 size]: shift k has the
    # probability of the part of [-m, m] that rounds to k, |[k - 1/2, k + 1/2] & [-m, m]| / (2m).
    m = 0.2 * size
    top = int(np.floor(m + 0.5))
    expected = {k: (min(k + 0.5, m) - max(k - 0.5, -m)) / (2 * m) for k in range(-top, top + 1)}
    torch.manual_seed(0)
    shifts = draw_shifts(200_000, size, size).numpy()
    for axis in range(2):
        values, counts = np.unique(shifts[:, axis], return_counts=True)
        assert set(values.tolist()) == set(expected)  # +-10 at 48x48, +-6 at 32x32.
        for k, count in zip(values.tolist(), counts):
            assert abs(count / len(shifts) - expected[k]) < 5 * np.sqrt(expected[k] / len(shifts)) + 1e-4, (axis, k)


def _decode_flips_and_shifts(out: torch.Tensor, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(flip [N], shift [N, 2]) of consistency_augment's outputs of an image whose pixel (r, c) holds r * W + c + 1
    (the fill is -1): the brightest visible pixel (y, x) is some (r, c) of the source, the sign of the values' step
    along x tells the flip, and then dy = y - r, dx = x - c (c = W - 1 - (x - dx) when flipped)."""
    values = out[:, 0]
    inside = values >= 1
    steps = (values[:, :, 1:] - values[:, :, :-1]) * (inside[:, :, 1:] & inside[:, :, :-1])
    flip = steps.sum(dim=(1, 2)) < 0
    best, index = values.flatten(1).max(dim=1)
    y, x = index // width, index % width
    r, c = (best.long() - 1) // width, (best.long() - 1) % width
    dx = torch.where(flip, c - (width - 1 - x), x - c)
    return flip.numpy(), torch.stack([y - r, dx], dim=1).numpy()


@pytest.mark.parametrize('height,width', [(32, 32), (48, 48), (32, 48)])
def test_the_losss_draw_flips_half_and_shifts_each_axis_within_a_fifth_of_its_size(height, width):
    """consistency_augment, the call the loss makes: flips with probability 1/2, and shifts dy by
    round(U[-0.2 H, 0.2 H]) and dx by round(U[-0.2 W, 0.2 W]) (non-square: each axis its own size), decoded
    from the augmented images."""
    n = 6000
    image = (torch.arange(height * width, dtype=torch.float32) + 1).reshape(1, 1, height, width)
    torch.manual_seed(0)
    flip, shift = _decode_flips_and_shifts(consistency_augment(image.expand(n, 1, height, width)), width)
    assert abs(flip.mean() - 0.5) < 5 * np.sqrt(0.25 / n)
    for axis, size in enumerate((height, width)):
        m = 0.2 * size
        top = int(np.floor(m + 0.5))
        expected = {k: (min(k + 0.5, m) - max(k - 0.5, -m)) / (2 * m) for k in range(-top, top + 1)}
        values, counts = np.unique(shift[:, axis], return_counts=True)
        assert set(values.tolist()) == set(expected), (axis, values)
        for k, count in zip(values.tolist(), counts):
            assert abs(count / n - expected[k]) < 5 * np.sqrt(expected[k] / n) + 1e-4, (axis, k)


#----------------------------------------------------------------------------
# NVIDIA's AugmentPipe and DiffAugment: hand-derived values from the same draws, replayed here from the seed.

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ops import conv2d_gradfix, grid_sample_gradfix  # noqa: E402
from torch_utils import misc, persistence  # noqa: E402
from training.step.augment import AUGPIPE_SPECS, AugmentPipe, DiffAugment  # noqa: E402


def _pipe(p: float, **kwargs) -> AugmentPipe:
    pipe = AugmentPipe(**kwargs)
    pipe.p.fill_(p)
    return pipe


def _run(pipe, images, seed=0):
    """pipe(images) from the torch random state of `seed`, and the draws it makes replayed: a seeded generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = pipe(images)
    return out, torch.Generator().manual_seed(seed)


def test_augpipe_specs_are_nvidias_and_build_a_persistent_pipe():
    blit, geom, color = {'xflip', 'rotate90', 'xint'}, {'scale', 'rotate', 'aniso', 'xfrac'}, \
        {'brightness', 'contrast', 'lumaflip', 'hue', 'saturation'}
    expected = {'blit': blit, 'geom': geom, 'color': color, 'filter': {'imgfilter'}, 'noise': {'noise'},
                'cutout': {'cutout'}, 'bg': blit | geom, 'bgc': blit | geom | color,
                'bgcf': blit | geom | color | {'imgfilter'}, 'bgcfn': blit | geom | color | {'imgfilter', 'noise'},
                'bgcfnc': blit | geom | color | {'imgfilter', 'noise', 'cutout'}}
    assert {name: set(spec) for name, spec in AUGPIPE_SPECS.items()} == expected
    assert all(v == 1 for spec in AUGPIPE_SPECS.values() for v in spec.values())
    pipe = AugmentPipe(**AUGPIPE_SPECS['bgc'])
    assert persistence.is_persistent(pipe) and pipe.init_kwargs == AUGPIPE_SPECS['bgc']
    assert pipe.p.dtype == torch.float32 and pipe.p.shape == () and float(pipe.p) == 0
    assert set(pipe.state_dict()) == {'p', 'Hz_geom', 'Hz_fbank'}  # NVIDIA's buffers, so their p loads.


def test_filter_bank_splits_the_spectrum_into_octaves():
    bank = AugmentPipe().Hz_fbank.double().numpy()
    assert bank.shape == (4, 43)
    np.testing.assert_allclose(bank.sum(axis=0), np.eye(1, 43, 21)[0], atol=1e-6)  # The bands sum to the identity.
    np.testing.assert_allclose(bank, bank[:, ::-1], atol=1e-7)  # Zero phase.
    response = np.abs(np.fft.rfft(bank, 4096, axis=1))  # Frequencies 0 .. 1/2 cycles per pixel.
    for band, f in enumerate([0.0, 3 / 32, 3 / 16, 3 / 8]):  # The middle of each octave: [0, 1/16) .. [1/4, 1/2].
        assert np.argmax(response[:, int(f * 4096)]) == band
    # With every band's multiplier 0 no gain is drawn above 1: the bands sum back to the image.
    images = torch.rand(2, 3, 24, 24) * 2 - 1
    out, _ = _run(_pipe(1.0, imgfilter=1, imgfilter_bands=[0, 0, 0, 0]), images)
    assert (out - images).abs().max() < 1e-5


@pytest.mark.parametrize('name', list(AUGPIPE_SPECS))
def test_p_zero_is_the_identity(name):
    images = torch.rand(4, 3, 24, 24) * 2 - 1
    out, _ = _run(_pipe(0.0, **AUGPIPE_SPECS[name]), images)
    # The geometric path still resamples (up, bilinear at the pixels, down): the identity to float32 rounding.
    tolerance = 1e-4 if set(AUGPIPE_SPECS[name]) & {'xflip', 'scale'} else 0
    assert (out - images).abs().max() <= tolerance


def test_rotate90_rotates_by_the_drawn_quarter_turns():
    # G_inv = R(pi/2 k)^-1 maps the output pixel (x, y) (about the centre, y down) to the input (-y, x) for k = 1:
    # out[r, c] = in[c, W - 1 - r] = np.rot90(in, 1)[r, c]; k quarter turns give np.rot90(in, k). Exact but for the
    # sym6 filter, which is not symmetric: upsampled along one axis and downsampled along the other, its phases no
    # longer cancel, a sub-pixel shift (as in NVIDIA's pipeline). So a smooth image, two bumps of different sign
    # (no symmetry), with the tolerance of that shift; a wrong quarter turn is off by the bumps' height.
    r, c = np.arange(16)[:, None], np.arange(16)[None, :]
    bumps = np.exp(-((r - 6.0) ** 2 + (c - 9.0) ** 2) / 8) - 0.6 * np.exp(-((r - 10.0) ** 2 + (c - 5.0) ** 2) / 6)
    images = torch.tensor(bumps, dtype=torch.float32).repeat(32, 1, 1, 1)
    out, g = _run(_pipe(1.0, rotate90=1), images)
    k = torch.floor(torch.rand(32, generator=g) * 4).long()
    assert set(k.tolist()) == {0, 1, 2, 3}
    for n in range(32):
        np.testing.assert_allclose(out[n, 0], np.rot90(bumps, int(k[n])), atol=1e-5 if k[n] == 0 else 0.04)


def test_xint_shifts_by_the_rounded_draw_with_reflected_border():
    H, W = 16, 12
    images = torch.rand(8, 2, H, W) * 2 - 1
    out, g = _run(_pipe(1.0, xint=1, xint_max=0.25), images)
    t = (torch.rand(8, 2, generator=g) * 2 - 1) * 0.25
    assert (torch.rand(8, 1, generator=g) < 1).all()  # p = 1: every image moves.
    for n in range(8):
        tx, ty = int(np.round(t[n, 0] * W)), int(np.round(t[n, 1] * H))
        padded = np.pad(images[n].numpy(), [(0, 0), (H, H), (W, W)], mode='reflect')
        expected = padded[:, H - ty:2 * H - ty, W - tx:2 * W - tx]  # out[r, c] = in[r - ty, c - tx], mirrored beyond.
        np.testing.assert_allclose(out[n], expected, atol=1e-5)


def test_colour_matrix_on_a_known_pixel():
    # brightness b, then contrast c, then the luma flip: (I - 2 v v^T) with v = (1, 1, 1) / sqrt(3) takes x to
    # x - 2/3 (r + g + b); each applied where its probability draw is below p = 0.5.
    pixel = torch.tensor([0.5, -0.25, 0.1])
    images = pixel.reshape(1, 3, 1, 1).repeat(64, 1, 2, 2)
    out, g = _run(_pipe(0.5, brightness=1, contrast=1, lumaflip=1), images)
    b = torch.randn(64, generator=g) * 0.2
    b = torch.where(torch.rand(64, generator=g) < 0.5, b, 0.0)
    c = torch.exp2(torch.randn(64, generator=g) * 0.5)
    c = torch.where(torch.rand(64, generator=g) < 0.5, c, 1.0)
    i = torch.floor(torch.rand(64, generator=g) * 2)
    i = torch.where(torch.rand(64, generator=g) < 0.5, i, 0.0)
    assert 0 < int((b != 0).sum()) < 64 and 0 < int((i == 1).sum()) < 64
    x = c.double()[:, None] * (pixel.double()[None] + b.double()[:, None])
    x = x - i.double()[:, None] * 2 / 3 * x.sum(dim=1, keepdim=True)
    np.testing.assert_allclose(out[:, :, 1, 0].double(), x, atol=1e-6)
    # A grey (L) image: the mean of the rows of I - 2 v v^T sums to -1, so the flip negates it.
    grey, g = _run(_pipe(1.0, lumaflip=1), torch.full([16, 1, 2, 2], 0.3))
    i = torch.floor(torch.rand(16, generator=g) * 2)
    np.testing.assert_allclose(grey[:, 0, 0, 0], np.where(i.numpy() == 1, -0.3, 0.3), atol=1e-6)


def test_cutout_zeroes_the_drawn_square():
    H, W = 12, 16
    images = torch.rand(32, 3, H, W) + 1  # Nonzero everywhere.
    out, g = _run(_pipe(1.0, cutout=1, cutout_size=0.5), images)
    assert (torch.rand(32, generator=g) < 1).all()
    center = torch.rand(32, 2, generator=g).double().numpy()
    for n in range(32):
        xs, ys = (np.arange(W) + 0.5) / W, (np.arange(H) + 0.5) / H
        cut = (np.abs(ys[:, None] - center[n, 1]) < 0.25) & (np.abs(xs[None, :] - center[n, 0]) < 0.25)
        np.testing.assert_array_equal(out[n].numpy() == 0, np.broadcast_to(cut, (3, H, W)))
        np.testing.assert_array_equal(out[n][:, ~cut], images[n][:, ~cut])


def test_noise_has_the_drawn_strength():
    images = torch.zeros(4, 3, 64, 64)
    out, g = _run(_pipe(1.0, noise=1, noise_std=0.5), images)
    sigma = torch.randn(4, generator=g).abs() * 0.5
    np.testing.assert_allclose(out.std(dim=[1, 2, 3]), sigma, rtol=0.05)


@pytest.mark.parametrize('name, size', [('blit', 8), ('geom', 8), ('filter', 24), ('bgc', 8)])
def test_second_derivatives_are_exact(name, size):
    pipe = _pipe(1.0, **AUGPIPE_SPECS[name])
    images = torch.rand(2, 3, size, size, dtype=torch.float64, requires_grad=True)

    def augment(x):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)  # The same draws on every call: A is then affine in x.
            return pipe(x)
    with conv2d_gradfix.higher_order_gradients():
        assert torch.autograd.gradgradcheck(augment, [images], fast_mode=True)


def test_grid_sample_gradfix_is_torchs_grid_sample_with_exact_derivatives():
    x = torch.rand(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    grid = torch.rand(2, 4, 7, 2, dtype=torch.float64) * 2.4 - 1.2  # Some points outside: zero padding.
    expected = torch.nn.functional.grid_sample(x, grid, mode='bilinear', padding_mode='zeros', align_corners=False)
    with conv2d_gradfix.higher_order_gradients():
        assert torch.equal(grid_sample_gradfix.grid_sample(x, grid), expected)
        assert torch.autograd.gradgradcheck(lambda x: grid_sample_gradfix.grid_sample(x, grid), [x])


class _HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split('.')[0] in misc.HOST_READ_OPS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('name', ['bgcfnc'])
def test_no_host_reads(name):
    # A host read of a tensor value (NVIDIA's padding amounts) would make a GPU step wait: the GPU's path.
    pipe = _pipe(0.7, **AUGPIPE_SPECS[name])
    pipe.host_margin = False
    images = torch.rand(4, 3, 24, 24, requires_grad=True)
    with _HostReads() as mode:
        pipe(images).square().sum().backward()
        DiffAugment(images, 'color,translation,cutout').sum().backward()
    assert mode.reads == []


def test_diffaugment_translation_and_cutout_from_the_drawn_numbers():
    H, W = 16, 8
    images = torch.rand(32, 2, H, W) + 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        out = DiffAugment(images, 'translation,cutout')
    g = torch.Generator().manual_seed(3)
    ty = torch.randint(-2, 3, [32, 1, 1], generator=g).reshape(32)  # round(16 / 8) rows,
    tx = torch.randint(-1, 2, [32, 1, 1], generator=g).reshape(32)  # round(8 / 8) columns.
    oy = torch.randint(0, H + 1, [32, 1, 1], generator=g).reshape(32)  # Even sides 8 and 4: one more position.
    ox = torch.randint(0, W + 1, [32, 1, 1], generator=g).reshape(32)
    x = images.numpy()
    for n in range(32):
        expected = np.zeros_like(x[n])
        for r in range(H):
            for c in range(W):
                if 0 <= r + ty[n] < H and 0 <= c + tx[n] < W:
                    expected[:, r, c] = x[n, :, r + ty[n], c + tx[n]]
        rows = np.clip(np.arange(8) + int(oy[n]) - 4, 0, H - 1)
        cols = np.clip(np.arange(4) + int(ox[n]) - 2, 0, W - 1)
        expected[:, rows[:, None], cols[None, :]] = 0
        np.testing.assert_array_equal(out[n].numpy(), expected)


def test_diffaugment_color_and_policies():
    images = torch.rand(8, 3, 4, 4) * 2 - 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        out = DiffAugment(images, 'color')
    g = torch.Generator().manual_seed(5)
    x = images.double() + (torch.rand(8, 1, 1, 1, generator=g).double() - 0.5)
    x = (x - x.mean(1, keepdim=True)) * (torch.rand(8, 1, 1, 1, generator=g).double() * 2) + x.mean(1, keepdim=True)
    m = x.mean([1, 2, 3], keepdim=True)
    x = (x - m) * (torch.rand(8, 1, 1, 1, generator=g).double() + 0.5) + m
    np.testing.assert_allclose(out.double(), x, atol=1e-6)
    assert torch.equal(DiffAugment(images, ''), images)
    with pytest.raises(ValueError, match="unknown policy 'flip'.*color, translation, cutout"):
        DiffAugment(images, 'color,flip')


@pytest.mark.parametrize('augment', ['bgcfnc', 'color,translation,cutout'])
def test_fixed_draws_make_the_augmentation_affine(augment):
    # GN's exact fast paths need A(x) = M x + c for fixed draws: A(x + y) - A(0) = (A(x) - A(0)) + (A(y) - A(0)),
    # A(2 x) - A(0) = 2 (A(x) - A(0)), and a zero second derivative.
    pipe = _pipe(1.0, **AUGPIPE_SPECS[augment]) if augment in AUGPIPE_SPECS else None

    def A(x):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(2)
            return pipe(x) if pipe is not None else DiffAugment(x, augment)
    x, y = (torch.rand(3, 3, 24, 24, dtype=torch.float64) * 2 - 1 for _ in range(2))
    zero = A(torch.zeros_like(x))
    torch.testing.assert_close(A(x + y) - zero, (A(x) - zero) + (A(y) - zero), rtol=0, atol=1e-12)
    torch.testing.assert_close(A(2 * x) - zero, 2 * (A(x) - zero), rtol=0, atol=1e-12)
    x.requires_grad_(True)
    with conv2d_gradfix.higher_order_gradients():
        g, = torch.autograd.grad((A(x) * torch.rand_like(x)).sum(), [x], create_graph=True)
        if g.requires_grad:  # Else the gradient does not depend on x at all.
            gg, = torch.autograd.grad(g.square().sum(), [x], allow_unused=True)
            assert gg is None or torch.count_nonzero(gg) == 0


def test_snapshot_rebuilds_the_pipe_with_its_p():
    pipe = _pipe(0.37, **AUGPIPE_SPECS['bgcfnc'])
    state = {k: v.clone() for k, v in pipe.state_dict().items()}
    rebuilt = persistence.rebuild_network(persistence.class_name_of(AugmentPipe), dict(pipe.init_kwargs), state,
                                          'augment_pipe')
    assert rebuilt.p.dtype == torch.float32 and float(rebuilt.p) == np.float32(0.37)
    images = torch.rand(2, 3, 24, 24) * 2 - 1
    assert torch.equal(_run(rebuilt, images)[0], _run(pipe, images)[0])


@pytest.mark.parametrize('spec', [dict(AUGPIPE_SPECS['bg']),
                                  dict(scale=1, rotate=1, xfrac=1, scale_std=2, xfrac_std=0.5)])
def test_the_gpus_padding_gives_the_cpus_batch(spec):
    """Geometry padded by the largest margin and masked to NVIDIA's (the GPU's path, no host read) against NVIDIA's
    least margin read back (the CPU's path, NVIDIA's own): the same batch from the same draws, but for float32 rounding
    of the resampling positions."""
    images = torch.rand(16, 3, 24, 20) * 2 - 1
    pipe = _pipe(1.0, **spec)
    out = {}
    for host_margin in (True, False):
        pipe.host_margin = host_margin
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            out[host_margin] = pipe(images)
    assert (out[True] - out[False]).abs().max() < 5e-5

