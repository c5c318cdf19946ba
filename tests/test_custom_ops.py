"""The CUDA sources of ops/ and the machinery around them (torch_utils/custom_ops.py).

Without a GPU, these things are still checked here:
  * every ops/*.cu compiles with nvcc against the installed torch headers;
  * the kernels' per-element arithmetic, compiled by nvcc for the host and
    called through ctypes in place of the GPU plugin, drives the ops' CUDA
    autograd Functions (and, with CPU tensors routed through the ops' kernel
    path, the whole op: layout handling and self-check included) and must agree
    with the PyTorch references in values and in first and second order
    gradients, for contiguous, channels_last and sliced inputs;
  * the self-check warns once and falls back when a kernel is deliberately broken;
  * toolkit discovery on a fake wrapper nvcc and a fake toolkit tree, the arch
    list, and the build failure report (the compiler's lines, not ninja's commands).
The real JIT build and CUDA against the reference run in tests/test_ops_gpu.py.
"""

import collections
import ctypes
import glob
import re
import stat
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
import torch.utils.cpp_extension

from ops import bias_act, upfirdn2d
from torch_utils import custom_ops

OPS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'ops')
CUDA_SOURCES = sorted(glob.glob(os.path.join(OPS_DIR, '*.cu')))
NVCC = shutil.which('nvcc')
needs_nvcc = pytest.mark.skipif(NVCC is None, reason='nvcc is not on the PATH')
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
TORCH_INCLUDES = [f'-I{path}' for path in torch.utils.cpp_extension.include_paths()]


