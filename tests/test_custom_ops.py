"""The CUDA sources of ops/ and the machinery around them (torch_utils/custom_ops.py).

Without a GPU, these things are still checked here:
  * every ops/*.cu compiles with nvcc against the installed torch headers;
  * the kernels' per-element arithmetic, compiled by nvcc for the host and
    called through ctypes in place of the GPU plugin, drives the ops' CUDA
    autograd Functions (and, with CPU tensors routed through the ops' kernel
    path, the whole op: layout handling and self-check included) and must agree
    with the PyTorch references in values and in first and second order
    gradients, for contiguous, channels_last and sliced inputs, and for every
    compile-time specialisation of the upfirdn2d kernel;
  * a deliberately broken kernel (wrong values, a failed launch, a missing loop
    over planes or grid strides) fails its self-check with one warning, and only
    its configuration falls back to the reference; a training step goes on;
  * the chooser between kernel and reference, driven by a fake clock;
  * toolkit discovery on a fake wrapper nvcc and a fake toolkit tree, the arch
    list, a toolkit of another CUDA major version, and the build failure report
    (the compiler's lines, not ninja's commands).
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
import sys
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
needs_gpu = pytest.mark.gpu  # Skipped without a GPU (tests/conftest.py).
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
// Runs each planned launch as the GPU would: every thread of the grid, the grid-stride loop included.
struct HostRunner
{
    long long launches[2];  // [scalar kernels, vectorised kernels]
    template <class T, int ACT, bool GRAD, int V> void run(const BiasActArgs<typename AccType<T>::type>& a,
                                                           unsigned blocks)
    {
        launches[V > 1]++;
        const unsigned threads = blocks * BIAS_ACT_BLOCK;
        for (unsigned t = 0; t < threads; t++)
            bias_act_thread<T, ACT, GRAD, V>(a, t, threads);
    }
};
// n elements of type T from 16-byte aligned storage, starting `shift` elements in.
template <class T> struct Buffer
{
    std::vector<uint4> storage;
    T* data;
    Buffer(long long n, int shift) : storage((n + shift) * sizeof(T) / 16 + 1), data(reinterpret_cast<T*>(storage.data()) + shift) {}
};
template <class T>
static void run(BiasActParams p, int shift_x, int shift_out, const double* x, const double* b, const double* dy,
                double* out, long long* launches)
{
    Buffer<T> xt(p.size, shift_x), dyt(p.size, shift_x), ot(p.size, shift_out);
    std::vector<T> bt;
    for (long long i = 0; i < p.size; i++) xt.data[i] = T(x[i]);
    p.x = xt.data; p.out = ot.data;
    if (b) { for (long long i = 0; i < p.channels; i++) bt.push_back(T(b[i])); p.b = bt.data(); }
    if (dy) { for (long long i = 0; i < p.size; i++) dyt.data[i] = T(dy[i]); p.dy = dyt.data; }
    HostRunner runner = {{0, 0}};
    plan_bias_act<T>(p, runner);
    for (long long i = 0; i < p.size; i++)
        out[i] = double(ot.data[i]);
    launches[0] = runner.launches[0];
    launches[1] = runner.launches[1];
}
// launches: [scalar, vectorised] kernel launches made.
extern "C" void host_bias_act(int dtype, const double* x, const double* b, const double* dy, double* out,
                              long long size, long long channels, long long inner, int act, int mode,
                              double alpha, double gain, double clamp, long long max_blocks, long long max_chunk,
                              int shift_x, int shift_out, long long* launches)
{
    BiasActParams p = {nullptr, nullptr, nullptr, nullptr, size, channels, inner, act, mode, alpha, gain, clamp,
                       max_blocks, max_chunk};
    if (dtype == 0) run<float>(p, shift_x, shift_out, x, b, dy, out, launches);
    if (dtype == 1) run<double>(p, shift_x, shift_out, x, b, dy, out, launches);
    if (dtype == 2) run<c10::Half>(p, shift_x, shift_out, x, b, dy, out, launches);
    if (dtype == 3) run<c10::BFloat16>(p, shift_x, shift_out, x, b, dy, out, launches);
}
''',
    'upfirdn2d': r'''
#include "upfirdn2d.cu"
#include <cmath>
#include <vector>
// Runs the planned launch as the GPU would, block by block and plane by plane: every thread
// stages its share of the input tile, then every thread computes (the order __syncthreads
// imposes). The shared tile starts as NaN, so reading an entry nobody staged shows.
struct HostRunner
{
    int served;  // taps per axis of the specialisation, 0 for the generic kernel
    int phase;   // PHX + 2 * PHY of the specialisation
    template <class T, int UP, int DOWN, int TAPS, int PHX, int PHY>
    void tile(const TileArgs<typename AccType<T>::type, TAPS>& a, dim3 grid)
    {
        typedef typename AccType<T>::type S;
        typedef TileShape<UP, DOWN, TAPS> Shape;
        std::vector<S> shared(Shape::in_w * Shape::in_h);
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++)
                    for (long long plane = bz; plane < a.planes; plane += grid.z)
                    {
                        for (size_t i = 0; i < shared.size(); i++)
                            shared[i] = S(NAN);
                        for (int thread = 0; thread < TILE_THREADS_X * TILE_THREADS_Y; thread++)
                            tile_stage<T, UP, DOWN, TAPS, PHX, PHY>(a, bx, by, plane, thread, shared.data());
                        for (int ty = 0; ty < TILE_THREADS_Y; ty++)
                            for (int tx = 0; tx < TILE_THREADS_X; tx++)
                                tile_compute<T, UP, DOWN, TAPS, PHX, PHY>(a, bx, by, plane, tx, ty, shared.data());
                    }
        served = TAPS;
        phase = PHX + 2 * PHY;
    }
    template <class T> void generic(const UpFirDn2dParams& p, dim3 grid)
    {
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned y = 0; y < grid.y * TILE_THREADS_Y; y++)
                for (unsigned x = 0; x < grid.x * TILE_THREADS_X; x++)
                    if (int(x) < p.out_w && int(y) < p.out_h)
                        upfirdn2d_pixel<T>(p, x, y, bz, grid.z);
        served = 0;
        phase = 0;
    }
};
template <class T>
static int run(UpFirDn2dParams p, const double* x, long long x_span, const double* f, double* out,
               long long out_span, int generic)
{
    typedef typename AccType<T>::type S;
    std::vector<T> xt(x, x + x_span), ot(out_span);
    std::vector<S> ft(f, f + p.filter_h * p.filter_w);
    p.x = xt.data(); p.f = ft.data(); p.out = ot.data();
    HostRunner runner = {-1, 0};
    if (generic)
        runner.generic<T>(p, upfirdn2d_grid(p, 1));
    else
        plan_upfirdn2d<T>(p, runner);
    for (size_t i = 0; i < ot.size(); i++)
        out[i] = double(ot[i]);
    return runner.served + 16 * runner.phase;
}
// Returns the taps per axis of the specialised kernel that served (0 for the generic kernel) plus
// 16 times its phase (PHX + 2 * PHY).
extern "C" int host_upfirdn2d(int dtype, const double* x, long long x_span, const long long* x_stride,
                              const double* f, const double* taps, double* out, long long out_span,
                              const long long* out_stride, long long planes, int channels, const int* ints,
                              int generic, int max_grid_z)
{
    UpFirDn2dParams p = {};
    p.planes = planes; p.channels = channels;
    p.in_w = ints[0]; p.in_h = ints[1]; p.out_w = ints[2]; p.out_h = ints[3]; p.up_x = ints[4]; p.up_y = ints[5];
    p.down_x = ints[6]; p.down_y = ints[7]; p.pad_x0 = ints[8]; p.pad_y0 = ints[9]; p.filter_w = ints[10];
    p.filter_h = ints[11]; p.max_grid_z = max_grid_z;
    for (int i = 0; i < 4; i++) { p.x_stride[i] = x_stride[i]; p.out_stride[i] = out_stride[i]; }
    if (upfirdn2d_fixed_taps(p) > 0)
        for (int i = 0; i < p.filter_w * p.filter_h; i++)
            p.taps[i] = taps[i];
    if (dtype == 0) return run<float>(p, x, x_span, f, out, out_span, generic);
    if (dtype == 1) return run<double>(p, x, x_span, f, out, out_span, generic);
    if (dtype == 2) return run<c10::Half>(p, x, x_span, f, out, out_span, generic);
    return run<c10::BFloat16>(p, x, x_span, f, out, out_span, generic);
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
    return None if tensor is None else np.ascontiguousarray(tensor.detach().cpu().double().numpy())


def _span(tensor):
    """The elements of a tensor's storage from its first to its last element, as a float64 array."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return np.ascontiguousarray(tensor.detach().as_strided([span], [1]).cpu().double().numpy())


