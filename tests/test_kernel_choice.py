"""Tests of torch_utils/kernel_choice.py: whether an op's kernel or its reference serves a call.

The host build of the kernels' arithmetic (tests/support/host_plugin.py) serves CPU tensors routed through the
ops' kernel path, so that without a GPU:
  * a call whose metadata was seen before only looks up its plan, and replacing the verdicts or
    choices plans afresh;
  * a deliberately broken kernel (wrong values, a failed launch, a missing loop over planes or
    grid strides) fails its self-check with one warning, and only its configuration falls back
    to the reference; a training step goes on;
  * a failed build warns once and the op falls back to its reference; CPU tensors take the
    reference without a warning;
  * the chooser between kernel and reference, driven by a fake clock, keeps the faster path.
"""

import collections
import contextlib
import os
import re
import sys
import warnings
from typing import Iterator

import pytest
import torch

from ops import bias_act, upfirdn2d
from tests.support.host_plugin import OPS_DIR, HostPlugin, UpsamplingOnePercentOff, input_in_layout
from tests.support.kernel_cases import two_deterministic_runs
from torch_utils import custom_ops, devices, kernel_choice


@contextlib.contextmanager
def own_warnings() -> Iterator[list]:
    """Every warning raised inside, recorded; not the ResourceWarnings of other tests' objects collected meanwhile."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        warnings.simplefilter('ignore', ResourceWarning)
        yield caught


# Host work per call: after the first call with given metadata, the wrappers only look up their plan.

_OPS_FILES = (os.path.realpath(bias_act.__file__), os.path.realpath(upfirdn2d.__file__),
              os.path.realpath(kernel_choice.__file__), os.path.realpath(custom_ops.__file__))


def _project_calls(fn):
    """Counter of (file, function) of the Python calls into ops/, kernel_choice.py and custom_ops.py during fn()."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == 'call' and os.path.realpath(frame.f_code.co_filename) in _OPS_FILES:
            calls[os.path.basename(frame.f_code.co_filename), frame.f_code.co_name] += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


# What a call with known metadata may run of ours: the wrapper, the autograd Functions, the kernel launch.
_PER_CALL = {('bias_act.py', name) for name in ('bias_act', '_apply_kernel', 'forward', 'backward', '_run_kernel',
                                                '_bias_grad', '<listcomp>')} | \
            {('upfirdn2d.py', name) for name in ('upsample2d', '_wrapper_config', '_hashable', '_upfirdn2d', 'forward',
                                                 'backward', '_run_kernel', 'get')} | \
            {('kernel_choice.py', name) for name in ('usable', 'get')}


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_repeated_calls_only_look_up_their_plan(host_kernels, cpu_kernel_path, layout):
    """No new configuration objects, checks, Functions or timings after the first call of a configuration."""
    plugin = cpu_kernel_path(HostPlugin(host_kernels))
    x = input_in_layout(layout).requires_grad_()
    b = torch.randn([3], dtype=torch.float64, requires_grad=True)
    f = upfirdn2d.setup_filter([1, 2, 1])

    def step():
        y = upfirdn2d.upsample2d(bias_act.bias_act(x, b, act='swish', clamp=2.0), f)
        torch.autograd.grad(y.square().sum(), [x, b])
    step()  # plans, self-checks
    state = [(len(op._plugin.plans), len(op._plugin.verdicts)) for op in (bias_act, upfirdn2d)]
    functions = {cls for cls in torch.autograd.Function.__subclasses__()}
    plugin.calls.clear()
    calls = _project_calls(step)
    assert set(calls) <= _PER_CALL, set(calls) - _PER_CALL
    assert calls['bias_act.py', 'bias_act'] == 1 and calls['upfirdn2d.py', '_upfirdn2d'] == 1
    assert plugin.calls['bias_act', 0] == 1 and plugin.calls['upfirdn2d', 0] == 2  # on the kernels (upfirdn2d: and adjoint)
    assert state == [(len(op._plugin.plans), len(op._plugin.verdicts)) for op in (bias_act, upfirdn2d)]
    assert functions == {cls for cls in torch.autograd.Function.__subclasses__()}


