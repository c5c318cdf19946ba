"""conv2d_resample against a direct numpy evaluation of its definition, on every code path."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from ops import conv2d_gradfix, conv2d_resample, upfirdn2d


def _correlate_valid(u, k, groups):
    """Grouped 'valid' cross-correlation by loops over the kernel taps: u [N, Ci, H, W], k [Co, Ci/g, kh, kw]."""
    n, ci, h, w = u.shape
    co, ci_per_group, kh, kw = k.shape
    co_per_group = co // groups
    out = np.zeros([n, co, h - kh + 1, w - kw + 1])
    for g, i, j in itertools.product(range(groups), range(kh), range(kw)):
        patch = u[:, g * ci_per_group:(g + 1) * ci_per_group, i:i + out.shape[2], j:j + out.shape[3]]
        weights = k[g * co_per_group:(g + 1) * co_per_group, :, i, j]
        out[:, g * co_per_group:(g + 1) * co_per_group] += np.einsum('nchw,oc->nohw', patch, weights)
    return out


def _depthwise(u, f):
    channels = u.shape[1]
    return _correlate_valid(u, np.tile(f[np.newaxis, np.newaxis], [channels, 1, 1, 1]), channels)


def _centering_padding(k, up, down):
    """(front, back) zero padding that one filter stage of length k needs, derived from pixel geometry.

    Pixel i of a signal covers [i, i + 1) and stands for its center i + 1/2, in units of that
    signal's pixels. Sample m of the full convolution with a length-k filter stands for the center
    of its support, input sample m - (k - 1) / 2. In 'valid' mode after front padding p, output j
    is full sample j * step + k - 1 - p (step: 1 for the upsampling filter, `down` when decimating).
      up:   zero-inserted sample n stands for original position n / up + 1/2; upsampled pixel j is
            centered at (j + 1/2) / up. So full sample m = j + (k - up) / 2 is wanted.
      down: input sample n stands for n + 1/2; output pixel j is centered at (j + 1/2) * down.
            So full sample m = j * down + (k + down) / 2 - 1 is wanted.
    Where that lands halfway between two samples, the earlier one is taken (StyleGAN's convention).
    The back padding makes the stage map L samples onto L * up, resp. L / down for L a multiple of down.
    """
    if up > 1:
        delay = math.floor(Fraction(k - up, 2))
        front = k - 1 - delay
        return front, k - 1 - front
    delay = math.floor(Fraction(k + down, 2) - 1)
    front = k - 1 - delay
    return front, k - down - front


def _definition(x, w, f, up, down, padding, groups, flip_weight, flip_filter):
    """The composition in the module docstring, step by step, each filter stage padded to stay centered."""
    fh, fw = f.shape
    px0, px1, py0, py1 = padding
    for stage_up, stage_down in ([(up, 1)] if up > 1 else []) + ([(1, down)] if down > 1 else []):
        (ax, bx), (ay, by) = _centering_padding(fw, stage_up, stage_down), _centering_padding(fh, stage_up, stage_down)
        px0, px1, py0, py1 = px0 + ax, px1 + bx, py0 + ay, py1 + by
    n, c, h, wd = x.shape
    u = np.zeros([n, c, h * up, wd * up])
    u[:, :, ::up, ::up] = x
    u = np.pad(u, [(0, 0), (0, 0), (max(py0, 0), max(py1, 0)), (max(px0, 0), max(px1, 0))])
    u = u[:, :, max(-py0, 0):u.shape[2] - max(-py1, 0), max(-px0, 0):u.shape[3] - max(-px1, 0)]
    taps = f if flip_filter else f[::-1, ::-1]  # filters convolve unless flip_filter
    if up > 1:
        u = _depthwise(u, taps * up ** 2)
    u = _correlate_valid(u, w if flip_weight else w[:, :, ::-1, ::-1], groups)
    if down > 1:
        u = _depthwise(u, taps)[:, :, ::down, ::down]
    return u


CASES = [  # kernel size, up, down, padding, groups, flip_weight, flip_filter
    (3, 1, 1, 1, 1, True, False),              # plain conv2d with symmetric padding
    (3, 1, 1, [0, 2, 1, 0], 1, False, False),  # asymmetric padding
    (1, 1, 2, 0, 1, True, False),              # 1x1 downsampling: filter first
    (3, 1, 2, 1, 2, True, True),               # strided conv after filtering
    (1, 2, 1, 0, 1, False, True),              # 1x1 upsampling: conv first
    (3, 2, 1, 1, 2, True, False),              # transposed conv
    (4, 2, 1, [2, 0, -1, 3], 1, False, True),  # transposed conv, even kernel, negative padding
    (3, 2, 2, 1, 1, True, False),              # up and down together
]


@pytest.mark.parametrize('k, up, down, padding, groups, flip_weight, flip_filter', CASES)
def test_matches_definition(k, up, down, padding, groups, flip_weight, flip_filter):
    rng = np.random.default_rng(k + 10 * up + 100 * down)
    x = rng.standard_normal([2, 4, 6, 7])
    w = rng.standard_normal([6, 4 // groups, k, k])
    f = rng.standard_normal([4, 3])  # asymmetric, so a missing flip or transposition shows
    y = conv2d_resample.conv2d_resample(torch.tensor(x), torch.tensor(w), torch.tensor(f), up=up, down=down,
                                        padding=padding, groups=groups, flip_weight=flip_weight,
                                        flip_filter=flip_filter)
    expected = _definition(x, w, f, up, down, upfirdn2d._parse_padding(padding), groups, flip_weight, flip_filter)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_stylegan_shapes():
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    x = torch.randn([2, 4, 8, 8])
    w = torch.randn([5, 4, 3, 3])
    assert conv2d_resample.conv2d_resample(x, w, f, up=2, padding=1).shape == (2, 5, 16, 16)
    assert conv2d_resample.conv2d_resample(x, w, f, down=2, padding=1).shape == (2, 5, 4, 4)
    assert conv2d_resample.conv2d_resample(x, w, padding=1).shape == (2, 5, 8, 8)


@pytest.mark.parametrize('higher_order', [False, True])  # PyTorch's convolutions, or conv2d_gradfix's Function.
@pytest.mark.parametrize('k, up, down', [(3, 2, 1), (3, 1, 2), (1, 2, 2)])
def test_gradcheck_and_gradgradcheck(k, up, down, higher_order):
    torch.manual_seed(0)
    f = upfirdn2d.setup_filter([1, 3, 3, 1]).double()
    x = torch.randn([1, 2, 4, 4], dtype=torch.float64, requires_grad=True)
    w = torch.randn([2, 2, k, k], dtype=torch.float64, requires_grad=True)
    fn = lambda x, w: conv2d_resample.conv2d_resample(x, w, f, up=up, down=down, padding=k // 2)  # noqa: E731
    with conv2d_gradfix.higher_order_gradients(higher_order):
        assert torch.autograd.gradcheck(fn, [x, w])
        assert torch.autograd.gradgradcheck(fn, [x, w], fast_mode=True)


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match='channels'):
        conv2d_resample.conv2d_resample(torch.zeros([1, 3, 4, 4]), torch.zeros([2, 2, 3, 3]))
    with pytest.raises(ValueError, match='up and down'):
        conv2d_resample.conv2d_resample(torch.zeros([1, 2, 4, 4]), torch.zeros([2, 2, 3, 3]), up=0)