class _HostPlugin:
    """Stands in for the compiled extensions: same calls and checks as bias_act.cpp / upfirdn2d.cpp.

    generic=True sends every upfirdn2d call to the generic kernel; `served` counts the calls per
    kernel (taps per axis of the specialisation, 0 for the generic kernel). bias_act: shift_x and
    shift_out place x (and dy) and the output that many elements past a 16-byte boundary;
    `launches` counts the scalar and vectorised kernel launches.
    """

    def __init__(self, library, generic=False):
        self.library = library
        self.generic = generic
        self.shift_x = self.shift_out = 0
        self.launches = collections.Counter()  # 'scalar' / 'vectorised' -> bias_act kernel launches
        self.calls = collections.Counter()  # (op, mode) -> number of calls
        self.served = collections.Counter()  # upfirdn2d kernel (0: generic, else taps per axis) -> calls
        self.phases = collections.Counter()  # (up, down, taps, PHX + 2 * PHY) of the specialised kernels -> calls

    def bias_act(self, x, b, dy, dim, act, mode, alpha, gain, clamp, max_blocks, max_chunk):
        self.calls['bias_act', mode] += 1
        assert x.is_contiguous() and (b is None or b.dtype == x.dtype) and (mode == 0 or dy.shape == x.shape)
        assert max_blocks >= 0 and max_chunk >= 0
        out = np.empty(x.shape, dtype=np.float64)
        inner = int(np.prod(x.shape[dim + 1:]))
        launches = (ctypes.c_longlong * 2)()
        self.library.host_bias_act(
            ctypes.c_int(_DTYPE_IDS[x.dtype]), _pointer(_as_float64(x)), _pointer(_as_float64(b)),
            _pointer(_as_float64(dy)), _pointer(out), ctypes.c_longlong(x.numel()), ctypes.c_longlong(x.shape[dim]),
            ctypes.c_longlong(inner), ctypes.c_int(act), ctypes.c_int(mode), ctypes.c_double(alpha),
            ctypes.c_double(gain), ctypes.c_double(clamp), ctypes.c_longlong(max_blocks),
            ctypes.c_longlong(max_chunk), ctypes.c_int(self.shift_x), ctypes.c_int(self.shift_out), launches)
        self.launches['scalar'] += launches[0]
        self.launches['vectorised'] += launches[1]
        return torch.from_numpy(out).to(x.dtype)

    def upfirdn2d(self, x, f, taps, up_x, up_y, down_x, down_y, pad_x0, pad_x1, pad_y0, pad_y1, max_grid_z):
        self.calls['upfirdn2d', 0] += 1
        tap_type = torch.float64 if x.dtype == torch.float64 else torch.float32
        assert x.ndim == 4 and f.is_contiguous() and f.ndim == 2 and f.dtype == tap_type and 0 <= max_grid_z <= 65535
        assert taps == (f.flatten().tolist() if max(f.shape) <= upfirdn2d.MAX_FIXED_TAPS else [])
        batch, channels, in_h, in_w = x.shape
        filter_h, filter_w = f.shape
        out_w = (in_w * up_x + pad_x0 + pad_x1 - filter_w) // down_x + 1
        out_h = (in_h * up_y + pad_y0 + pad_y1 - filter_h) // down_y + 1
        out = torch.empty([batch, channels, out_h, out_w], dtype=torch.float64,
                          memory_format=torch.channels_last if x.is_contiguous(memory_format=torch.channels_last)
                          and not x.is_contiguous() else torch.contiguous_format)
        out_span = np.empty(out.numel(), dtype=np.float64)
        ints = (ctypes.c_int * 12)(in_w, in_h, out_w, out_h, up_x, up_y, down_x, down_y, pad_x0, pad_y0, filter_w,
                                   filter_h)
        strides = lambda t: (ctypes.c_longlong * 4)(*t.stride())  # noqa: E731
        x_span = _span(x)
        host_taps = np.array(taps or [0.0], dtype=np.float64)
        served = self.library.host_upfirdn2d(
            ctypes.c_int(_DTYPE_IDS[x.dtype]), _pointer(x_span), ctypes.c_longlong(x_span.size), strides(x),
            _pointer(_as_float64(f)), _pointer(host_taps), _pointer(out_span), ctypes.c_longlong(out_span.size),
            strides(out), ctypes.c_longlong(batch * channels), ctypes.c_int(channels), ints, ctypes.c_int(self.generic),
            ctypes.c_int(max_grid_z))
        self.served[served % 16] += 1
        if served % 16:
            self.phases[up_x, down_x, served % 16, served // 16] += 1
        return torch.from_numpy(out_span).as_strided(out.shape, out.stride()).to(x.dtype)


@pytest.fixture
def host_plugin(host_kernels, monkeypatch):
    plugin = _HostPlugin(host_kernels)
    for op in (bias_act, upfirdn2d):
        monkeypatch.setattr(op._plugin, 'get', lambda: plugin)
        monkeypatch.setattr(op._plugin, 'module', plugin)
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
            monkeypatch.setattr(op._plugin, 'choices', {})
            monkeypatch.setattr(op._plugin, 'plans', {})
        return plugin
    monkeypatch.delenv(custom_ops.SELF_CHECK_ENV, raising=False)
    monkeypatch.setenv(custom_ops.AUTOTUNE_ENV, '0')  # the host build is no GPU: timing it would say nothing
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


def _bias_act_mode_reference(x, b, dim, act, mode, dy, alpha, gain, clamp):
    """What the kernel writes in `mode` (bias_act.h), in float64 by autograd through the reference."""
    x = x.double().requires_grad_()
    spec = bias_act.activation_funcs[act]
    y = bias_act._bias_act_ref(x, None if b is None else b.double(), dim, spec, alpha, gain, clamp)
    if mode == 0:
        return y.detach()
    first, = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)  # gain * act'(s) * mask
    if mode == 1:
        return first.detach() * dy.double()
    if not first.requires_grad:  # act' is constant
        return torch.zeros_like(first)
    second, = torch.autograd.grad(first, x, dy.double(), allow_unused=True)  # dy * gain * act''(s) * mask
    return torch.zeros_like(first) if second is None else second