def test_replacing_verdicts_or_choices_plans_afresh(host_kernels, cpu_kernel_path):
    """The plans follow from the self-check's verdicts and the chooser's choices: replacing them re-decides."""
    cpu_kernel_path(HostPlugin(host_kernels))
    x = input_in_layout('contiguous')
    bias_act.bias_act(x, None, act='tanh')
    assert len(bias_act._plugin.plans) == 1 and len(bias_act._plugin.check_results) == 1
    bias_act._plugin.check_results.clear()
    bias_act._plugin.verdicts = {}
    assert bias_act._plugin.plans == {}
    bias_act.bias_act(x, None, act='tanh')
    assert len(bias_act._plugin.check_results) == 1  # checked again
    bias_act._plugin.choices = {}
    assert bias_act._plugin.plans == {}


def test_plans_and_choices_keep_the_most_recently_used_signatures(monkeypatch):
    """The tables per call signature are LruCaches of PLAN_CACHE_SIZE entries, whatever is assigned to them: storing
    one more drops the least recently used, and faster() marks a choice it reads as used."""
    plugin = kernel_choice.LazyPlugin('op', module_name='none', sources=[], headers=[], source_dir='')
    for table in ('plans', 'choices'):
        setattr(plugin, table, {'a': 1})
        assert isinstance(getattr(plugin, table), kernel_choice.LruCache) and getattr(plugin, table).size == 4096
    cache = kernel_choice.LruCache(size=3)
    for key in 'abcd':
        cache[key] = key
    assert list(cache) == ['b', 'c', 'd']
    cache.move_to_end('b')
    cache['e'] = 'e'
    assert list(cache) == ['d', 'b', 'e']
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '1')
    monkeypatch.setattr(plugin, 'timer', lambda fn, device: fn() or 1.0)
    plugin.choices = kernel_choice.LruCache(size=2)
    x = torch.zeros([2])
    for key in ('x', 'y', 'x', 'z'):
        plugin.faster(key, torch.neg, torch.neg, x)
    assert list(plugin.choices) == ['x', 'z']  # x was read again before z came, so y went.


# ----------------------------------------------------------------------------
# Self-check: failures stay with their configuration.


class _WithoutSecondDerivative(HostPlugin):
    """bias_act whose act'' term is lost (what the contiguity bug did): mode 2 returns zeros."""

    def bias_act(self, *args):
        out = super().bias_act(*args)
        return torch.zeros_like(out) if args[5] == 2 else out


class _UpsamplingCannotLaunch(HostPlugin):
    """upfirdn2d whose upsampling kernel fails to launch, as one built for another GPU would."""

    def upfirdn2d(self, x, f, taps, up_x, *args):
        if up_x > 1:
            raise RuntimeError('CUDA error: no kernel image is available for execution on the device')
        return super().upfirdn2d(x, f, taps, up_x, *args)


class _WithoutPlaneLoop(HostPlugin):
    """upfirdn2d without the loop over planes beyond the grid: with max_grid_z > 0, later planes stay 0."""

    def upfirdn2d(self, *args):
        out = super().upfirdn2d(*args)
        max_grid_z = args[-1]
        if max_grid_z:
            out.view(-1, *out.shape[2:])[max_grid_z:] = 0
        return out


class _WithoutGridStrideLoop(HostPlugin):
    """bias_act without the grid-stride loop: with max_blocks > 0, elements beyond max_blocks * 256 vectors stay 0."""

    def bias_act(self, *args):
        out = super().bias_act(*args)
        max_blocks, width = args[-2], 16 // args[0].element_size()
        if max_blocks:
            out.view(-1)[max_blocks * 256 * width:] = 0
        return out


def _bias_act_pair(x):
    """(swish: smooth, uses the second-derivative mode; relu: piecewise linear, never does)."""
    b = torch.linspace(-1, 1, x.shape[1], dtype=x.dtype)
    return bias_act.bias_act(x, b, act='swish'), bias_act.bias_act(x, b, act='relu')


def _upfirdn2d_pair(x):
    """(upsampling by 2: the config broken below; a 3x3 blur at the same size: a healthy one)."""
    f = upfirdn2d.setup_filter([1, 2, 1])
    return upfirdn2d.upsample2d(x, f), upfirdn2d.filter2d(x, f)


def _reference_pair(pair, x):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('error')
        plugins = (bias_act._plugin, upfirdn2d._plugin)
        saved = [plugin.device_type for plugin in plugins]
        for plugin in plugins:
            plugin.device_type = 'cuda'  # the CPU tensors take the reference path
        try:
            return pair(x)
        finally:
            for plugin, device_type in zip(plugins, saved):
                plugin.device_type = device_type


