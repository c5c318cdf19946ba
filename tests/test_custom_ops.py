"""The CUDA sources of ops/ and their build (torch_utils/custom_ops.py).

Without a GPU, these things are still checked here:
  * every ops/*.cu compiles with nvcc against the installed torch headers;
  * the kernels' per-element arithmetic, compiled by nvcc for the host and
    called through ctypes in place of the GPU plugin (tests/support/host_plugin.py),
    drives the ops' CUDA autograd Functions (and, with CPU tensors routed
    through the ops' kernel path, the whole op: layout handling included) and
    must agree with the PyTorch references in values and in first and second
    order gradients, for contiguous, channels_last and sliced inputs, and for
    every compile-time specialisation of the upfirdn2d kernel;
  * toolkit discovery on a fake wrapper nvcc and a fake toolkit tree, the arch
    list, a toolkit of another CUDA major version, and the build failure report
    (the compiler's lines, not ninja's commands).
The self-check and the chooser between kernel and reference run in
tests/test_kernel_choice.py, the real JIT build and CUDA against the reference
in tests/test_ops_gpu.py.
"""

import glob
import os
import re
import stat
import subprocess
import sys
import warnings

import pytest
import torch
import torch.utils.cpp_extension

from ops import bias_act, upfirdn2d
from tests.support import host_plugin as host_build
from tests.support.host_plugin import NVCC, OPS_DIR, TORCH_INCLUDES, HostPlugin, input_in_layout
from tests.support.kernel_cases import SPECIALISATIONS, UPFIRDN2D_CASES
from torch_utils import custom_ops

CUDA_SOURCES = sorted(glob.glob(os.path.join(OPS_DIR, '*.cu')))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason='nvcc is not on the PATH')


@needs_nvcc
@pytest.mark.parametrize('source', CUDA_SOURCES, ids=os.path.basename)
def test_cuda_source_compiles(source, tmp_path):
    result = subprocess.run([NVCC, '-c', '-std=c++17', *TORCH_INCLUDES, source, '-o', str(tmp_path / 'kernel.o')],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------
# The kernels' arithmetic, on the host build (tests/support/host_plugin.py).


@pytest.fixture
def host_plugin(host_kernels, monkeypatch):
    plugin = HostPlugin(host_kernels)
    for op in (bias_act, upfirdn2d):
        monkeypatch.setattr(op._plugin, 'get', lambda: plugin)
        monkeypatch.setattr(op._plugin, 'module', plugin)
    return plugin


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




@pytest.mark.parametrize('case', UPFIRDN2D_CASES, ids=str)
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




@pytest.mark.parametrize('up, down, taps', SPECIALISATIONS, ids=str)
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


@pytest.mark.parametrize('layout', _LAYOUTS)
@pytest.mark.parametrize('act', list(bias_act.activation_funcs))
def test_host_bias_act_second_order_in_every_layout(host_kernels, cpu_kernel_path, act, layout):
    """channels_last and sliced inputs reach the kernel, and act'' reaches their second-order gradient.

    Before the fix, the kernel path copied x inside the autograd Function; the
    copy had no link to the caller's x, and the second-order gradient of a smooth
    activation lost its act'' term for exactly these inputs.
    """
    plugin = cpu_kernel_path(HostPlugin(host_kernels))
    x = input_in_layout(layout).requires_grad_()
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
    plugin = cpu_kernel_path(HostPlugin(host_kernels))
    x = input_in_layout('channels_last').requires_grad_()
    f = upfirdn2d.setup_filter([1, 2, 1])
    kernel = _grads(lambda x: upfirdn2d.upsample2d(x, f), [x])
    reference = _grads(lambda x: upfirdn2d.upsample2d(x, f, impl='ref'), [x])
    _assert_all_close(kernel, reference, rtol=1e-9, atol=1e-9)
    assert plugin.calls['upfirdn2d', 0] > 0
    assert kernel[0].is_contiguous(memory_format=torch.channels_last) and not kernel[0].is_contiguous()

# ----------------------------------------------------------------------------
# A failed build, and what the user is told.


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
# The host build, made once per machine.

_FAKE_NVCC = """#!{python}
import os, sys, time
args = sys.argv[1:]
if args == ['--version']:
    sys.exit(print('fake nvcc, release 1.0'))
with open({log!r}, 'a') as log:
    log.write('build ' + os.path.basename(args[-1]) + '\\n')
time.sleep(2)  # Long enough for a second process to come while the first builds.
with open(args[args.index('-o') + 1], 'w') as out:
    out.write('library')
"""

_ASK_FOR_THE_BUILD = """
import os, sys, time
from tests.support import host_plugin
open(sys.argv[1], 'w').close()
while not all(os.path.exists(path) for path in sys.argv[2:4]):  # Both processes ready: they ask at once.
    time.sleep(0.01)
print(host_plugin.cached_library(sys.argv[4], sys.argv[5]))
"""


def test_host_build_is_made_once_and_shared(tmp_path, monkeypatch):
    """Two processes asking for the host build at the same moment (as pytest-xdist's workers do): one builds, the
    other waits for it and gets the same library; later requests find it in the cache; a change of the sources makes
    another build."""
    log, cache = tmp_path / 'nvcc.log', tmp_path / 'cache'
    nvcc = _executable(tmp_path / 'bin' / 'nvcc', _FAKE_NVCC.format(python=sys.executable, log=str(log)))
    ready = [str(tmp_path / f'ready{i}') for i in range(2)]
    processes = [subprocess.Popen([sys.executable, '-c', _ASK_FOR_THE_BUILD, ready[i], *ready, str(cache), str(nvcc)],
                                  cwd=os.path.dirname(OPS_DIR), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    library = str(cache / host_build.build_key(str(nvcc)) / 'host_kernels.so')
    assert [stdout.strip() for stdout, _ in outputs] == [library, library]
    assert log.read_text().splitlines() == ['build host_kernels.so']
    assert open(library).read() == 'library'
    assert set(os.listdir(os.path.dirname(library))) - {'build.lock'} == {'host_kernels.so'}  # No private folder left.
    assert host_build.cached_library(str(cache), str(nvcc)) == library and len(log.read_text().splitlines()) == 1
    monkeypatch.setitem(host_build._HOST_WRAPPERS, 'bias_act', host_build._HOST_WRAPPERS['bias_act'] + '// changed\n')
    assert host_build.cached_library(str(cache), str(nvcc)) != library and len(log.read_text().splitlines()) == 2


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
