"""upfirdn2d against scipy.signal.upfirdn and a direct numpy evaluation, plus its gradients."""

import itertools

import numpy as np
import pytest
import torch

from ops import upfirdn2d
from tests.support.kernel_cases import training_filter_among_other_filters, upfirdn_1d


def _scipy_separable(x, h, up, down, padding, flip_filter, gain):
    (upx, upy), (downx, downy), (px0, px1, py0, py1) = up, down, padding
    if flip_filter:  # correlation with h = convolution with h reversed
        h = h[::-1]
    y = upfirdn_1d(x, h, upx, downx, px0, px1)
    y = np.swapaxes(upfirdn_1d(np.swapaxes(y, -1, -2), h, upy, downy, py0, py1), -1, -2)
    return y * gain


def _direct_2d(x, f, up, down, padding, flip_filter, gain):
    """Definition by loops: zero-insert, pad or crop, correlate with the (flipped) filter, decimate."""
    n, c, h, w = x.shape
    (upx, upy), (downx, downy), (px0, px1, py0, py1) = up, down, padding
    u = np.zeros([n, c, h * upy, w * upx])
    u[:, :, ::upy, ::upx] = x
    u = np.pad(u, [(0, 0), (0, 0), (max(py0, 0), max(py1, 0)), (max(px0, 0), max(px1, 0))])
    u = u[:, :, max(-py0, 0):u.shape[2] - max(-py1, 0), max(-px0, 0):u.shape[3] - max(-px1, 0)]
    k = f if flip_filter else f[::-1, ::-1]
    fh, fw = k.shape
    out = np.zeros([n, c, u.shape[2] - fh + 1, u.shape[3] - fw + 1])
    for i, j in itertools.product(range(fh), range(fw)):
        out += k[i, j] * u[:, :, i:i + out.shape[2], j:j + out.shape[3]]
    return out[:, :, ::downy, ::downx] * gain


SEPARABLE_CASES = [  # up, down, padding
    (1, 1, [0, 0, 0, 0]), (2, 1, [2, 1, 2, 1]), (4, 1, [3, 2, 1, 4]), (1, 2, [1, 1, 0, 3]),
    (1, 4, [2, 5, 2, 2]), (2, 2, [1, 2, 3, 0]), (4, 2, [0, 0, 5, 5]), (2, 4, [4, 1, 1, 4]),
    (2, 1, [-1, 3, 2, -2]), (1, 2, [-2, -1, 4, 3]), ([1, 2], [4, 1], [2, 3, -1, 1]),
    (1, 2, [3, 3, 1, 1]),  # symmetric per axis: padded by the convolution itself
]


