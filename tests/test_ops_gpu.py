"""The CUDA kernels of ops/ on a GPU: the real JIT build, and CUDA against the float64 reference.

Every test here needs a CUDA GPU and skips without one. With a GPU, the `plugins` fixture FAILS
(never skips) when either plugin does not build, so a broken build cannot pass as "the reference
compared with itself"; and every comparison counts the kernel launches to assert that the CUDA
autograd Functions ran. References are the ops' PyTorch implementations in float64 (impl='ref',
or the reference path of the whole network with the plugins switched off), so a kernel in
float16/bfloat16 is held to the precision of its dtype, not to another low-precision result.
"""

import collections
import contextlib
import copy
import warnings

import pytest
import torch

from ops import bias_act, conv2d_resample, upfirdn2d
from tests.support.kernel_cases import (SPECIALISATIONS, UPFIRDN2D_CASES, training_filter_among_other_filters,
                                        two_deterministic_runs)
from torch_utils import custom_ops, kernel_choice
from training.networks import biggan, sngan, stylegan
from training.step.loss import GANLoss

pytestmark = pytest.mark.gpu

PLUGINS = {'bias_act': bias_act._plugin, 'upfirdn2d': upfirdn2d._plugin}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Largest max|kernel - reference| / max|reference| per quantity (value, gradients), by dtype: a few
# roundings of the dtype (float16: 2^-11, bfloat16: 2^-8) on each of the passes that produce a quantity.
RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.fixture(scope='module')
def plugins():
    """Both plugins, built (or loaded from the cache) through custom_ops. A failed build fails the test."""
    for name, plugin in PLUGINS.items():
        try:
            plugin.module = custom_ops.get_plugin(**plugin.plugin_args)
        except custom_ops.BuildError as err:
            pytest.fail(f'{name}: the CUDA plugin does not build on this GPU machine: {err}')
        plugin.failed = False
    return PLUGINS


@pytest.fixture
def kernel_calls(plugins, monkeypatch, switches):
    """Counts kernel launches per op; self-check and chooser are off, so every launch belongs to the test."""
    calls = collections.Counter()
    for name, op in (('bias_act', bias_act), ('upfirdn2d', upfirdn2d)):
        def spy(*args, _name=name, _run=op._run_kernel, **kwargs):
            calls[_name] += 1
            return _run(*args, **kwargs)
        monkeypatch.setattr(op, '_run_kernel', spy)
        op._plugin.plans = {}  # decided afresh, under the switches below
    monkeypatch.setenv(kernel_choice.SELF_CHECK_ENV, '0')
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '0')
    switches(cudnn_tf32=False, matmul_tf32=False)  # float32 convolutions and matmuls in float32
    return calls


@contextlib.contextmanager
def reference_ops():
    """Within this context every op takes its reference path, whatever the device (the plugins look disabled)."""
    saved = {name: plugin.device_type for name, plugin in PLUGINS.items()}
    for plugin in PLUGINS.values():
        plugin.device_type = 'reference-only'
    try:
        yield
    finally:
        for name, plugin in PLUGINS.items():
            plugin.device_type = saved[name]


def _derivatives(fn, inputs, seed=1):
    """[y, first-order gradients, second-order gradients] of fn at inputs, as in the self-check's pattern.

    The cotangents are drawn in float64 from a fixed generator, so a float16 run and its float64
    reference see the same values; the targets sum(r * y^2) and sum(r_i * g_i) are computed in float64.
    """
    y = fn(*inputs)
    generator = torch.Generator(device=y.device).manual_seed(seed)
    r = torch.randn(y.shape, generator=generator, device=y.device, dtype=torch.float64)
    first = torch.autograd.grad((r * y.double().square()).sum(), inputs, create_graph=True)
    r_first = [torch.randn(g.shape, generator=generator, device=y.device, dtype=torch.float64) for g in first]
    second = torch.autograd.grad(sum((g.double() * q).sum() for g, q in zip(first, r_first)), inputs,
                                 allow_unused=True)
    return [y, *first, *second]


def _assert_matches_float64(actual, expected, dtype):
    tolerance = RELATIVE_TOLERANCE[dtype]
    for index, (a, e) in enumerate(zip(actual, expected)):
        if a is None or e is None:
            assert (a is None or not a.any()) and (e is None or not e.any()), f'quantity {index}'
            continue
        assert a.shape == e.shape and a.dtype == dtype, f'quantity {index}: {a.shape} {a.dtype}'
        error = (a.double() - e).abs().max().item()
        scale = max(e.abs().max().item(), 1e-3)
        assert error <= tolerance * scale, f'quantity {index}: max error {error:.3g}, magnitude {scale:.3g}'