@needs_nvcc
@pytest.mark.parametrize('source', CUDA_SOURCES, ids=os.path.basename)
def test_cuda_source_compiles(source, tmp_path):
    result = subprocess.run([NVCC, '-c', '-std=c++17', *TORCH_INCLUDES, source, '-o', str(tmp_path / 'kernel.o')],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------
# Host build of the kernel arithmetic. Each wrapper includes the .cu verbatim
# and exposes its per-element function over plain double arrays; the element
# type (float, double, c10::Half, c10::BFloat16) is chosen per call.

_HOST_WRAPPERS = {
    'bias_act': r'''
#include "bias_act.cu"
#include <vector>
template <class T>
static void run(BiasActParams p, const double* x, const double* b, const double* dy, double* out)
{
    std::vector<T> xt(x, x + p.size), bt, dyt;
    p.x = xt.data();
    if (b) { bt.assign(b, b + p.channels); p.b = bt.data(); }
    if (dy) { dyt.assign(dy, dy + p.size); p.dy = dyt.data(); }
    for (long long i = 0; i < p.size; i++)
        out[i] = double(bias_act_element<T, long long>(p, i));
}
extern "C" void host_bias_act(int dtype, const double* x, const double* b, const double* dy, double* out,
                              long long size, long long channels, long long inner, int act, int mode,
                              double alpha, double gain, double clamp)
{
    BiasActParams p = {nullptr, nullptr, nullptr, nullptr, size, channels, inner, act, mode, alpha, gain, clamp};
    if (dtype == 0) run<float>(p, x, b, dy, out);
    if (dtype == 1) run<double>(p, x, b, dy, out);
    if (dtype == 2) run<c10::Half>(p, x, b, dy, out);
    if (dtype == 3) run<c10::BFloat16>(p, x, b, dy, out);
}
''',
    'upfirdn2d': r'''
#include "upfirdn2d.cu"
#include <vector>
template <class T>
static void run(UpFirDn2dParams p, const double* x, const double* f, double* out)
{
    typedef typename AccType<T>::type S;
    std::vector<T> xt(x, x + p.planes * p.in_h * p.in_w), ot(p.planes * p.out_h * p.out_w);
    std::vector<S> ft(f, f + p.filter_h * p.filter_w);
    p.x = xt.data(); p.f = ft.data(); p.out = ot.data();
    for (int oy = 0; oy < p.out_h; oy++)
        for (int ox = 0; ox < p.out_w; ox++)
            upfirdn2d_pixel<T>(p, ox, oy, 0, 1);
    for (size_t i = 0; i < ot.size(); i++)
        out[i] = double(ot[i]);
}
extern "C" void host_upfirdn2d(int dtype, const double* x, const double* f, double* out, long long planes,
                               int in_w, int in_h, int out_w, int out_h, int up_x, int up_y, int down_x,
                               int down_y, int pad_x0, int pad_y0, int filter_w, int filter_h)
{
    UpFirDn2dParams p = {nullptr, nullptr, nullptr, planes, in_w, in_h, out_w, out_h, up_x, up_y,
                         down_x, down_y, pad_x0, pad_y0, filter_w, filter_h};
    if (dtype == 0) run<float>(p, x, f, out);
    if (dtype == 1) run<double>(p, x, f, out);
    if (dtype == 2) run<c10::Half>(p, x, f, out);
    if (dtype == 3) run<c10::BFloat16>(p, x, f, out);
}
''',
}
_DTYPE_IDS = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


@pytest.fixture(scope='module')
def host_kernels(tmp_path_factory):
    """ctypes handle to the host build of both kernels' arithmetic."""
    if NVCC is None:
        pytest.skip('nvcc is not on the PATH')
    build_dir = tmp_path_factory.mktemp('host_kernels')
    sources = []
    for name, text in _HOST_WRAPPERS.items():
        sources.append(str(build_dir / f'host_{name}.cu'))
        with open(sources[-1], 'w') as f:
            f.write(text)
    library = str(build_dir / 'host_kernels.so')
    result = subprocess.run([NVCC, '-shared', '-std=c++17', '-Xcompiler', '-fPIC', f'-I{OPS_DIR}', *TORCH_INCLUDES,
                             *sources, '-o', library], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(library)


def _pointer(array):
    return None if array is None else array.ctypes.data_as(ctypes.POINTER(ctypes.c_double))


def _as_float64(tensor):
    return None if tensor.numel() == 0 else np.ascontiguousarray(tensor.detach().cpu().double().numpy())


class _HostPlugin:
    """Stands in for the compiled extensions: same calls and checks as bias_act.cpp / upfirdn2d.cpp."""

    def __init__(self, library):
        self.library = library
        self.calls = collections.Counter()  # (op, mode) -> number of calls

    def bias_act(self, x, b, dy, dim, act, mode, alpha, gain, clamp):
        self.calls['bias_act', mode] += 1
        assert x.is_contiguous() and (b.numel() == 0 or b.dtype == x.dtype) and (mode == 0 or dy.shape == x.shape)
        out = np.empty(x.shape, dtype=np.float64)
        inner = int(np.prod(x.shape[dim + 1:]))
        self.library.host_bias_act(
            ctypes.c_int(_DTYPE_IDS[x.dtype]), _pointer(_as_float64(x)), _pointer(_as_float64(b)),
            _pointer(_as_float64(dy)), _pointer(out), ctypes.c_longlong(x.numel()), ctypes.c_longlong(x.shape[dim]),
            ctypes.c_longlong(inner), ctypes.c_int(act), ctypes.c_int(mode), ctypes.c_double(alpha),
            ctypes.c_double(gain), ctypes.c_double(clamp))
        return torch.from_numpy(out).to(x.dtype)

    def upfirdn2d(self, x, f, up_x, up_y, down_x, down_y, pad_x0, pad_x1, pad_y0, pad_y1):
        self.calls['upfirdn2d', 0] += 1
        tap_type = torch.float64 if x.dtype == torch.float64 else torch.float32
        assert x.is_contiguous() and f.is_contiguous() and f.ndim == 2 and f.dtype == tap_type
        batch, channels, in_h, in_w = x.shape
        filter_h, filter_w = f.shape
        out_w = (in_w * up_x + pad_x0 + pad_x1 - filter_w) // down_x + 1
        out_h = (in_h * up_y + pad_y0 + pad_y1 - filter_h) // down_y + 1
        out = np.empty([batch, channels, out_h, out_w], dtype=np.float64)
        ints = [in_w, in_h, out_w, out_h, up_x, up_y, down_x, down_y, pad_x0, pad_y0, filter_w, filter_h]
        self.library.host_upfirdn2d(ctypes.c_int(_DTYPE_IDS[x.dtype]), _pointer(_as_float64(x)),
                                    _pointer(_as_float64(f)), _pointer(out), ctypes.c_longlong(batch * channels),
                                    *[ctypes.c_int(value) for value in ints])
        return torch.from_numpy(out).to(x.dtype)


@pytest.fixture
def host_plugin(host_kernels, monkeypatch):
    plugin = _HostPlugin(host_kernels)
    monkeypatch.setattr(bias_act._plugin, 'get', lambda: plugin)
    monkeypatch.setattr(upfirdn2d._plugin, 'get', lambda: plugin)
    return plugin


@pytest.fixture
def cpu_kernel_path(monkeypatch):
    """install(plugin): CPU tensors take the ops' kernel path (layout handling, self-check) served by plugin."""
    def install(plugin):
        for op in (bias_act, upfirdn2d):
            monkeypatch.setattr(op._plugin, 'device_type', 'cpu')
            monkeypatch.setattr(op._plugin, 'module', plugin)
            monkeypatch.setattr(op._plugin, 'failed', False)
            monkeypatch.setattr(op._plugin, 'verdicts', {})
            monkeypatch.setattr(op._plugin, 'check_results', {})
        return plugin
    monkeypatch.delenv(custom_ops.SELF_CHECK_ENV, raising=False)
    return install


def _grads(fn, inputs):
    """[value, first-order gradients, second-order gradients] of fn at inputs.

    The first-order target sum(r * y^2) makes the incoming gradient depend on
    the inputs, so the second-order pass runs through the backward of the
    op's backward, as gradient normalization does.
    """
    def like(t):  # random values independent of t's memory layout (randn_like follows it)
        return torch.randn(t.shape, dtype=t.dtype, device=t.device)
    torch.manual_seed(1)
    y = fn(*inputs)
    first = torch.autograd.grad((like(y) * y * y).sum(), inputs, create_graph=True)
    second = torch.autograd.grad(sum((g * like(g)).sum() for g in first), inputs, allow_unused=True)
    return [y, *first, *second]


def _assert_all_close(actual, expected, **tolerances):
    for a, e in zip(actual, expected):
        if a is None or e is None:
            assert (a is None or not a.any()) and (e is None or not e.any())
        else:
            torch.testing.assert_close(a, e, **tolerances)


@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_host_bias_act_kernel_matches_reference(host_plugin, act):
    torch.manual_seed(0)
    x = (torch.randn([2, 3, 4, 5], dtype=torch.float64) * 2).requires_grad_()
    b = torch.randn([3], dtype=torch.float64, requires_grad=True)
    spec = bias_act.activation_funcs[act]
    for clamp in (-1.0, 0.8):
        cfg = bias_act._CudaConfig(dim=1, act=act, alpha=spec.def_alpha, gain=spec.def_gain, clamp=clamp)
        kernel = _grads(lambda x, b: bias_act._BiasActCuda.apply(x, b, cfg), [x, b])
        reference = _grads(lambda x, b: bias_act._bias_act_ref(x, b, 1, spec, spec.def_alpha, spec.def_gain, clamp),
                           [x, b])
        _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
def test_host_bias_act_kernel_low_precision(host_plugin, dtype):
    torch.manual_seed(0)
    x = torch.randn([3, 5, 7]).to(dtype)
    b = torch.randn([7]).to(dtype)
    cfg = bias_act._CudaConfig(dim=2, act='swish', alpha=0.0, gain=1.5, clamp=0.9)
    y = bias_act._BiasActCuda.apply(x, b, cfg)
    expected = bias_act._bias_act_ref(x.double(), b.double(), 2, bias_act.activation_funcs['swish'], 0.0, 1.5, 0.9)
    assert y.dtype == dtype
    # The kernel computes in float32 and rounds once: half an ulp of the output's dtype.
    rtol = {torch.float32: 1e-6, torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8}[dtype]
    torch.testing.assert_close(y.double(), expected, rtol=rtol, atol=1e-6)


_UPFIRDN2D_CASES = [  # (filter taps or 2-D shape, up, down, padding, flip_filter, gain)
    ([1, 3, 3, 1], 2, 1, [2, 1, 2, 1], False, 4.0),
    ([1, 3, 3, 1], 1, 2, [1, 1, 1, 1], False, 1.0),
    ([1, 2, 5, 2, 1, 3, 1, 1], [2, 1], [1, 3], [3, -1, 0, 2], True, 1.0),  # separable: two kernel passes
    ((3, 2), [1, 2], [4, 1], [-1, 2, 2, 0], False, -2.0),  # non-separable random 2-D filter
    ((5, 5), 4, 2, [0, 3, 4, -2], True, 0.5),
]


@pytest.mark.parametrize('case', _UPFIRDN2D_CASES, ids=str)
def test_host_upfirdn2d_kernel_matches_reference(host_plugin, case):
    taps, up, down, padding, flip_filter, gain = case
    torch.manual_seed(0)
    if isinstance(taps, tuple):
        f = torch.randn(taps)
    else:
        f = upfirdn2d.setup_filter(taps, separable=len(taps) >= 8)
    x = torch.randn([2, 3, 6, 7], dtype=torch.float64, requires_grad=True)
    cfg = upfirdn2d._Config(up=upfirdn2d._parse_scaling(up), down=upfirdn2d._parse_scaling(down),
                            padding=tuple(padding), flip_filter=flip_filter, gain=gain)
    kernel = _grads(lambda x: upfirdn2d._UpFirDn2dCuda.apply(x, f, cfg), [x])
    reference = _grads(lambda x: upfirdn2d._upfirdn2d_ref(x, f, cfg), [x])
    _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_host_upfirdn2d_kernel_low_precision(host_plugin, dtype):
    torch.manual_seed(0)
    x = torch.randn([1, 2, 8, 8]).to(dtype)
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    cfg = upfirdn2d._Config(up=(2, 2), down=(1, 1), padding=(2, 1, 2, 1), flip_filter=False, gain=4.0)
    y = upfirdn2d._UpFirDn2dCuda.apply(x, f, cfg)
    assert y.dtype == dtype
    # float32 accumulation, one rounding to the output's dtype: half an ulp.
    rtol = {torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8}[dtype]
    torch.testing.assert_close(y.double(), upfirdn2d._upfirdn2d_ref(x.double(), f, cfg), rtol=rtol, atol=1e-6)


# ----------------------------------------------------------------------------
# The whole op on the kernel path (CPU tensors routed through it): layouts.

_LAYOUTS = ['contiguous', 'channels_last', 'sliced']


def _input_in_layout(layout):
    """A float64 [2, 3, 5, 6] tensor laid out as named, with values spread over the activations' curvature."""
    torch.manual_seed(0)
    big = torch.randn([2, 5, 5, 9], dtype=torch.float64) * 2
    x = big[:, 1:4, :, 2:8]  # sliced: strided in the channel and width dimensions
    if layout == 'contiguous':
        x = x.contiguous()
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    return x


@pytest.mark.parametrize('layout', _LAYOUTS)
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_host_bias_act_second_order_in_every_layout(host_kernels, cpu_kernel_path, act, layout):
    """channels_last and sliced inputs reach the kernel, and act'' reaches their second-order gradient.

    Before the fix, the kernel path copied x inside the autograd Function; the
    copy had no link to the caller's x, and the second-order gradient of a smooth
    activation lost its act'' term for exactly these inputs.
    """
    plugin = cpu_kernel_path(_HostPlugin(host_kernels))
    x = _input_in_layout(layout).requires_grad_()
    b = torch.randn([3], dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the self-check passes silently
        for clamp in (None, 0.8):
            bias_act.bias_act(x, b, act=act, clamp=clamp)
        plugin.calls.clear()  # count only what follows the (one-time) self-checks
        for clamp in (None, 0.8):
            kernel = _grads(lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp), [x, b])
            reference = _grads(lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp, impl='ref'), [x, b])
            _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)
    smooth = not bias_act.activation_funcs[act].is_piecewise_linear
    assert plugin.calls['bias_act', 0] == 2 and plugin.calls['bias_act', 1] >= 2
    assert plugin.calls['bias_act', 2] == (2 if smooth else 0)
    y = kernel[0]
    assert y.is_contiguous(memory_format=torch.channels_last) == (layout == 'channels_last')
    assert y.is_contiguous() == (layout != 'channels_last')