@pytest.mark.parametrize('taps', [3, 4, 5, 8])
@pytest.mark.parametrize('up, down, padding', SEPARABLE_CASES)
def test_separable_matches_scipy(taps, up, down, padding):
    rng = np.random.default_rng(taps)
    x = rng.standard_normal([2, 3, 11, 12])
    h = rng.standard_normal(taps)
    up2, down2 = upfirdn2d._parse_scaling(up), upfirdn2d._parse_scaling(down)
    for flip_filter, gain in [(False, 1.0), (True, 2.5)]:
        expected = _scipy_separable(x, h, up2, down2, padding, flip_filter, gain)
        for f in (torch.tensor(h), torch.outer(torch.tensor(h), torch.tensor(h))):  # 1-D separable, and 2-D
            y = upfirdn2d.upfirdn2d(torch.tensor(x), f, up=up, down=down, padding=padding,
                                    flip_filter=flip_filter, gain=gain)
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('up, down, padding, flip_filter', [
    (1, 1, [1, 2, 0, 1], False), (2, 1, [2, 0, 1, 3], True), (1, 2, [0, 3, -1, 2], False),
    ([3, 2], [2, 3], [4, -1, 2, 2], True),
    (1, 1, [1, 1, 2, 2], False), ([2, 1], [1, 2], [3, 3, 0, 0], True),  # symmetric: padded by the convolution
])
def test_non_separable_matches_direct_evaluation(up, down, padding, flip_filter):
    rng = np.random.default_rng(0)
    x = rng.standard_normal([2, 2, 7, 6])
    f = rng.standard_normal([3, 4])  # asymmetric, so any transposition or missing flip shows
    y = upfirdn2d.upfirdn2d(torch.tensor(x), torch.tensor(f), up=up, down=down, padding=padding,
                            flip_filter=flip_filter, gain=0.7)
    expected = _direct_2d(x, f, upfirdn2d._parse_scaling(up), upfirdn2d._parse_scaling(down),
                          upfirdn2d._parse_padding(padding), flip_filter, 0.7)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_setup_filter():
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    np.testing.assert_allclose(f.numpy(), np.outer([1, 3, 3, 1], [1, 3, 3, 1]) / 64, rtol=1e-6)
    assert f.dtype == torch.float32
    f8 = upfirdn2d.setup_filter(np.arange(1, 9))  # 8 taps: kept separable
    assert f8.shape == (8,) and float(f8.sum()) == pytest.approx(1)
    g = upfirdn2d.setup_filter([1, 2, 3], gain=4, flip_filter=True, normalize=False)
    np.testing.assert_allclose(g.numpy(), 4 * np.outer([3, 2, 1], [3, 2, 1]))
    np.testing.assert_allclose(upfirdn2d.setup_filter([1, 2], separable=True, gain=4).numpy(), [2 / 3, 4 / 3])
    assert upfirdn2d.setup_filter(None).shape == (1, 1)


def test_resampling_wrappers_preserve_size_and_constants():
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    x = torch.full([1, 2, 8, 8], 3.0, dtype=torch.float64)
    up = upfirdn2d.upsample2d(x, f)
    down = upfirdn2d.downsample2d(x, f)
    same = upfirdn2d.filter2d(x, f)
    assert up.shape == (1, 2, 16, 16) and down.shape == (1, 2, 4, 4) and same.shape == (1, 2, 8, 8)
    # Away from the zero-padded border, a normalized filter keeps a constant image constant.
    torch.testing.assert_close(up[:, :, 2:-2, 2:-2], torch.full_like(up[:, :, 2:-2, 2:-2], 3.0))
    torch.testing.assert_close(down[:, :, 1:-1, 1:-1], torch.full_like(down[:, :, 1:-1, 1:-1], 3.0))
    torch.testing.assert_close(same[:, :, 2:-2, 2:-2], torch.full_like(same[:, :, 2:-2, 2:-2], 3.0))


@pytest.mark.parametrize('up, down, padding', [(2, 1, [2, 1, 2, 1]), (1, 2, [1, -1, 2, 1]), (2, 3, [0, 3, 2, 0])])
@pytest.mark.parametrize('separable', [False, True])
def test_gradcheck_and_gradgradcheck(up, down, padding, separable):
    torch.manual_seed(0)
    f = upfirdn2d.setup_filter([1, 2, 4, 1], separable=separable).double()
    x = torch.randn([1, 1, 4, 5], dtype=torch.float64, requires_grad=True)
    fn = lambda x: upfirdn2d.upfirdn2d(x, f, up=up, down=down, padding=padding, gain=1.5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, [x])
    assert torch.autograd.gradgradcheck(fn, [x], fast_mode=True)


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('up, down, padding', [(2, 1, [2, 1, 2, 1]), (1, 2, [1, 1, 1, 1]),
                                               ([1, 2], [3, 1], [-1, 2, 3, 0])])