# (shape, bias dim, max_chunk, shift_x, shift_out): runs of one bias index longer than a vector, of
# length 1 (a channels_last tensor's bias, fewer channels than a vector holds), of odd lengths,
# no bias; chunks starting inside runs and runs longer than a chunk; misaligned x or output.
_BIAS_LAYOUTS = [([2, 6, 4, 4], 1, 0, 0, 0), ([2, 4, 5, 3], 3, 0, 0, 0), ([3, 5, 7], 1, 0, 0, 0),
                 ([2, 6, 4, 4], None, 0, 0, 0), ([3, 5, 7], 1, 24, 0, 0), ([2, 3, 100], 1, 40, 0, 0),
                 ([3, 5, 7], 1, 0, 1, 0), ([2, 6, 4, 4], 3, 0, 0, 3)]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize('mode', [0, 1, 2])
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_host_bias_act_every_kernel(host_plugin, act, mode, dtype):
    """Every kernel (activation x forward/gradient x vectorised/scalar x element type) against float64.

    The error per element is judged as the self-check does, against |expected| + rms(expected):
    at most a few units in the last place of the compute type (float32 for the half types) plus
    one rounding to the output type.
    """
    tolerance = {torch.float64: 1e-13, torch.float32: 4e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
    torch.manual_seed(mode * 10 + len(act))
    spec = bias_act.activation_funcs[act]
    for shape, dim, max_chunk, shift_x, shift_out in _BIAS_LAYOUTS:
        x = (torch.randn(shape, dtype=torch.float64) * 3).to(dtype)
        b = None if dim is None else torch.randn([shape[dim]], dtype=torch.float64).to(dtype)
        if b is not None:  # no s = x + b exactly 0 (a tie at the kinks, where act'' has no value; bfloat16 has a few)
            x = torch.where(x.double() + b.double().reshape([-1] + [1] * (len(shape) - 1 - dim)) == 0, x + 1, x)
        dy = None if mode == 0 else torch.randn(shape, dtype=torch.float64).to(dtype)
        for clamp in (-1.0, 0.9):
            host_plugin.shift_x, host_plugin.shift_out = shift_x, shift_out
            actual = host_plugin.bias_act(x, b, dy, dim or 0, spec.cuda_id, mode, spec.def_alpha, 1.3, clamp, 1,
                                          max_chunk)
            expected = _bias_act_mode_reference(x, b, dim or 0, act, mode, dy, spec.def_alpha, 1.3, clamp)
            error = (actual.double() - expected).abs() / (expected.abs() + expected.square().mean().sqrt() + 1e-300)
            assert error.max() <= tolerance, (shape, dim, max_chunk, shift_x, shift_out, clamp, error.max().item())
    assert host_plugin.launches['scalar'] > 0 and host_plugin.launches['vectorised'] > 0


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
    kernel = _grads(lambda x: upfirdn2d._UpFirDn2d.apply(x, f, cfg, upfirdn2d._run_kernel), [x])
    reference = _grads(lambda x: upfirdn2d._upfirdn2d_ref(x, f, cfg), [x])
    _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)


