"""conv2d_resample against a direct numpy evaluation of its definition, on every code path."""

import itertools

import numpy as np
import pytest
import torch

from ops import conv2d_resample, upfirdn2d


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


def _definition(x, w, f, up, down, padding, groups, flip_weight, flip_filter):
    """The composition in the module docstring, step by step."""
    fh, fw = f.shape
    px0, px1, py0, py1 = padding
    if up > 1:
        px0, px1 = px0 + (fw + up - 1) // 2, px1 + (fw - up) // 2
        py0, py1 = py0 + (fh + up - 1) // 2, py1 + (fh - up) // 2
    if down > 1:
        px0, px1 = px0 + (fw - down + 1) // 2, px1 + (fw - down) // 2
        py0, py1 = py0 + (fh - down + 1) // 2, py1 + (fh - down) // 2
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


@pytest.mark.parametrize('k, up, down', [(3, 2, 1), (3, 1, 2), (1, 2, 2)])
def test_gradcheck_and_gradgradcheck(k, up, down):
    torch.manual_seed(0)
    f = upfirdn2d.setup_filter([1, 3, 3, 1]).double()
    x = torch.randn([1, 2, 4, 4], dtype=torch.float64, requires_grad=True)
    w = torch.randn([2, 2, k, k], dtype=torch.float64, requires_grad=True)
    fn = lambda x, w: conv2d_resample.conv2d_resample(x, w, f, up=up, down=down, padding=k // 2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, [x, w])
    assert torch.autograd.gradgradcheck(fn, [x, w], fast_mode=True)


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match='channels'):
        conv2d_resample.conv2d_resample(torch.zeros([1, 3, 4, 4]), torch.zeros([2, 2, 3, 3]))
    with pytest.raises(ValueError, match='up and down'):
        conv2d_resample.conv2d_resample(torch.zeros([1, 2, 4, 4]), torch.zeros([2, 2, 3, 3]), up=0)