def test_reference_path_gradients_equal_autograd_of_the_plain_ops(up, down, padding, layout):
    """upfirdn2d() on a CPU differentiates by its adjoint (_UpFirDn2d), not through the ops: values
    and gradients of both orders, as gradient normalization takes them, equal torch's autograd
    through _upfirdn2d_ref itself, for either layout of the input."""
    torch.manual_seed(0)
    f = torch.randn([3, 4], dtype=torch.float64)
    x = torch.randn([2, 3, 7, 9], dtype=torch.float64)
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    cfg = upfirdn2d._Config(up=upfirdn2d._parse_scaling(up), down=upfirdn2d._parse_scaling(down),
                            padding=upfirdn2d._parse_padding(padding), flip_filter=False, gain=1.3)

    def grads(fn):  # [y, dL/dx, d(<dL/dx, s>)/dx] for L = sum(r * y^2): the second pass runs through the backward
        torch.manual_seed(1)
        y = fn(x)
        first, = torch.autograd.grad((torch.randn(y.shape, dtype=y.dtype) * y * y).sum(), [x], create_graph=True)
        second, = torch.autograd.grad((first * torch.randn(first.shape, dtype=first.dtype)).sum(), [x])
        return y, first, second

    op = grads(lambda x: upfirdn2d.upfirdn2d(x, f, up=up, down=down, padding=padding, gain=1.3, impl='ref'))
    for actual, expected in zip(op, grads(lambda x: upfirdn2d._upfirdn2d_ref(x, f, cfg))):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def test_reference_path_under_autocast():
    """Under CPU autocast the reference op computes in bfloat16; its gradient arrives in the input's
    float32 and equals, to bfloat16 rounding, the float64 gradient of the plain ops."""
    torch.manual_seed(0)
    f = upfirdn2d.setup_filter([1, 2, 1])
    x = torch.randn([2, 3, 8, 8], requires_grad=True)
    r = torch.randn([2, 3, 4, 4])
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = upfirdn2d.downsample2d(x, f, impl='ref')  # padding (1, 0, 1, 0): see downsample2d
    g, = torch.autograd.grad((y.float() * r).sum(), [x])
    assert y.dtype == torch.bfloat16 and g.dtype == torch.float32
    x64 = x.detach().double().requires_grad_()
    cfg = upfirdn2d._Config(up=(1, 1), down=(2, 2), padding=(1, 0, 1, 0), flip_filter=False, gain=1.0)
    expected, = torch.autograd.grad((upfirdn2d._upfirdn2d_ref(x64, f.double(), cfg) * r.double()).sum(), [x64])
    torch.testing.assert_close(g.double(), expected, rtol=2 ** -6, atol=2 ** -8)


@pytest.mark.parametrize('up, down, padding', [(2, 1, [2, 1, 2, 1]), (1, 2, [0, 3, -1, 2]),
                                               ([3, 1], [2, 4], [4, 0, 1, 5])])
def test_adjoint_padding(up, down, padding):
    """The CUDA path's backward is upfirdn2d with the _Config.adjoint() arguments; checked here on
    the reference: <A x, y> = <x, A^T y> for random x, y."""
    torch.manual_seed(0)
    f = torch.randn([3, 4], dtype=torch.float64)
    x = torch.randn([2, 3, 7, 9], dtype=torch.float64)
    cfg = upfirdn2d._Config(up=upfirdn2d._parse_scaling(up), down=upfirdn2d._parse_scaling(down),
                            padding=upfirdn2d._parse_padding(padding), flip_filter=False, gain=1.3)
    ax = upfirdn2d._upfirdn2d_ref(x, f, cfg)
    y = torch.randn_like(ax)
    adjoint = cfg.adjoint(x.shape[3], x.shape[2], ax.shape[3], ax.shape[2], f.shape[1], f.shape[0])
    aty = upfirdn2d._upfirdn2d_ref(y, f, adjoint)
    assert aty.shape == x.shape
    torch.testing.assert_close((ax * y).sum(), (x * aty).sum())


def test_invalid_arguments_raise_clear_errors():
    x = torch.zeros([1, 1, 4, 4])
    with pytest.raises(ValueError, match='empty output'):
        upfirdn2d.upfirdn2d(x, torch.ones([9, 9]))
    with pytest.raises(ValueError, match='N, C, H, W'):
        upfirdn2d.upfirdn2d(torch.zeros([4, 4]), None)
    with pytest.raises(ValueError, match='padding'):
        upfirdn2d.upfirdn2d(x, None, padding=[1, 2, 3])