# Every compile-time specialisation: (up, down) on both axes and a square filter of 1-4 taps.
_SPECIALISATIONS = [(up, down, taps) for up, down in [(1, 1), (2, 1), (1, 2)] for taps in (1, 2, 3, 4)]


@pytest.mark.parametrize('up, down, taps', _SPECIALISATIONS, ids=str)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_host_upfirdn2d_every_specialisation(host_plugin, up, down, taps, layout):
    """Values and gradients of both orders against the reference; the specialised kernel serves every pass.

    The output spans 2 x 2 tiles of 64 x 16 (and more) and, for upsampling, the paddings take every
    phase (pad_x0, pad_y0 mod 2), each a kernel of its own; some crop, some exceed the filter.
    """
    torch.manual_seed(taps * 10 + up * 3 + down)
    f = torch.randn([taps, taps])
    x = torch.randn([1, 2, 20 * down // up + 3, 70 * down // up + 3], dtype=torch.float64)
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    paddings = [(0, 1, 0, taps), (1, -1, 0, 0), (-2, 0, 5, 1), (5, 2, 3, -1)]  # (pad_x0, pad_y0) mod 2: all four
    for padding, (flip_filter, gain) in zip(paddings, [(False, 1.0), (True, -2.5)] * 2):
        cfg = upfirdn2d._Config(up=(up, up), down=(down, down), padding=padding, flip_filter=flip_filter, gain=gain)
        kernel = _grads(lambda x: upfirdn2d._UpFirDn2d.apply(x, f, cfg, upfirdn2d._run_kernel), [x])
        reference = _grads(lambda x: upfirdn2d._upfirdn2d_ref(x, f, cfg), [x])
        _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)
        assert kernel[0].is_contiguous(memory_format=torch.channels_last) == (layout == 'channels_last')
    # The forward pass and both adjoints (up <-> down) are specialisations too.
    assert set(host_plugin.served) == {taps} and host_plugin.served[taps] >= 12
    assert {phase for (u, _, _, phase) in host_plugin.phases if u == 2} == ({0, 1, 2, 3} if 2 in (up, down) else set())
    host_plugin.generic = True  # the generic kernel, same sums in the same order: the same float32 results
    x32 = x.detach().float()
    generic = upfirdn2d._UpFirDn2d.apply(x32, f, cfg, upfirdn2d._run_kernel)
    host_plugin.generic = False
    specialised = upfirdn2d._UpFirDn2d.apply(x32, f, cfg, upfirdn2d._run_kernel)
    assert torch.equal(specialised, generic) and host_plugin.served[0] == 1


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_host_upfirdn2d_kernel_low_precision(host_plugin, dtype):
    torch.manual_seed(0)
    x = torch.randn([1, 2, 8, 8]).to(dtype)
    f = upfirdn2d.setup_filter([1, 3, 3, 1])
    cfg = upfirdn2d._Config(up=(2, 2), down=(1, 1), padding=(2, 1, 2, 1), flip_filter=False, gain=4.0)
    y = upfirdn2d._UpFirDn2d.apply(x, f, cfg, upfirdn2d._run_kernel)
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
# Host work per call: after the first call with given metadata, the wrappers only look up their plan.

_OPS_FILES = (os.path.realpath(bias_act.__file__), os.path.realpath(upfirdn2d.__file__),
              os.path.realpath(custom_ops.__file__))


def _project_calls(fn):
    """Counter of (file, function) of the Python calls into ops/ and custom_ops.py while fn() runs."""
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
            {('custom_ops.py', name) for name in ('usable', 'get')}


@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_repeated_calls_only_look_up_their_plan(host_kernels, cpu_kernel_path, layout):
    """No new configuration objects, checks, Functions or timings after the first call of a configuration."""
    plugin = cpu_kernel_path(_HostPlugin(host_kernels))
    x = _input_in_layout(layout).requires_grad_()
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
    cpu_kernel_path(_HostPlugin(host_kernels))
    x = _input_in_layout('contiguous')
    bias_act.bias_act(x, None, act='tanh')
    assert len(bias_act._plugin.plans) == 1 and len(bias_act._plugin.check_results) == 1
    bias_act._plugin.check_results.clear()
    bias_act._plugin.verdicts = {}
    assert bias_act._plugin.plans == {}
    bias_act.bias_act(x, None, act='tanh')
    assert len(bias_act._plugin.check_results) == 1  # checked again
    bias_act._plugin.choices = {}
    assert bias_act._plugin.plans == {}


# ----------------------------------------------------------------------------
# Self-check: failures stay with their configuration.


class _WithoutSecondDerivative(_HostPlugin):
    """bias_act whose act'' term is lost (what the contiguity bug did): mode 2 returns zeros."""

    def bias_act(self, *args):
        out = super().bias_act(*args)
        return torch.zeros_like(out) if args[5] == 2 else out


class _UpsamplingOnePercentOff(_HostPlugin):
    """upfirdn2d whose upsampling passes are 1% too large; everything else is right."""

    def upfirdn2d(self, x, f, taps, up_x, *args):
        return super().upfirdn2d(x, f, taps, up_x, *args) * (1.01 if up_x > 1 else 1)


class _UpsamplingCannotLaunch(_HostPlugin):
    """upfirdn2d whose upsampling kernel fails to launch, as one built for another GPU would."""

    def upfirdn2d(self, x, f, taps, up_x, *args):
        if up_x > 1:
            raise RuntimeError('CUDA error: no kernel image is available for execution on the device')
        return super().upfirdn2d(x, f, taps, up_x, *args)


class _WithoutPlaneLoop(_HostPlugin):
    """upfirdn2d without the loop over planes beyond the grid: with max_grid_z > 0, later planes stay 0."""

    def upfirdn2d(self, *args):
        out = super().upfirdn2d(*args)
        max_grid_z = args[-1]
        if max_grid_z:
            out.view(-1, *out.shape[2:])[max_grid_z:] = 0
        return out


class _WithoutGridStrideLoop(_HostPlugin):
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
    (_UpsamplingOnePercentOff, _upfirdn2d_pair, 'off by'),
    (_UpsamplingCannotLaunch, _upfirdn2d_pair, 'RuntimeError: CUDA error: no kernel image is available'),
], ids=lambda value: getattr(value, '__name__', None))
def test_self_check_failure_stays_with_its_config(host_kernels, cpu_kernel_path, plugin_class, pair, cause):
    """One warning naming op, config and cause; the broken config gets the reference, a second keeps the kernel."""
    plugin = cpu_kernel_path(plugin_class(host_kernels))
    x = _input_in_layout('contiguous')
    state = torch.get_rng_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
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
        if plugin_class is _UpsamplingOnePercentOff:
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        pair(_input_in_layout('contiguous'))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and all(' off by ' in m for m in messages), messages  # both configs