def test_host_upfirdn2d_keeps_channels_last(host_kernels, cpu_kernel_path):
    plugin = cpu_kernel_path(_HostPlugin(host_kernels))
    x = _input_in_layout('channels_last').requires_grad_()
    f = upfirdn2d.setup_filter([1, 2, 1])
    kernel = _grads(lambda x: upfirdn2d.upsample2d(x, f), [x])
    reference = _grads(lambda x: upfirdn2d.upsample2d(x, f, impl='ref'), [x])
    _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)
    assert plugin.calls['upfirdn2d', 0] > 0
    assert kernel[0].is_contiguous(memory_format=torch.channels_last) and not kernel[0].is_contiguous()

# ----------------------------------------------------------------------------
# Self-check.


class _WithoutSecondDerivative(_HostPlugin):
    """bias_act whose act'' term is lost (what the contiguity bug did): mode 2 returns zeros."""

    def bias_act(self, x, b, dy, dim, act, mode, alpha, gain, clamp):
        out = super().bias_act(x, b, dy, dim, act, mode, alpha, gain, clamp)
        return torch.zeros_like(out) if mode == 2 else out


class _OnePercentOff(_HostPlugin):
    """upfirdn2d whose output is 1% too large."""

    def upfirdn2d(self, *args):
        return super().upfirdn2d(*args) * 1.01


