"""A stand-in for the CUDA plugins of ops/ where there is no GPU: the kernels' per-element arithmetic
(ops/*.cu, included verbatim) compiled by nvcc for the host and called through ctypes, with the same
calls and checks as bias_act.cpp / upfirdn2d.cpp. It is built once per machine and version of the
sources, into $GNGAN_CACHE_DIR/host_kernels (default ~/.cache/gngan/host_kernels), and shared by every
test process (see cached_library); tests/conftest.py loads it (the `host_kernels` fixture) for
tests/test_custom_ops.py and tests/test_kernel_choice.py.
"""

import collections
import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

import filelock  # a dependency of torch itself
import numpy as np
import torch
import torch.utils.cpp_extension

import dnnlib
from ops import upfirdn2d

OPS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'ops')
NVCC = shutil.which('nvcc')
TORCH_INCLUDES = [f'-I{path}' for path in torch.utils.cpp_extension.include_paths()]
CACHE_ROOT = os.path.join(dnnlib.util.default_cache_dir(), 'host_kernels')  # Read once, before any test sets it.

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


def _compiler_id(nvcc: str) -> str:
    """The compiler as it identifies itself (`nvcc --version`), with its path."""
    result = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60)
    return f'{os.path.realpath(nvcc)}\n{result.stdout}'


def build_key(nvcc: str) -> str:
    """Hash of everything the host build depends on: the wrappers, the kernels' sources and headers in ops/, the
    torch headers (torch's version and include paths) and the compiler."""
    sha = hashlib.sha256()
    for name, text in sorted(_HOST_WRAPPERS.items()):
        sha.update(f'{name}\n{text}'.encode())
    for path in sorted(glob.glob(os.path.join(OPS_DIR, '*.cu')) + glob.glob(os.path.join(OPS_DIR, '*.h'))):
        with open(path, 'rb') as f:
            sha.update(os.path.basename(path).encode() + f.read())
    sha.update(f'{torch.__version__}\n{TORCH_INCLUDES}\n{_compiler_id(nvcc)}'.encode())
    return sha.hexdigest()[:16]


def _compile(folder: str, nvcc: str) -> str:
    """Both wrappers compiled and linked into one library in `folder`; its path."""
    sources = []
    for name, text in _HOST_WRAPPERS.items():
        sources.append(os.path.join(folder, f'host_{name}.cu'))
        with open(sources[-1], 'w') as f:
            f.write(text)
    library = os.path.join(folder, 'host_kernels.so')
    result = subprocess.run([nvcc, '-shared', '-std=c++17', '-Xcompiler', '-fPIC', f'-I{OPS_DIR}', *TORCH_INCLUDES,
                             *sources, '-o', library], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return library


def cached_library(cache_root: str = CACHE_ROOT, nvcc: str = NVCC) -> str:
    """Path of the host build of both kernels' arithmetic, built once per machine and version of the sources.

    The library lives in cache_root/<build_key>/host_kernels.so. The first process to ask builds it in a private
    folder beside it and renames it into place; a file lock (fcntl, through filelock) makes the others (the
    workers of pytest-xdist) wait for that build and then load it, instead of building it again.
    """
    folder = os.path.join(cache_root, build_key(nvcc))
    library = os.path.join(folder, 'host_kernels.so')
    os.makedirs(folder, exist_ok=True)
    with filelock.FileLock(os.path.join(folder, 'build.lock')):
        if not os.path.isfile(library):
            with tempfile.TemporaryDirectory(dir=folder) as private:
                os.replace(_compile(private, nvcc), library)
    return library


def _pointer(array):
    return None if array is None else array.ctypes.data_as(ctypes.POINTER(ctypes.c_double))


def _as_float64(tensor):
    return None if tensor is None else np.ascontiguousarray(tensor.detach().cpu().double().numpy())


def _span(tensor):
    """The elements of a tensor's storage from its first to its last element, as a float64 array."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return np.ascontiguousarray(tensor.detach().as_strided([span], [1]).cpu().double().numpy())


class HostPlugin:
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


def input_in_layout(layout):
    """A float64 [2, 3, 5, 6] tensor laid out as named, with values spread over the activations' curvature."""
    torch.manual_seed(0)
    big = torch.randn([2, 5, 5, 9], dtype=torch.float64) * 2
    x = big[:, 1:4, :, 2:8]  # sliced: strided in the channel and width dimensions
    if layout == 'contiguous':
        x = x.contiguous()
    if layout == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    return x


class UpsamplingOnePercentOff(HostPlugin):
    """upfirdn2d whose upsampling passes are 1% too large; everything else is right."""

    def upfirdn2d(self, x, f, taps, up_x, *args):
        return super().upfirdn2d(x, f, taps, up_x, *args) * (1.01 if up_x > 1 else 1)