def test_self_check_can_be_switched_off(host_kernels, cpu_kernel_path, monkeypatch):
    cpu_kernel_path(_UpsamplingOnePercentOff(host_kernels))
    monkeypatch.setenv(custom_ops.SELF_CHECK_ENV, '0')
    x = _input_in_layout('contiguous')
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
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
                '  *--version*) echo "Cuda compilation tools, release 99.1, V99.1.66";;\n'
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


def test_toolkit_of_another_cuda_major_is_refused(fake_toolkit, monkeypatch):
    """torch built with CUDA 12.8, the toolkit is 99.1: one plain line; a different minor version passes."""
    monkeypatch.setenv('CUDA_HOME', str(fake_toolkit))
    monkeypatch.setattr(torch.version, 'cuda', '12.8')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'get_arch_list', lambda: ['sm_80', 'sm_90'])
    with pytest.raises(custom_ops.BuildError) as info:
        custom_ops.get_plugin('gngan_bias_act_plugin', sources=['bias_act.cpp', 'bias_act.cu'],
                              headers=['bias_act.h'], source_dir=OPS_DIR)
    assert info.value.cause == (f'the CUDA toolkit at {fake_toolkit} is CUDA 99.1, but this PyTorch '
                                f'({torch.__version__}) was built with CUDA 12.8; install a CUDA 12.x toolkit and '
                                'set CUDA_HOME to it')
    monkeypatch.setattr(torch.version, 'cuda', '99.0')
    monkeypatch.setattr(torch.utils.cpp_extension, 'is_ninja_available', lambda: True)
    assert custom_ops._check_build_environment() == (str(fake_toolkit), '8.0;9.0+PTX')


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