def _run_ops(x):
    """Both ops on x, in the configurations a StyleGAN layer uses, plus a second bias_act config."""
    f = upfirdn2d.setup_filter([1, 2, 1])
    b = torch.linspace(-1, 1, x.shape[1], dtype=x.dtype)
    return [bias_act.bias_act(x, b, act='swish'), bias_act.bias_act(x, b, act='elu'), upfirdn2d.upsample2d(x, f)]


@pytest.mark.parametrize('broken_op, plugin_class, where, expected_error', [
    ('bias_act', _WithoutSecondDerivative, 'second-order gradient w.r.t. x', None),
    # Every kernel pass 1% too large: the first-order gradient (forward, then the adjoint) is 1.01^2 times the
    # reference's, 0.0201 of its magnitude (as is the second-order one; the first quantity at the maximum is named).
    ('upfirdn2d', _OnePercentOff, 'gradient w.r.t. x', 1.01 ** 2 - 1),
])
def test_self_check_warns_once_and_falls_back(host_kernels, cpu_kernel_path, broken_op, plugin_class, where,
                                              expected_error):
    plugin = cpu_kernel_path(plugin_class(host_kernels))
    x = _input_in_layout('contiguous')
    state = torch.get_rng_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        first = _run_ops(x)
        second = _run_ops(x)
    assert torch.equal(torch.get_rng_state(), state)  # the check draws from its own generator
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert message.startswith(f'{broken_op}: the CUDA kernel disagrees with the reference') and where in message
    assert 'reference implementation from now on' in message
    error = float(re.search(r'off by ([0-9.e+-]+)', message).group(1))
    if expected_error is None:
        assert error > 0.1
    else:
        assert error == pytest.approx(expected_error, rel=1e-2)
    broken_plugin = bias_act._plugin if broken_op == 'bias_act' else upfirdn2d._plugin
    assert broken_plugin.get() is None  # the reference from now on
    plugin.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        third = _run_ops(x)
    assert all(count == 0 for (op, _), count in plugin.calls.items() if op == broken_op)
    with torch.no_grad():
        expected = [bias_act.bias_act(x, torch.linspace(-1, 1, 3, dtype=x.dtype), act=act, impl='ref')
                    for act in ('swish', 'elu')] + [upfirdn2d.upsample2d(x, upfirdn2d.setup_filter([1, 2, 1]),
                                                                          impl='ref')]
    for results in (first, second, third):
        for y, e in zip(results, expected):
            torch.testing.assert_close(y, e, rtol=1e-9, atol=1e-9)  # the broken forward (1% off) never served


