"""The CUDA sources of ops/ and the machinery around them.

Without a GPU, three things are still checked here:
  * every ops/*.cu compiles with nvcc against the installed torch headers;
  * the kernels' per-element arithmetic, compiled by nvcc for the host and
    called through ctypes in place of the GPU plugin, drives the ops' CUDA
    autograd Functions and must agree with the PyTorch references in values
    and in first and second order gradients;
  * a failed build warns once and falls back to the reference.
The GPU tests at the end (JIT build, CUDA vs reference) skip without a GPU.
"""

import ctypes
import glob
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
# type (float, double, c10::Half) is chosen per call.

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
}
''',
}
_DTYPE_IDS = {torch.float32: 0, torch.float64: 1, torch.float16: 2}


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
    return None if tensor.numel() == 0 else np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float64)


class _HostPlugin:
    """Stands in for the compiled extensions: same calls and checks as bias_act.cpp / upfirdn2d.cpp."""

    def __init__(self, library):
        self.library = library

    def bias_act(self, x, b, dy, dim, act, mode, alpha, gain, clamp):
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


def _grads(fn, inputs):
    """[value, first-order gradients, second-order gradients] of fn at inputs.

    The first-order target sum(r * y^2) makes the incoming gradient depend on
    the inputs, so the second-order pass runs through the backward of the
    op's backward, as gradient normalization does.
    """
    torch.manual_seed(1)
    y = fn(*inputs)
    first = torch.autograd.grad((torch.randn_like(y) * y * y).sum(), inputs, create_graph=True)
    second = torch.autograd.grad(sum((g * torch.randn_like(g)).sum() for g in first), inputs, allow_unused=True)
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


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_host_bias_act_kernel_low_precision(host_plugin, dtype):
    torch.manual_seed(0)
    x = torch.randn([3, 5, 7]).to(dtype)
    b = torch.randn([7]).to(dtype)
    cfg = bias_act._CudaConfig(dim=2, act='swish', alpha=0.0, gain=1.5, clamp=0.9)
    y = bias_act._BiasActCuda.apply(x, b, cfg)
    expected = bias_act._bias_act_ref(x.double(), b.double(), 2, bias_act.activation_funcs['swish'], 0.0, 1.5, 0.9)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), expected, rtol=1e-3 if dtype == torch.float16 else 1e-6, atol=1e-3)


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


def test_host_upfirdn2d_kernel_half(host_plugin):
    torch.manual_seed(0)
    x = torch.randn([1, 2, 8, 8])
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    cfg = upfirdn2d._Config(up=(2, 2), down=(1, 1), padding=(2, 1, 2, 1), flip_filter=False, gain=4.0)
    y = upfirdn2d._UpFirDn2dCuda.apply(x.half(), f, cfg)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), upfirdn2d._upfirdn2d_ref(x, f, cfg), rtol=2e-3, atol=2e-3)


# ----------------------------------------------------------------------------
# Fallback when the build is impossible.

def test_failed_build_warns_once_and_falls_back(monkeypatch):
    def failing_get_plugin(**kwargs):
        raise RuntimeError('nvcc fatal: simulated\ncompiler failure')
    monkeypatch.setattr(custom_ops, 'get_plugin', failing_get_plugin)
    plugin = custom_ops.LazyPlugin('my_op', module_name='my_op_plugin', sources=['my_op.cu'], headers=[],
                                   source_dir=OPS_DIR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert plugin.get() is None
        assert plugin.get() is None
    assert len(caught) == 1
    message = str(caught[0].message)
    assert '\n' not in message and 'my_op' in message and 'reference implementation' in message
    assert 'simulated compiler failure' in message


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
# On a GPU: the real JIT build, and CUDA vs reference.

@needs_gpu
def test_gpu_plugins_build():
    assert bias_act._plugin.get() is not None
    assert upfirdn2d._plugin.get() is not None


@needs_gpu
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_gpu_bias_act_matches_reference(act, dtype):
    torch.manual_seed(0)
    x = torch.randn([4, 16, 9, 9], device='cuda', dtype=dtype, requires_grad=True)
    b = torch.randn([16], device='cuda', dtype=dtype, requires_grad=True)
    tolerance = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
    for clamp in (None, 1.0):
        kernel = _grads(lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp, impl='cuda'), [x, b])
        reference = _grads(lambda x, b: bias_act.bias_act(x, b, act=act, clamp=clamp, impl='ref'), [x, b])
        _assert_all_close(kernel, reference, **tolerance)


@needs_gpu
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('case', _UPFIRDN2D_CASES, ids=str)
def test_gpu_upfirdn2d_matches_reference(case, dtype):
    taps, up, down, padding, flip_filter, gain = case
    torch.manual_seed(0)
    f = torch.randn(taps) if isinstance(taps, tuple) else upfirdn2d.setup_filter(taps, separable=len(taps) >= 8)
    f = f.cuda()
    x = torch.randn([4, 8, 16, 17], device='cuda', dtype=dtype, requires_grad=True)
    tolerance = dict(rtol=1e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
    args = dict(up=up, down=down, padding=padding, flip_filter=flip_filter, gain=gain)
    kernel = _grads(lambda x: upfirdn2d.upfirdn2d(x, f, impl='cuda', **args), [x])
    reference = _grads(lambda x: upfirdn2d.upfirdn2d(x, f, impl='ref', **args), [x])
    _assert_all_close(kernel, reference, **tolerance)