@pytest.mark.parametrize('plugin_class, pair, cause', [
    (_WithoutSecondDerivative, _bias_act_pair, 'second-order gradient w.r.t. x off by'),
    (UpsamplingOnePercentOff, _upfirdn2d_pair, 'off by'),
    (_UpsamplingCannotLaunch, _upfirdn2d_pair, 'RuntimeError: CUDA error: no kernel image is available'),
], ids=lambda value: getattr(value, '__name__', None))
def test_self_check_failure_stays_with_its_config(host_kernels, cpu_kernel_path, plugin_class, pair, cause):
    """One warning naming op, config and cause; the broken config gets the reference, a second keeps the kernel."""
    plugin = cpu_kernel_path(plugin_class(host_kernels))
    x = input_in_layout('contiguous')
    state = torch.get_rng_state()
    with own_warnings() as caught:
        first = pair(x)
        plugin.calls.clear()
        second = pair(x)
    assert torch.equal(torch.get_rng_state(), state)  # the check draws from its own generator
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    op = 'bias_act' if pair is _bias_act_pair else 'upfirdn2d'
    assert message.startswith(f'{op}: the CUDA kernel failed its self-check for cpu, float64, ')
    assert cause in message and 'uses the reference implementation from now on, others keep the kernel' in message
    if 'off by' in cause:
        error = float(re.search(r'off by ([0-9.e+-]+)', message).group(1))
        if plugin_class is UpsamplingOnePercentOff:
            # Each quantity passes through the broken upsampling once or twice (the adjoint, a downsampling, is
            # right): it is 1.01 or 1.0201 times the reference's. Per element against |q_i| + rms(q), the worst
            # element is off by e * max|q| / (max|q| + rms(q)) with e = 0.01 or 0.0201: between 0.005 and 0.0201.
            assert 0.01 / 2 < error < 0.0201
        else:
            assert error > 0.1
    expected = _reference_pair(pair, x)
    for results in (first, second):
        for y, e in zip(results, expected):
            torch.testing.assert_close(y, e, rtol=1e-9, atol=1e-9)  # the broken config is never served
    healthy_calls = plugin.calls[op, 0]
    assert healthy_calls > 0  # the second config still runs on the kernel
    if op == 'upfirdn2d':
        assert healthy_calls == 1 and plugin.served == {3: plugin.served[3]}  # the 3x3 blur, specialised


@pytest.mark.parametrize('plugin_class, pair', [(_WithoutPlaneLoop, _upfirdn2d_pair),
                                                (_WithoutGridStrideLoop, _bias_act_pair)],
                         ids=lambda value: getattr(value, '__name__', None))
def test_self_check_reaches_beyond_the_first_grid(host_kernels, cpu_kernel_path, plugin_class, pair):
    """A kernel that forgets the planes or elements beyond one grid fails its check (the old inputs fit one block)."""
    cpu_kernel_path(plugin_class(host_kernels))
    with own_warnings() as caught:
        pair(input_in_layout('contiguous'))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and all(' off by ' in m for m in messages), messages  # both configs


def test_self_check_can_be_switched_off(host_kernels, cpu_kernel_path, monkeypatch):
    cpu_kernel_path(UpsamplingOnePercentOff(host_kernels))
    monkeypatch.setenv(kernel_choice.SELF_CHECK_ENV, '0')
    x = input_in_layout('contiguous')
    f = upfirdn2d.setup_filter([1, 2, 1])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        y = upfirdn2d.upsample2d(x, f)
    torch.testing.assert_close(y, upfirdn2d.upsample2d(x, f, impl='ref') * 1.01)  # the kernel, unchecked