def test_plans_keep_the_most_recently_used_signatures(monkeypatch):
    """The plans per call signature are bounded (here to 3): a hit marks its signature used, a new signature beyond
    the bound drops the least recently used, which is planned afresh when it comes back; the values stay those of
    scipy's upfirdn."""
    from torch_utils import kernel_choice
    monkeypatch.setattr(upfirdn2d._plugin, 'plans', kernel_choice.LruCache(size=3))
    planned = []
    plan_call = upfirdn2d._plan_call
    monkeypatch.setattr(upfirdn2d, '_plan_call', lambda x, *args: planned.append(x.shape[-1]) or plan_call(x, *args))
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    for width in (5, 6, 7, 5, 8, 6):
        x = torch.randn([1, 1, 4, width], dtype=torch.float64)
        expected = upfirdn_1d(upfirdn_1d(x.numpy(), np.array([1., 3., 3., 1.]) / 8, 2, 1, 2, 1).swapaxes(-1, -2),
                               np.array([1., 3., 3., 1.]) / 8, 2, 1, 2, 1).swapaxes(-1, -2) * 4
        np.testing.assert_allclose(upfirdn2d.upsample2d(x, f).numpy(), expected, rtol=1e-12, atol=1e-12)
        assert len(upfirdn2d._plugin.plans) <= 3
    assert planned == [5, 6, 7, 8, 6]  # 5 was used again before 8 came, so 6 went: planned afresh.
    assert [key[2][-1] for key in upfirdn2d._plugin.plans] == [5, 8, 6]  # x.shape in each key, oldest first.


def test_filter_taps_cache_drops_the_least_recently_used_filter():
    """The taps cache (the CUDA path's flipped, gain-scaled filters, with a host copy that makes the host wait) keeps
    the filters used most recently: a hit marks its filter used, a new filter beyond the bound (here 3) drops the one
    unused the longest, and an in-place change of a filter rebuilds its entry without adding one. The taps are
    np.flip(f) * gain."""
    cache = upfirdn2d._TapCache(size=3)
    filters = {name: torch.tensor(values, dtype=torch.float64) for name, values in
               [('a', [1., 2., 3.]), ('b', [1., 3., 3., 1.]), ('c', [2., 1.]), ('d', [1., 4., 6., 4.])]}
    built = {}

    def get(name):
        taps, host = cache.get(filters[name], True, 2.0, (1, len(filters[name])), torch.float32)
        expected = np.flip(filters[name].numpy()) * 2.0
        np.testing.assert_array_equal(taps.numpy(), expected[np.newaxis].astype(np.float32))
        assert host == expected.tolist()
        is_new = built.get(name) is not taps
        built[name] = taps
        return is_new

    assert [get(name) for name in 'abc'] == [True] * 3
    assert not get('a')             # A hit: 'a' is now the most recently used, 'b' the least.
    assert get('d')                 # One more: 'b' is dropped.
    assert [get(name) for name in 'acd'] == [False] * 3
    assert get('b')                 # Built again; 'a' was the least recently used.
    assert len(cache.entries) == 3 and [entry[0] is filters[name] for entry, name in zip(cache.entries.values(), 'cdb')] == [True] * 3
    with torch.no_grad():
        filters['d'].mul_(0.5)      # As G_ema's buffers are written after every G step.
    assert get('d') and len(cache.entries) == 3



def test_a_training_filter_stays_cached_among_more_new_filters_than_the_cache_holds(host_kernels, cpu_kernel_path,
                                                                                   monkeypatch):
    """On the kernel path (the host build of the kernels serving CPU tensors), a filter used at every step between 300
    new filters, 256 fitting in the taps cache, is never built again: no copy of its taps to the host (a host
    synchronisation on a GPU, and a failed capture inside a CUDA graph). tests/test_ops_gpu.py runs the same on CUDA."""
    from tests.support.host_plugin import HostPlugin
    cpu_kernel_path(HostPlugin(host_kernels))
    monkeypatch.setattr(upfirdn2d, '_taps', upfirdn2d._TapCache())
    assert training_filter_among_other_filters(torch.device('cpu'), monkeypatch) == 0