# ----------------------------------------------------------------------------
# The chooser: a trusted kernel serves a shape only if it is at least as fast as the reference.


@pytest.fixture
def fake_clock(host_kernels, cpu_kernel_path, monkeypatch):
    """(plugin, set_times): the kernel path on the host build, timed by a clock that reads the given milliseconds."""
    plugin = cpu_kernel_path(_HostPlugin(host_kernels))
    monkeypatch.setenv(custom_ops.AUTOTUNE_ENV, '1')
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
    x = _input_in_layout('contiguous')
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
    ms = custom_ops.time_call(lambda: calls.append(1), torch.device('cpu'), calls=7, rounds=3)
    assert len(calls) == 1 + 3 * 7 and ms >= 0


def test_chooser_covers_bias_act(fake_clock):
    plugin, times, timings = fake_clock
    times.update(kernel=3.0, reference=1.0)
    x = _input_in_layout('contiguous')
    y = bias_act.bias_act(x, None, act='lrelu')
    # Forward launches: the self-check's four and the timed one; the call itself is the reference's.
    assert timings == ['kernel', 'reference'] and plugin.calls['bias_act', 0] == 5
    torch.testing.assert_close(y, bias_act.bias_act(x, None, act='lrelu', impl='ref'))


def test_chooser_can_be_switched_off(fake_clock, monkeypatch):
    plugin, times, timings = fake_clock
    times.update(kernel=5.0, reference=1.0)
    monkeypatch.setenv(custom_ops.AUTOTUNE_ENV, '0')
    plugin.calls.clear()
    upfirdn2d.upsample2d(_input_in_layout('contiguous'), upfirdn2d.setup_filter([1, 2, 1]))
    assert timings == [] and upfirdn2d._plugin.choices == {} and plugin.served[3] > 0  # untimed, the kernel serves