def test_training_step_survives_a_kernel_that_cannot_launch(host_kernels, cpu_kernel_path):
    """A StyleGAN G and D step where upsampling's kernel fails at launch: warnings, then reference values."""
    from training.networks import stylegan
    plugin = cpu_kernel_path(_UpsamplingCannotLaunch(host_kernels))
    torch.manual_seed(0)
    G = stylegan.Generator(c_dim=0, img_resolution=16, img_channels=1, z_dim=8, w_dim=8, fmap_base=32, fmap_max=8)
    D = stylegan.Discriminator(c_dim=0, img_resolution=16, img_channels=1, fmap_base=32, fmap_max=8)
    G.set_lod(0.5)  # fading in 16x16: the upsampled 8x8 image and the new level
    D.set_lod(0.5)
    z = torch.randn([4, 8])

    def step():
        torch.manual_seed(1)  # the same per-layer noise each time
        G.zero_grad()
        D.zero_grad()
        D(G(z, None), None).square().sum().backward()
        return [p.grad.clone() for p in [*G.parameters(), *D.parameters()] if p.grad is not None]
    with own_warnings() as caught:
        grads = step()
        step()
    # One warning per configuration that needs the upsampling kernel: G's 2x upsampling, and D's 2x
    # downsampling, whose gradient upsamples; none on the second step.
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2 and all('(RuntimeError: CUDA error: no kernel image' in m for m in messages)
    assert 'down=(2, 2)' in messages[0] and 'up=(2, 2)' in messages[1]
    assert plugin.calls['bias_act', 0] > 0 and plugin.served[3] > 0  # the other configs keep their kernels
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        upfirdn2d._plugin.device_type = bias_act._plugin.device_type = 'cuda'  # all reference (undone by the fixture)
        expected = step()
    # float32 kernels against float32 references, rounding apart (over all parameters: some gradients are
    # zero up to rounding, e.g. of biases that an instance normalization cancels).
    grads, expected = torch.cat([g.flatten() for g in grads]), torch.cat([e.flatten() for e in expected])
    assert (grads - expected).norm() <= 1e-4 * expected.norm()


# ----------------------------------------------------------------------------
# Fallback when the build is impossible, and what the user is told.


def test_failed_build_warns_once_and_falls_back(monkeypatch):
    errors = ['my_op.cu(12): error: identifier "undefined_thing" is undefined', '1 error detected']
    def failing_get_plugin(**kwargs):
        raise custom_ops.BuildError('compiling my_op_plugin failed with CUDA toolkit /opt/cuda', errors)
    monkeypatch.setattr(custom_ops, 'get_plugin', failing_get_plugin)
    monkeypatch.delenv(custom_ops.VERBOSE_BUILD_ENV, raising=False)
    plugin = kernel_choice.LazyPlugin('my_op', module_name='my_op_plugin', sources=['my_op.cu'], headers=[],
                                      source_dir=OPS_DIR)
    with own_warnings() as caught:
        assert plugin.get() is None
        assert plugin.get() is None
    assert len(caught) == 1
    first_line, *details = str(caught[0].message).splitlines()
    assert first_line.startswith('my_op: CUDA kernel unavailable, using the slower reference implementation')
    assert first_line.endswith('compiling my_op_plugin failed with CUDA toolkit /opt/cuda')
    assert custom_ops.VERBOSE_BUILD_ENV in first_line
    assert [line.strip() for line in details] == errors


def test_cpu_tensors_use_reference_without_warning():
    torch.manual_seed(0)
    x = torch.randn([2, 4, 8, 8])
    b = torch.randn([4])
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        y_act = bias_act.bias_act(x, b, act='lrelu')
        y_up = upfirdn2d.upsample2d(x, f)
    torch.testing.assert_close(y_act, bias_act.bias_act(x, b, act='lrelu', impl='ref'))
    torch.testing.assert_close(y_up, upfirdn2d.upsample2d(x, f, impl='ref'))

# ----------------------------------------------------------------------------
# The chooser: a trusted kernel serves a shape only if it is at least as fast as the reference.


@pytest.fixture
def fake_clock(host_kernels, cpu_kernel_path, monkeypatch):
    """(plugin, set_times): the kernel path on the host build, timed by a clock that reads the given milliseconds."""
    plugin = cpu_kernel_path(HostPlugin(host_kernels))
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '1')
    timings = []  # one entry per timed path: 'kernel' or 'reference'
    times = {}

    def timer(fn, device):
        before = sum(plugin.calls.values())
        fn()
        path = 'kernel' if sum(plugin.calls.values()) > before else 'reference'
        timings.append(path)
        return times[path]
    monkeypatch.setattr(upfirdn2d._plugin, 'timer', timer)
    monkeypatch.setattr(bias_act._plugin, 'timer', timer)
    return plugin, times, timings