def _leaf(x, dtype, requires_grad=True):
    return x.detach().to(dtype).requires_grad_(requires_grad)


def _compare_op(op, inputs, dtype):
    """op's kernel path in dtype against its reference path in float64, on the same (dtype-rounded) input values."""
    low = [_leaf(x, dtype) for x in inputs]
    with reference_ops():
        expected = _derivatives(op, [_leaf(x, torch.float64) for x in low])
    actual = _derivatives(op, low)
    _assert_matches_float64(actual, expected, dtype)
    return actual

# ----------------------------------------------------------------------------
# Build and self-check.


def test_plugins_build_and_pass_their_self_check(plugins, monkeypatch):
    """With the self-check on, the configurations the networks use run silently and keep the kernels."""
    monkeypatch.delenv(kernel_choice.SELF_CHECK_ENV, raising=False)
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '0')
    for plugin in plugins.values():
        for attribute in ('verdicts', 'check_results'):
            monkeypatch.setattr(plugin, attribute, {})
        for attribute in ('module', 'failed'):  # restored after the test even if a check disables the kernel
            monkeypatch.setattr(plugin, attribute, getattr(plugin, attribute))
    x = torch.randn([4, 8, 16, 16], device='cuda')
    blur, box = upfirdn2d.setup_filter([1, 2, 1], device='cuda'), upfirdn2d.setup_filter([1, 1], device='cuda')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        for dtype in DTYPES:
            for act in bias_act.activation_funcs:
                bias_act.bias_act(x.to(dtype), torch.zeros([8], device='cuda'), act=act)
            for f in (blur, box):
                upfirdn2d.upsample2d(x.to(dtype), f)
                upfirdn2d.downsample2d(x.to(dtype), f)
            upfirdn2d.filter2d(x.to(dtype), blur)
    assert all(plugin.get() is not None for plugin in plugins.values())
    assert len(plugins['bias_act'].check_results) == len(DTYPES) * len(bias_act.activation_funcs)
    assert len(plugins['upfirdn2d'].check_results) == len(DTYPES) * 5
    for plugin in plugins.values():
        for config, result in plugin.check_results.items():
            assert result['error'] <= result['tolerance'], config



def test_chooser_times_both_paths_on_the_gpu(plugins, monkeypatch):
    """With CUDA events: one choice per configuration and shape, both times positive, the result right either way."""
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '1')
    plugin = plugins['upfirdn2d']
    monkeypatch.setattr(plugin, 'choices', {})
    blur = upfirdn2d.setup_filter([1, 2, 1], device='cuda')
    for shape in ([8, 64, 128, 128], [8, 64, 32, 32]):
        x = torch.randn(shape, device='cuda')
        y = upfirdn2d.upsample2d(x, blur)
        torch.testing.assert_close(y, upfirdn2d.upsample2d(x, blur, impl='ref'), rtol=1e-4, atol=1e-4)
    assert len(plugin.choices) == 2
    for choice in plugin.choices.values():
        assert choice['kernel_ms'] > 0 and choice['reference_ms'] > 0
        assert choice['kernel'] == (choice['kernel_ms'] <= choice['reference_ms'])

# ----------------------------------------------------------------------------
# bias_act.


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_bias_act(kernel_calls, act, dtype):
    torch.manual_seed(0)
    x = torch.randn([4, 16, 9, 9], device='cuda') * 2
    b = torch.randn([16], device='cuda')
    for clamp in (None, 1.0):
        _compare_op(lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp), [x, b], dtype)
    assert kernel_calls['bias_act'] >= 4


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize('layout', ['channels_last', 'sliced', 'misaligned'])
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_bias_act_channels_last_and_sliced(kernel_calls, act, layout, dtype):
    """Layouts other than contiguous NCHW; misaligned: contiguous, one element past an aligned address (the
    scalar kernels)."""
    torch.manual_seed(0)
    big = (torch.randn([4, 20, 9, 12], device='cuda') * 2).to(dtype)
    x = big[:, 2:18, :, 1:10]  # sliced: strided in channels and width
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == 'misaligned':
        x = torch.empty([x.numel() + 1], device='cuda', dtype=dtype)[1:].view(x.shape).copy_(x)
    x.requires_grad_()
    b = _leaf(torch.randn([16], device='cuda'), dtype)
    with reference_ops():
        expected = _derivatives(lambda x, b: bias_act.bias_act(x, b, act=act), [_leaf(x, torch.float64),
                                                                                 _leaf(b, torch.float64)])
    actual = _derivatives(lambda x, b: bias_act.bias_act(x, b, act=act), [x, b])
    _assert_matches_float64(actual, expected, dtype)
    assert kernel_calls['bias_act'] >= 2
    assert actual[0].is_contiguous(memory_format=torch.channels_last) == (layout == 'channels_last')
    assert actual[0].is_contiguous() == (layout != 'channels_last')