def test_self_check_can_be_switched_off(host_kernels, cpu_kernel_path, monkeypatch):
    cpu_kernel_path(_OnePercentOff(host_kernels))
    monkeypatch.setenv(custom_ops.SELF_CHECK_ENV, '0')
    x = _input_in_layout('contiguous')
    f = upfirdn2d.setup_filter([1, 2, 1])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        y = upfirdn2d.upsample2d(x, f)
    torch.testing.assert_close(y, upfirdn2d.upsample2d(x, f, impl='ref') * 1.01)  # the kernel, unchecked

# ----------------------------------------------------------------------------
# Fallback when the build is impossible, and what the user is told.


def test_failed_build_warns_once_and_falls_back(monkeypatch):
    errors = ['my_op.cu(12): error: identifier "undefined_thing" is undefined', '1 error detected']
    def failing_get_plugin(**kwargs):
        raise custom_ops.BuildError('compiling my_op_plugin failed with CUDA toolkit /opt/cuda', errors)
    monkeypatch.setattr(custom_ops, 'get_plugin', failing_get_plugin)
    monkeypatch.delenv(custom_ops.VERBOSE_BUILD_ENV, raising=False)
    plugin = custom_ops.LazyPlugin('my_op', module_name='my_op_plugin', sources=['my_op.cu'], headers=[],
                                   source_dir=OPS_DIR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert plugin.get() is None
        assert plugin.get() is None
    assert len(caught) == 1
    first_line, *details = str(caught[0].message).splitlines()
    assert first_line.startswith('my_op: CUDA kernel unavailable, using the slower reference implementation')
    assert first_line.endswith('compiling my_op_plugin failed with CUDA toolkit /opt/cuda')
    assert custom_ops.VERBOSE_BUILD_ENV in first_line
    assert [line.strip() for line in details] == errors


# A ninja log as torch.utils.cpp_extension.load reports it: command lines, then nvcc's errors.
_NINJA_LOG = """Error building extension 'gngan_bias_act_plugin': [1/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -DTORCH_EXTENSION_NAME=gngan_bias_act_plugin -c bias_act.cu -o bias_act.cuda.o
FAILED: bias_act.cuda.o
/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -DTORCH_EXTENSION_NAME=gngan_bias_act_plugin -DTORCH_API_INCLUDE_EXTENSION_H -c /b/bias_act.cu -o bias_act.cuda.o
/b/bias_act.cu(27): error: identifier "tanhh" is undefined
            S t = tanhh(s);
                  ^
          detected during:
            instantiation of "cudaError_t launch_bias_act_kernel<T>(const BiasActParams &, cudaStream_t) [with T=float]"

1 error detected in the compilation of "/b/bias_act.cu".
[2/3] c++ -MMD -MF bias_act.o.d -DTORCH_EXTENSION_NAME=gngan_bias_act_plugin -c /b/bias_act.cpp -o bias_act.o
ninja: build stopped: subcommand failed.
"""


def test_compiler_errors_keep_the_compilers_lines_only():
    assert custom_ops.compiler_errors(_NINJA_LOG) == ['/b/bias_act.cu(27): error: identifier "tanhh" is undefined',
                                                      '1 error detected in the compilation of "/b/bias_act.cu".']


def test_real_compiler_error_reaches_the_user(tmp_path, monkeypatch):
    """A real (host C++) build through ninja and torch, failing: the cause line and the compiler's line."""
    source = tmp_path / 'broken_op.cpp'
    source.write_text('int broken_op() { return undeclared_name; }\n')
    monkeypatch.setattr(custom_ops, '_check_build_environment', lambda: ('/nonexistent-cuda', '8.0'))
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path / 'cache'))
    monkeypatch.delenv(custom_ops.VERBOSE_BUILD_ENV, raising=False)
    with pytest.raises(custom_ops.BuildError) as info:
        custom_ops.get_plugin('gngan_broken_op', sources=['broken_op.cpp'], source_dir=str(tmp_path))
    assert info.value.cause == 'compiling gngan_broken_op failed with CUDA toolkit /nonexistent-cuda'
    assert any(re.search(r'broken_op\.cpp:1:\d+: error: .undeclared_name. was not declared', line)
               for line in info.value.details)  # (the compiler's quotes depend on the locale)
    assert not any('TORCH_EXTENSION_NAME' in line for line in info.value.details)


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