@pytest.mark.parametrize('kernel_ms, reference_ms, kernel_serves', [(1.0, 2.0, True), (2.0, 1.0, False),
                                                                     (1.0, 1.0, True)])
def test_chooser_picks_the_faster_path_per_shape(fake_clock, kernel_ms, reference_ms, kernel_serves):
    plugin, times, timings = fake_clock
    times.update(kernel=kernel_ms, reference=reference_ms)
    f = upfirdn2d.setup_filter([1, 2, 1])
    x = input_in_layout('contiguous')
    upfirdn2d.upsample2d(x, f)  # self-check, then timing
    assert timings == ['kernel', 'reference']
    (key, choice), = upfirdn2d._plugin.choices.items()
    assert key[1] == tuple(x.shape) and choice == dict(kernel_ms=kernel_ms, reference_ms=reference_ms,
                                                       kernel=kernel_serves)
    plugin.calls.clear()
    y = upfirdn2d.upsample2d(x, f)  # cached: no more timing
    assert timings == ['kernel', 'reference'] and (plugin.calls['upfirdn2d', 0] > 0) == kernel_serves
    torch.testing.assert_close(y, upfirdn2d.upsample2d(x, f, impl='ref'), rtol=1e-9, atol=1e-9)
    upfirdn2d.upsample2d(x[:1], f)  # another shape, the same configuration: timed on its own
    assert timings == ['kernel', 'reference'] * 2 and len(upfirdn2d._plugin.choices) == 2


def test_time_call_times_back_to_back_calls_per_call():
    """Off a GPU: one warm-up call, then rounds of back-to-back calls; the result is per call, not per round."""
    calls = []
    ms = kernel_choice.time_call(lambda: calls.append(1), torch.device('cpu'), calls=7, rounds=3)
    assert len(calls) == 1 + 3 * 7 and ms >= 0


def test_chooser_covers_bias_act(fake_clock):
    plugin, times, timings = fake_clock
    times.update(kernel=3.0, reference=1.0)
    x = input_in_layout('contiguous')
    y = bias_act.bias_act(x, None, act='lrelu')
    # Forward launches: the self-check's four and the timed one; the call itself is the reference's.
    assert timings == ['kernel', 'reference'] and plugin.calls['bias_act', 0] == 5
    torch.testing.assert_close(y, bias_act.bias_act(x, None, act='lrelu', impl='ref'))


def test_chooser_can_be_switched_off(fake_clock, monkeypatch):
    plugin, times, timings = fake_clock
    times.update(kernel=5.0, reference=1.0)
    monkeypatch.setenv(kernel_choice.AUTOTUNE_ENV, '0')
    plugin.calls.clear()
    upfirdn2d.upsample2d(input_in_layout('contiguous'), upfirdn2d.setup_filter([1, 2, 1]))
    assert timings == [] and upfirdn2d._plugin.choices == {} and plugin.served[3] > 0  # untimed, the kernel serves


def test_deterministic_runs_choose_the_kernel_without_timing(fake_clock):
    """Under --deterministic (torch's deterministic algorithms, as devices.run_switches sets them) the choice is never
    made by a clock: the kernel serves though the clock says the reference is five times faster."""
    plugin, times, timings = fake_clock
    times.update(kernel=5.0, reference=1.0)
    plugin.calls.clear()
    with devices.run_switches(torch.device('cpu'), allow_tf32=False, deterministic=True):
        upfirdn2d.upsample2d(input_in_layout('contiguous'), upfirdn2d.setup_filter([1, 2, 1]))
    assert timings == [] and upfirdn2d._plugin.choices == {} and plugin.served[3] > 0


def test_two_deterministic_runs_make_the_same_choices_whatever_the_clock_says(host_kernels, cpu_kernel_path,
                                                                              monkeypatch):
    """Under --deterministic the kernel-or-reference choice is never timed: two runs whose clocks disagree compute the
    same bits, on the kernel path. tests/test_ops_gpu.py runs the same on CUDA."""
    plugin = cpu_kernel_path(HostPlugin(host_kernels))
    timed, first, second = two_deterministic_runs(torch.device('cpu'), monkeypatch)
    assert timed == [] and plugin.calls['upfirdn2d', 0] > 0 and plugin.calls['bias_act', 0] > 0
    assert all(torch.equal(a, b) for a, b in zip(first, second))