@pytest.mark.parametrize('numel', [3 * 2 ** 30, 2 ** 32 + 2 ** 20], ids=['launches-inside-runs', 'runs-beyond-a-launch'])
def test_bias_act_beyond_2_to_the_31_elements(kernel_calls, numel):
    """float16 tensors with flat indices past 2^31, which the kernels cover in launches of 2^30 elements with
    32-bit indices: with 3 * 2^30 elements, launches start inside a channel's run; with 2^32 + 2^20, each run
    (2^30 + 2^18) is longer than a launch. Checked on slices at the start, middle and end of each channel."""
    channels = 4
    inner = numel // channels
    needed = 4 * numel * 2 + 2 ** 30  # x, y, dy, dx in float16, plus room for the comparison slices
    if torch.cuda.mem_get_info()[0] < needed:
        pytest.skip(f'needs {needed / 2 ** 30:.0f} GiB of free GPU memory')
    pattern = torch.randn([1021], device='cuda', dtype=torch.float16) * 3  # period prime to the channel stride
    x = pattern.repeat(numel // 1021 + 1)[:numel].view(channels, inner).requires_grad_()
    b = torch.tensor([0.5, -1.0, 2.0, -0.25], device='cuda', dtype=torch.float16)
    y = bias_act.bias_act(x, b, dim=0, act='swish', gain=1.0)
    dx, = torch.autograd.grad(y, x, torch.full_like(y, 0.5))
    assert kernel_calls['bias_act'] == 2  # forward and first-order kernels over the whole tensor
    for channel in range(channels):
        for start in (0, inner // 2 - 7, inner - 4096):
            piece = x.detach()[channel, start:start + 4096].double().requires_grad_()
            expected = bias_act.bias_act(piece, b[channel:channel + 1].double().expand(4096), dim=0, act='swish',
                                         gain=1.0, impl='ref')
            expected_dx, = torch.autograd.grad(expected, piece, torch.full_like(expected, 0.5))
            torch.testing.assert_close(y[channel, start:start + 4096].double(), expected, rtol=2e-3, atol=2e-3)
            torch.testing.assert_close(dx[channel, start:start + 4096].double(), expected_dx, rtol=2e-3, atol=2e-3)

# ----------------------------------------------------------------------------
# upfirdn2d and the resampling the networks use.


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('case', UPFIRDN2D_CASES, ids=str)
def test_upfirdn2d(kernel_calls, case, dtype):
    taps, up, down, padding, flip_filter, gain = case
    torch.manual_seed(0)
    f = torch.randn(taps) if isinstance(taps, tuple) else upfirdn2d.setup_filter(taps, separable=len(taps) >= 8)
    f = f.cuda()
    x = torch.randn([4, 8, 16, 17], device='cuda')
    args = dict(up=up, down=down, padding=padding, flip_filter=flip_filter, gain=gain)
    _compare_op(lambda x: upfirdn2d.upfirdn2d(x, f, **args), [x], dtype)
    assert kernel_calls['upfirdn2d'] >= 3


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('up, down, taps', SPECIALISATIONS, ids=str)
def test_upfirdn2d_specialisations(kernel_calls, up, down, taps, layout, dtype):
    """Each compile-time specialisation on images spanning several thread blocks, in both layouts."""
    torch.manual_seed(taps)
    f = torch.randn([taps, taps], device='cuda')
    x = torch.randn([3, 5, 37, 70], device='cuda')
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    padding = [taps // 2, (taps - 1) // 2, taps - 1, 0]
    actual = _compare_op(lambda x: upfirdn2d.upfirdn2d(x, f, up=up, down=down, padding=padding), [x], dtype)
    assert actual[0].is_contiguous(memory_format=torch.channels_last) == (layout == 'channels_last')
    assert kernel_calls['upfirdn2d'] >= 3


_NETWORK_RESAMPLING = {  # what stylegan.py does to its feature maps and images
    'blur [1,2,1]': lambda x, blur, box: upfirdn2d.filter2d(x, blur),
    'upsample [1,2,1]': lambda x, blur, box: upfirdn2d.upsample2d(x, blur),
    'downsample [1,2,1]': lambda x, blur, box: upfirdn2d.downsample2d(x, blur),
    'upsample box': lambda x, blur, box: upfirdn2d.upsample2d(x, box),  # fade-in of G's toRGB
    'downsample box': lambda x, blur, box: upfirdn2d.downsample2d(x, box),  # fade-in of D's fromRGB
}


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('resolution', [4, 8, 16, 32])
@pytest.mark.parametrize('name', list(_NETWORK_RESAMPLING))
def test_network_resampling(kernel_calls, name, resolution, dtype):
    blur, box = upfirdn2d.setup_filter([1, 2, 1], device='cuda'), upfirdn2d.setup_filter([1, 1], device='cuda')
    torch.manual_seed(resolution)
    x = torch.randn([4, 16, resolution, resolution], device='cuda')
    op = _NETWORK_RESAMPLING[name]
    actual = _compare_op(lambda x: op(x, blur, box), [x], dtype)
    assert kernel_calls['upfirdn2d'] >= 3
    x_cl = _leaf(x, dtype).contiguous(memory_format=torch.channels_last)
    y_cl = op(x_cl, blur, box)
    assert y_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y_cl, actual[0], rtol=0, atol=0)  # same kernel, same values, other layout


_CONV2D_RESAMPLE_PATHS = [  # (kernel size, up, down): each code path of conv2d_resample with the box filter
    (3, 1, 1), (3, 2, 1), (3, 1, 2), (1, 2, 1), (1, 1, 2), (3, 2, 2),
]


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('k, up, down', _CONV2D_RESAMPLE_PATHS)
def test_conv2d_resample_paths(kernel_calls, k, up, down, dtype):
    box = upfirdn2d.setup_filter([1, 1], device='cuda')
    torch.manual_seed(0)
    x = torch.randn([4, 8, 16, 16], device='cuda')
    w = torch.randn([6, 8, k, k], device='cuda') / (8 * k * k) ** 0.5
    _compare_op(lambda x, w: conv2d_resample.conv2d_resample(x, w, f=box, up=up, down=down, padding=k // 2),
                [x, w], dtype)
    assert kernel_calls['upfirdn2d'] >= (0 if up == down == 1 else 3)


def test_upfirdn2d_more_than_65535_planes(kernel_calls):
    """The grid's z dimension stops at 65535; the kernel loops over the remaining image planes."""
    planes = 70_001
    if torch.cuda.mem_get_info()[0] < planes * 8 * 8 * 4 * 8:
        pytest.skip('not enough free GPU memory')
    blur = upfirdn2d.setup_filter([1, 2, 1], device='cuda')
    torch.manual_seed(0)
    x = torch.randn([1, planes, 8, 8], device='cuda')
    for op in (upfirdn2d.upsample2d, upfirdn2d.downsample2d):
        actual = _compare_op(lambda x: op(x, blur), [x], torch.float32)
        assert torch.isfinite(actual[0][0, -1]).all() and actual[0][0, -1].abs().sum() > 0  # the last plane
    assert kernel_calls['upfirdn2d'] >= 6


def test_a_training_filter_stays_cached_and_never_syncs_among_other_filters(kernel_calls, monkeypatch):
    """A filter used at every step between 300 new filter buffers (256 fit in the taps cache) keeps its taps: none of
    its calls copies them to the host, which CUDA's synchronisation watch would raise on (set_sync_debug_mode('error'))
    and which would fail a capture (tests/test_upfirdn2d.py runs the same on the host build of the kernels)."""
    monkeypatch.setattr(upfirdn2d, '_taps', upfirdn2d._TapCache())
    assert training_filter_among_other_filters(torch.device('cuda'), monkeypatch) == 0
    assert kernel_calls['upfirdn2d'] >= 2 * 301


def test_two_deterministic_runs_make_the_same_choices_whatever_the_clock_says(kernel_calls, monkeypatch):
    """Under --deterministic the kernel-or-reference choice is never timed: two runs whose clocks disagree (the
    reference faster in one, the kernel in the other) compute the same bits on the device, through the kernels
    (tests/test_kernel_choice.py runs the same on the host build of the kernels)."""
    timed, first, second = two_deterministic_runs(torch.device('cuda'), monkeypatch)
    assert timed == [] and kernel_calls['upfirdn2d'] > 0 and kernel_calls['bias_act'] > 0
    assert all(torch.equal(a, b) for a, b in zip(first, second))

# ----------------------------------------------------------------------------
# A whole GN discriminator step.


def _tiny_networks(family):
    torch.manual_seed(0)
    if family == 'sngan-cnn':
        return (sngan.CNNGenerator(c_dim=0, img_resolution=16, img_channels=3, z_dim=16, ch=8),
                sngan.CNNDiscriminator(c_dim=0, img_resolution=16, img_channels=3, ch=8), 0)
    if family == 'sngan-resnet':
        return (sngan.ResNetGenerator(c_dim=0, img_resolution=32, img_channels=3, ch=8),
                sngan.ResNetDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=8), 0)
    if family == 'biggan':
        return (biggan.BigGANGenerator(c_dim=10, img_resolution=32, img_channels=3, ch=8),
                biggan.BigGANDiscriminator(c_dim=10, img_resolution=32, img_channels=3, ch=8), 10)
    kwargs = dict(c_dim=0, img_resolution=32, img_channels=3, fmap_base=64, fmap_max=16)
    return (stylegan.Generator(z_dim=16, w_dim=16, mapping_kwargs=dict(layer_features=16), style_mixing_prob=0,
                               **kwargs),
            stylegan.Discriminator(**kwargs), 0)


def _discriminator_step(G, D, c_dim, device, dtype=torch.float32):
    """D's parameter gradients after one GN hinge D step (training/loss.GANLoss) on a fixed batch, in `dtype`.

    Works on copies: a step changes state besides the gradients (BigGAN G's spectral-norm vectors).
    """
    G, D = copy.deepcopy(G).to(device, dtype), copy.deepcopy(D).to(device, dtype)
    generator = torch.Generator().manual_seed(1)
    real = (torch.rand([8, 3, D.img_resolution, D.img_resolution], generator=generator) * 2 - 1).to(device, dtype)
    z = torch.randn([8, G.z_dim], generator=generator).to(device, dtype)
    c = torch.eye(max(c_dim, 1))[torch.randint(max(c_dim, 1), [8], generator=generator)][:, :c_dim].to(device, dtype)
    torch.manual_seed(2)  # G's noise inputs (zero strength at init) and anything else drawn in the step
    GANLoss(G, D, loss='hinge', norm='gn').accumulate_gradients('D', real, c, z, c)
    return {name: p.grad.detach().double().cpu() for name, p in D.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('family', ['sngan-cnn', 'sngan-resnet', 'biggan', 'stylegan'])
def test_gn_discriminator_step(kernel_calls, family):
    """The float32 GPU step (with the kernels where the network uses ops/) and the float32 CPU step, each against
    the float64 CPU step: the GPU's error is at most a small multiple of the CPU's (GN's division can magnify
    rounding, on either device, so GPU and CPU are not compared with each other).

    SN-GAN and BigGAN use no custom op (their step checks cuDNN and GN's double backward on the
    GPU); StyleGAN's runs bias_act and upfirdn2d, once with the kernels and once with the plugins
    off on the same GPU, where the two must agree more tightly than GPU and CPU do.
    """
    G, D, c_dim = _tiny_networks(family)
    expected = _discriminator_step(G, D, c_dim, 'cpu', torch.float64)
    on_cpu = _discriminator_step(G, D, c_dim, 'cpu')
    actual = _discriminator_step(G, D, c_dim, 'cuda')
    assert actual.keys() == expected.keys() == on_cpu.keys() and len(actual) > 0
    for name, grad in expected.items():
        scale = max(grad.abs().max().item(), 1e-6)
        cpu_error, gpu_error = ((x[name] - grad).abs().max().item() for x in (on_cpu, actual))
        assert gpu_error <= max(10 * cpu_error, 1e-4 * scale), f'{name}: GPU {gpu_error:.3g}, CPU {cpu_error:.3g}, scale {scale:.3g}'
    if family == 'stylegan':
        assert kernel_calls['bias_act'] > 0 and kernel_calls['upfirdn2d'] > 0
        with reference_ops():
            reference_on_gpu = _discriminator_step(G, D, c_dim, 'cuda')
        for name, grad in reference_on_gpu.items():
            scale = max(grad.abs().max().item(), 1e-6)
            assert (actual[name] - grad).abs().max().item() <= 1e-4 * scale, name
    else:
        assert sum(kernel_calls.values()) == 0