def test_get_plugin_refuses_cpu_only_torch(monkeypatch):
    monkeypatch.setattr(torch.version, 'cuda', None)
    with pytest.raises(RuntimeError, match='no CUDA support'):
        custom_ops.get_plugin('gngan_bias_act_plugin', sources=['bias_act.cpp', 'bias_act.cu'],
                              headers=['bias_act.h'], source_dir=OPS_DIR)


def test_build_dir_is_keyed_by_sources(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path))
    assert custom_ops._cache_root() == str(tmp_path)
    source = tmp_path / 'op.cu'
    source.write_text('// version 1\n')
    first = custom_ops._source_hash([str(source)], {})
    source.write_text('// version 2\n')
    assert custom_ops._source_hash([str(source)], {}) != first
    assert custom_ops._source_hash([str(source)], {'extra_cuda_cflags': ['-O3']}) != \
        custom_ops._source_hash([str(source)], {})

# ----------------------------------------------------------------------------
# Toolkit discovery on fake trees.


def _executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_toolkit(tmp_path, monkeypatch):
    """A toolkit tree whose nvcc answers --dryrun and --list-gpu-arch as the real one does, and a clean search."""
    home = tmp_path / 'toolkits' / 'cuda-99.1'
    (home / 'include').mkdir(parents=True)
    (home / 'include' / 'cuda_runtime.h').write_text('// fake\n')
    _executable(home / 'bin' / 'nvcc', '#!/bin/sh\n'
                'case "$*" in\n'
                f'  *--dryrun*) echo "#\\$ _HERE_={home}/bin" >&2; echo "#\\$ TOP={home}/bin/.." >&2;;\n'
                '  *--list-gpu-arch*) printf "compute_75\\ncompute_80\\ncompute_86\\ncompute_90\\n";;\n'
                'esac\n')
    for var in ('CUDA_HOME', 'CUDA_PATH', 'TORCH_CUDA_ARCH_LIST'):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(custom_ops, 'USUAL_PREFIXES', [str(tmp_path / 'nowhere')])
    monkeypatch.setenv('PATH', str(tmp_path / 'no-nvcc-here'))
    return home


def test_finds_toolkit_behind_wrapper_script(fake_toolkit, tmp_path, monkeypatch):
    """nvcc on the PATH is a script outside the toolkit (as on our machines): nvcc itself says where it lives."""
    wrapper = _executable(tmp_path / 'wrappers' / 'bin' / 'nvcc', f'#!/bin/sh\nexec {fake_toolkit}/bin/nvcc "$@"\n')
    monkeypatch.setenv('PATH', str(wrapper.parent))
    home, tried = custom_ops.find_cuda_home()
    assert home == str(fake_toolkit)
    assert tried == [f'{tmp_path / "wrappers"} from the nvcc on the PATH ({wrapper}): '
                     'no include/cuda_runtime.h']  # torch's guess, rejected


def test_finds_toolkit_behind_link(fake_toolkit, tmp_path, monkeypatch):
    link_dir = tmp_path / 'links'
    link_dir.mkdir()
    (link_dir / 'nvcc').symlink_to(fake_toolkit / 'bin' / 'nvcc')
    monkeypatch.setenv('PATH', str(link_dir))
    monkeypatch.setattr(custom_ops, '_nvcc_reported_home', lambda nvcc: pytest.fail('the link alone suffices'))
    assert custom_ops.find_cuda_home() == (str(fake_toolkit), [])


def test_cuda_home_without_headers_is_passed_over(fake_toolkit, tmp_path, monkeypatch):
    (tmp_path / 'stale' / 'bin').mkdir(parents=True)
    monkeypatch.setenv('CUDA_HOME', str(tmp_path / 'stale'))
    monkeypatch.setattr(custom_ops, 'USUAL_PREFIXES', [str(tmp_path / 'toolkits' / 'cuda-*')])
    home, tried = custom_ops.find_cuda_home()
    assert home == str(fake_toolkit)
    assert tried == [f'{tmp_path / "stale"} from $CUDA_HOME: no bin/nvcc or include/cuda_runtime.h']


def test_missing_toolkit_is_one_clear_cause(fake_toolkit, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.version, 'cuda', '99.1')
    monkeypatch.setenv('CUDA_PATH', str(tmp_path / 'gone'))
    with pytest.raises(custom_ops.BuildError) as info:
        custom_ops.get_plugin('gngan_bias_act_plugin', sources=['bias_act.cpp', 'bias_act.cu'],
                              headers=['bias_act.h'], source_dir=OPS_DIR)
    assert info.value.cause == (f'the CUDA toolkit was not found (tried: {tmp_path / "gone"} from $CUDA_PATH: '
                                'no such directory); set CUDA_HOME to the directory holding bin/nvcc and '
                                'include/cuda_runtime.h')


def test_arch_list_without_gpu_follows_torch_within_nvcc(fake_toolkit, monkeypatch):
    """No GPU: torch's own targets; sm_50 is older than anything this nvcc offers, sm_120 newer (-> 9.0 PTX)."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'get_arch_list', lambda: ['sm_50', 'sm_75', 'sm_86', 'sm_120', 'compute_120'])
    assert custom_ops.cuda_arch_list(str(fake_toolkit / 'bin' / 'nvcc')) == '7.5;8.6;9.0+PTX'


def test_arch_list_follows_visible_gpus_and_the_environment(fake_toolkit, monkeypatch):
    capabilities = [(8, 6), (8, 0), (8, 6)]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda i: capabilities[i])
    nvcc = str(fake_toolkit / 'bin' / 'nvcc')
    assert custom_ops.cuda_arch_list(nvcc) == '8.0;8.6+PTX'
    monkeypatch.setenv('TORCH_CUDA_ARCH_LIST', '7.0')
    assert custom_ops.cuda_arch_list(nvcc) == '7.0'
