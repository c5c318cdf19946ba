"""Just-in-time build of the C++/CUDA extensions in ops/, and the kernels' self-check.

Build. The sources are compiled with ninja through torch.utils.cpp_extension.load
into a per-user cache directory whose name carries a hash of everything that
affects the binary (the sources and headers, the torch and CUDA versions, the
toolkit, the target architectures, the build options). So a build happens once
per machine and version of the code; later processes only load the shared
library. When several processes start at the same time (one per GPU under
torch.distributed), an OS-level file lock makes one of them build while the
others wait and then load its result; the lock is released by the OS even if
the building process dies.

Toolkit. torch guesses CUDA_HOME as the parent of the directory of the first
`nvcc` on the PATH, which is wrong when that nvcc is a wrapper script or a link
living outside the toolkit, and it cannot pick target architectures without a
visible GPU. find_cuda_home() looks, in order, at $CUDA_HOME and $CUDA_PATH, at
the real file behind the `nvcc` on the PATH (links resolved), at the toolkit
that nvcc reports itself (`nvcc --dryrun` prints its own location), and at the
usual install prefixes; a candidate counts only if it holds bin/nvcc and
include/cuda_runtime.h. cuda_arch_list() targets the visible GPUs, or without
one the architectures the installed torch was built for, limited to those the
toolkit's nvcc can generate; $TORCH_CUDA_ARCH_LIST, when set, wins. A toolkit whose CUDA
major version differs from the one torch was built with is refused with a plain message (a
different minor version builds and runs: CUDA's minor version compatibility).

Failure. A failed build raises BuildError: one line naming the cause plus the
compiler's own error lines (not the command lines). GNGAN_VERBOSE_BUILD=1
streams the full build log instead.

Self-check. LazyPlugin.trusted() runs an op's check (compare_to_reference on
random inputs spanning several thread blocks, once more with a launch too small
to cover them so that the kernels' grid-stride and plane loops run; values,
first- and second-order gradients, judged per element) the first time each
(device, dtype, configuration) appears in a process. On disagreement, or on any
error while checking (a launch failure, a CUDA error), it warns once naming the
op, the configuration and the cause, and that configuration uses the reference
implementation from then on; other configurations keep the kernel.
GNGAN_OPS_SELFCHECK=0 switches the check off (for benchmarking).

Choice. LazyPlugin.faster() times a trusted kernel against the reference, forward
and backward, the first time each configuration and shape appears, and lets the
faster one serve it for the rest of the process, so a kernel never makes training
slower. time_call() times the device's work: 20 back-to-back calls queued behind a
spin kernel, so that CUDA events around them see the kernels and not the host's
Python (which, below a few MB, would otherwise decide, and equally for both paths);
median of three rounds after a warm-up. GNGAN_OPS_AUTOTUNE=0 always uses the
kernel. bench/gpu_report.py lists the choices.

Per call. The ops keep, in LazyPlugin.plans, how they serve each combination of
their arguments' metadata (device, dtype, shape, strides, op settings): a call whose
metadata was seen before costs one dictionary look-up before the kernel's launch.
So the switches above are read when a combination is first seen; to apply a change
to combinations seen before, replace the plugin's verdicts or choices (which drops
its plans).
"""

import contextlib
import glob
import hashlib
import os
import re
import shutil
import subprocess
import time
import warnings
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

import filelock  # a dependency of torch itself
import torch
import torch.utils.cpp_extension

VERBOSE_BUILD_ENV = 'GNGAN_VERBOSE_BUILD'  # 1: show the toolkit found, the target architectures and the full build log
SELF_CHECK_ENV = 'GNGAN_OPS_SELFCHECK'  # 0: trust the kernels without comparing them with the references
AUTOTUNE_ENV = 'GNGAN_OPS_AUTOTUNE'  # 0: use a trusted kernel without timing it against the reference

USUAL_PREFIXES = ['/usr/local/cuda', '/usr/local/cuda-*', '/opt/cuda', '/usr']  # last resort, in this order
_TOOLKIT_FILES = [os.path.join('bin', 'nvcc'), os.path.join('include', 'cuda_runtime.h')]

_loaded_plugins: dict = {}  # cache key -> loaded module, so each plugin is loaded once per process


class BuildError(RuntimeError):
    """A plugin cannot be built or loaded here.

    cause: one line naming why; details: the compiler's error lines, if it got that far.
    """

    def __init__(self, cause: str, details: Sequence[str] = ()):
        self.cause = cause
        self.details = list(details)
        super().__init__('\n'.join([cause, *self.details]))


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() not in ('', '0', 'false', 'no', 'off')


def _cache_root() -> str:
    """Where built extensions live: $TORCH_EXTENSIONS_DIR if set, else a per-user cache dir."""
    if os.environ.get('TORCH_EXTENSIONS_DIR'):
        return os.environ['TORCH_EXTENSIONS_DIR']
    cache_home = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(cache_home, 'gngan', 'torch_extensions')

# ----------------------------------------------------------------------------
# Toolkit discovery.


def _toolkit_problem(path: str) -> Optional[str]:
    """None if path is a CUDA toolkit (bin/nvcc and include/cuda_runtime.h), else what it lacks."""
    if not os.path.isdir(path):
        return 'no such directory'
    missing = [name for name in _TOOLKIT_FILES if not os.path.isfile(os.path.join(path, name))]
    return f'no {" or ".join(missing)}' if missing else None


def _nvcc_reported_home(nvcc: str) -> Optional[str]:
    """The toolkit directory an nvcc executable (or a wrapper around one) belongs to, as nvcc says itself.

    `nvcc --dryrun` lists the steps it would run, among them `#$ TOP=<its bin directory>/..`.
    """
    try:
        result = subprocess.run([nvcc, '--dryrun', '-c', '-x', 'cu', os.devnull, '-o', os.devnull],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'^#\$ TOP=(.+)$', result.stdout + result.stderr, re.MULTILINE)
    return os.path.normpath(match.group(1).strip().strip('"')) if match else None


def _version_key(path: str) -> List[int]:
    return [int(n) for n in re.findall(r'\d+', os.path.basename(path))]


def _cuda_home_candidates() -> Iterator[Tuple[str, str]]:
    """(directory, where the guess comes from), most trustworthy first; computed lazily."""
    for var in ('CUDA_HOME', 'CUDA_PATH'):
        if os.environ.get(var):
            yield os.environ[var], f'${var}'
    nvcc = shutil.which('nvcc')
    if nvcc is not None:
        yield os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), f'the nvcc on the PATH ({nvcc})'
        reported = _nvcc_reported_home(nvcc)
        if reported is not None:
            yield reported, f'what {nvcc} reports'
    for pattern in USUAL_PREFIXES:
        for path in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            yield path, 'a usual install prefix'


def find_cuda_home() -> Tuple[Optional[str], List[str]]:
    """(the CUDA toolkit directory or None, what was tried and why it was rejected)."""
    tried = []
    seen = set()
    for path, origin in _cuda_home_candidates():
        path = os.path.abspath(path)
        if path in seen:
            continue
        seen.add(path)
        problem = _toolkit_problem(path)
        if problem is None:
            return path, tried
        tried.append(f'{path} from {origin}: {problem}')
    return None, tried


def _arch_from_torch(name: str) -> Optional[str]:
    """'sm_86' -> '8.6', 'sm_90a' -> '9.0a', 'sm_120' -> '12.0'; None for anything else (e.g. compute_90)."""
    match = re.fullmatch(r'sm_(\d+)(\d)([a-z]?)', name)
    return f'{match.group(1)}.{match.group(2)}{match.group(3)}' if match else None


def _nvcc_archs(nvcc: str) -> Optional[List[str]]:
    """The virtual architectures nvcc can generate code for, as 'X.Y', or None if it cannot say."""
    try:
        result = subprocess.run([nvcc, '--list-gpu-arch'], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    archs = re.findall(r'compute_(\d+)(\d)\b', result.stdout)
    return [f'{major}.{minor}' for major, minor in archs] or None


def cuda_arch_list(nvcc: str) -> str:
    """The TORCH_CUDA_ARCH_LIST to build with: the environment's, else the visible GPUs', else torch's own.

    Architectures nvcc cannot generate are replaced by the newest one it can that is
    not newer (the driver JIT-compiles its PTX); the newest entry carries +PTX.
    """
    if os.environ.get('TORCH_CUDA_ARCH_LIST'):
        return os.environ['TORCH_CUDA_ARCH_LIST']
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        wanted = [f'{major}.{minor}' for major, minor in
                  (torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))]
    else:
        wanted = [arch for arch in map(_arch_from_torch, torch.cuda.get_arch_list()) if arch is not None]
    supported = _nvcc_archs(nvcc)
    if supported is not None:
        number = lambda arch: tuple(int(n) for n in re.findall(r'\d+', arch))  # noqa: E731
        chosen = []
        for arch in wanted:
            if arch.rstrip('abcdefghijklmnopqrstuvwxyz') not in supported:
                older = [s for s in supported if number(s) <= number(arch)]
                arch = max(older, key=number) if older else None
            if arch is not None:
                chosen.append(arch)
        wanted = chosen
    if not wanted:
        raise BuildError(f'no target GPU architecture: torch lists {torch.cuda.get_arch_list()}, nvcc offers '
                         f'{supported}; set TORCH_CUDA_ARCH_LIST (e.g. "8.6")')
    unique = sorted(set(wanted), key=lambda arch: tuple(int(n) for n in re.findall(r'\d+', arch)))
    return ';'.join(unique[:-1] + [unique[-1] + '+PTX'])


def toolkit_cuda_version(cuda_home: str) -> Optional[str]:
    """The CUDA version of a toolkit, 'X.Y', as its nvcc reports it ('release X.Y'), else None."""
    try:
        result = subprocess.run([os.path.join(cuda_home, 'bin', 'nvcc'), '--version'], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'release (\d+\.\d+)', result.stdout)
    return match.group(1) if match else None


def _check_build_environment() -> Tuple[str, str]:
    """(CUDA toolkit directory, arch list); raises BuildError with a one-line cause when building is impossible."""
    if torch.version.cuda is None:
        raise BuildError(f'this PyTorch build ({torch.__version__}) has no CUDA support')
    cuda_home, tried = find_cuda_home()
    if cuda_home is None:
        raise BuildError('the CUDA toolkit was not found (tried: ' + ('; '.join(tried) or 'nothing') +
                         '); set CUDA_HOME to the directory holding bin/nvcc and include/cuda_runtime.h')
    toolkit = toolkit_cuda_version(cuda_home)
    if toolkit is not None and toolkit.split('.')[0] != torch.version.cuda.split('.')[0]:
        # PyTorch itself refuses such builds: a kernel built with another major version of CUDA
        # than the torch it links against may not load, or fail at launch on an older driver.
        raise BuildError(f'the CUDA toolkit at {cuda_home} is CUDA {toolkit}, but this PyTorch '
                         f'({torch.__version__}) was built with CUDA {torch.version.cuda}; install a CUDA '
                         f'{torch.version.cuda.split(".")[0]}.x toolkit and set CUDA_HOME to it')
    if not torch.utils.cpp_extension.is_ninja_available():
        raise BuildError('ninja was not found; pip install ninja')
    return cuda_home, cuda_arch_list(os.path.join(cuda_home, 'bin', 'nvcc'))


@contextlib.contextmanager
def _toolkit(cuda_home: str, arch_list: str):
    """Make torch's extension builder use this toolkit and these architectures, then restore its settings."""
    saved_home = torch.utils.cpp_extension.CUDA_HOME
    saved_env = {name: os.environ.get(name) for name in ('CUDA_HOME', 'TORCH_CUDA_ARCH_LIST')}
    torch.utils.cpp_extension.CUDA_HOME = cuda_home
    os.environ.update(CUDA_HOME=cuda_home, TORCH_CUDA_ARCH_LIST=arch_list)
    try:
        yield
    finally:
        torch.utils.cpp_extension.CUDA_HOME = saved_home
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_ERROR_LINE = re.compile(r'\berrors?\b|undefined reference|undefined symbol|cannot find|no such file', re.IGNORECASE)
_NINJA_LINE = re.compile(r'^(\[\d+/\d+\] |FAILED: |ninja: |Error building extension)')


def compiler_errors(log: str, limit: int = 20) -> List[str]:
    """The compiler's and linker's error lines in a ninja build log, without ninja's command lines."""
    lines = []
    for line in log.splitlines():
        line = line.rstrip()
        if (_ERROR_LINE.search(line) and not _NINJA_LINE.match(line) and 'TORCH_EXTENSION_NAME' not in line
                and line not in lines):
            lines.append(line)
    return lines[:limit]

# ----------------------------------------------------------------------------
# Build and load.


def _source_hash(paths: Sequence[str], build_kwargs: dict) -> str:
    """Hash of the file names and contents plus everything else that changes the binary."""
    md5 = hashlib.md5()
    for path in paths:
        md5.update(os.path.basename(path).encode())
        with open(path, 'rb') as f:
            md5.update(f.read())
    md5.update(repr(sorted(build_kwargs.items())).encode())
    md5.update(f'{torch.__version__} {torch.version.cuda}'.encode())
    return md5.hexdigest()[:16]


def get_plugin(module_name: str, sources: Sequence[str], headers: Optional[Sequence[str]] = None,
               source_dir: Optional[str] = None, **build_kwargs: Any):
    """Build (once) and import a C++/CUDA extension; returns the loaded Python module.

    sources/headers are file names, relative to source_dir when it is given.
    build_kwargs go to torch.utils.cpp_extension.load (e.g. extra_cuda_cflags).
    Raises BuildError when the build is impossible or fails; callers that can
    fall back should catch it (see LazyPlugin).
    """
    headers = list(headers or [])
    if source_dir is not None:
        sources = [os.path.join(source_dir, name) for name in sources]
        headers = [os.path.join(source_dir, name) for name in headers]
    all_files = list(sources) + headers
    verbose = _flag(VERBOSE_BUILD_ENV, '0')
    cuda_home, arch_list = _check_build_environment()
    digest = _source_hash(all_files, dict(build_kwargs, cuda_home=cuda_home, arch_list=arch_list))
    key = f'{module_name}-{digest}'
    if key in _loaded_plugins:
        return _loaded_plugins[key]
    if verbose:
        print(f'{module_name}: CUDA toolkit {cuda_home}, TORCH_CUDA_ARCH_LIST={arch_list}', flush=True)

    # The build directory is specific to this version of the code, so a change
    # of the sources never mixes with an older build, and the copied sources
    # give ninja stable paths and timestamps (an unchanged build is a no-op).
    build_dir = os.path.join(_cache_root(), key)
    os.makedirs(build_dir, exist_ok=True)
    with filelock.FileLock(os.path.join(build_dir, 'build.flock')), _toolkit(cuda_home, arch_list):
        # torch's own build baton: a crashed build can leave it behind, and
        # while we hold our lock nobody else can be using it.
        stale_baton = os.path.join(build_dir, 'lock')
        if os.path.exists(stale_baton):
            os.remove(stale_baton)
        for path in all_files:
            target = os.path.join(build_dir, os.path.basename(path))
            if not os.path.isfile(target):
                shutil.copyfile(path, target + '.tmp')
                os.replace(target + '.tmp', target)
        if not os.path.isfile(os.path.join(build_dir, f'{module_name}.so')):
            print(f'Building {module_name} for {arch_list} in {build_dir} (once per version of the code)...',
                  flush=True)
        copied_sources = [os.path.join(build_dir, os.path.basename(path)) for path in sources]
        try:
            module = torch.utils.cpp_extension.load(name=module_name, sources=copied_sources,
                                                    build_directory=build_dir, verbose=verbose, **build_kwargs)
        except ImportError as err:
            raise BuildError(f'{module_name} was built but does not load: {" ".join(str(err).split())}') from err
        except (RuntimeError, OSError, ValueError) as err:
            errors = compiler_errors(str(err))
            if errors:
                raise BuildError(f'compiling {module_name} failed with CUDA toolkit {cuda_home}', errors) from err
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise BuildError(f'building {module_name} failed: {first_line[:300]}') from err
    _loaded_plugins[key] = module
    return module

# ----------------------------------------------------------------------------
# Self-check.

# Largest accepted error per element (see compare_to_reference), by the kernel's dtype.
SELF_CHECK_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def compare_to_reference(kernel: Callable, reference: Callable, inputs: Sequence[Optional[torch.Tensor]],
                         names: Sequence[str], seed: int = 0) -> Tuple[float, str]:
    """How far kernel(*inputs) is from reference(*inputs in float64), in value, first- and second-order gradients.

    The first-order target sum(r * y^2) makes the incoming gradient depend on the
    inputs, so the second-order pass (target sum(r_i * grad_i)) runs through the
    backward of the backward, as gradient normalization does. r, r_i are drawn
    from a private generator: the global random state is left untouched.
    Returns (worst error, which quantity). Errors are judged per element, against the
    element's own magnitude plus the quantity's root mean square:

        error(q) = max_i |q_kernel[i] - q_reference[i]| / (|q_reference[i]| + rms(q_reference))

    so a wrong small element counts as much as a wrong large one (the RMS term only keeps
    elements at zero crossings, where rounding of the terms dominates, from counting as
    infinitely wrong). NaN counts as the worst error.
    """
    present = [i for i, x in enumerate(inputs) if x is not None]
    device = inputs[present[0]].device
    generator = torch.Generator(device=device)
    results = []
    for fn, dtype in ((reference, torch.float64), (kernel, None)):
        generator.manual_seed(seed)
        args = [None if x is None else x.detach().to(dtype or x.dtype).requires_grad_() for x in inputs]
        diff_args = [args[i] for i in present]
        y = fn(*args)
        r = torch.randn(y.shape, generator=generator, device=device, dtype=torch.float64)
        first = torch.autograd.grad((r * y.double().square()).sum(), diff_args, create_graph=True)
        r_first = [torch.randn(g.shape, generator=generator, device=device, dtype=torch.float64) for g in first]
        second = torch.autograd.grad(sum((g.double() * q).sum() for g, q in zip(first, r_first)), diff_args,
                                     allow_unused=True)
        results.append([y, *first, *second])
    labels = ['value'] + [f'gradient w.r.t. {names[i]}' for i in present] + \
             [f'second-order gradient w.r.t. {names[i]}' for i in present]
    errors = []
    for label, expected, actual in zip(labels, *results):
        expected = torch.zeros([1], device=device) if expected is None else expected.detach().double()
        actual = torch.zeros([1], device=device) if actual is None else actual.detach().double()
        scale = expected.abs() + expected.square().mean().sqrt()
        error = ((actual - expected).abs() / scale.clamp(min=1e-300)).max().item()
        errors.append((error, label))
    return worst_of(errors)


def worst_of(results: Sequence[Tuple[float, str]]) -> Tuple[float, str]:
    """The (error, where) pair with the largest error, NaN counting as the largest."""
    return max(results, key=lambda result: float('inf') if result[0] != result[0] else result[0])


_spin_cycles_per_ms: Dict[torch.device, float] = {}  # GPU -> clock cycles of torch.cuda._sleep per millisecond


def _spin_rate(device: torch.device) -> float:
    """Cycles per millisecond of the spin kernel torch.cuda._sleep on `device`, measured once."""
    if device not in _spin_cycles_per_ms:
        cycles = 10 ** 7
        torch.cuda._sleep(cycles // 10)  # pylint: disable=protected-access  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)  # pylint: disable=protected-access
        end.record()
        end.synchronize()
        _spin_cycles_per_ms[device] = cycles / max(start.elapsed_time(end), 1e-3)
    return _spin_cycles_per_ms[device]


def time_call(fn: Callable[[], Any], device: torch.device, calls: int = 20, rounds: int = 3) -> float:
    """Milliseconds of device work per fn() call: the median of `rounds` of `calls` back-to-back calls, after a warm-up.

    On a GPU, the host first measures how long it takes to queue `calls` calls; then a spin kernel
    (torch.cuda._sleep) holds the stream for twice that plus a millisecond while the host queues
    them again behind it, and CUDA events around the queued calls time the device alone. Without
    the spin, on small tensors the events would time the host's Python and launch overhead, the
    same for both paths whatever their kernels do. On other devices: the wall clock.
    """
    if device.type != 'cuda':
        fn()
        times = []
        for _ in range(rounds):
            start_s = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start_s) * 1e3 / calls)
        return sorted(times)[len(times) // 2]
    with torch.cuda.device(device):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(device)
        start_s = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = (time.perf_counter() - start_s) * 1e3
        torch.cuda.synchronize(device)
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int((2 * host_ms + 1) * _spin_rate(device)))  # pylint: disable=protected-access
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def _describe(config: Hashable) -> str:
    """A configuration tuple as one readable line (dataclasses and dtypes print themselves)."""
    return ', '.join(str(part).replace('torch.', '') for part in config) if isinstance(config, tuple) else str(config)


class _DropsPlans:
    """A LazyPlugin attribute from which its plans follow (verdicts, choices): replacing it, to check or time
    afresh, drops the plans."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = '_' + name

    def __get__(self, plugin: Optional['LazyPlugin'], owner: Optional[type] = None) -> Any:
        return self if plugin is None else getattr(plugin, self.slot)

    def __set__(self, plugin: 'LazyPlugin', value: Dict[Hashable, Any]) -> None:
        setattr(plugin, self.slot, value)
        plugin.plans = {}


class LazyPlugin:
    """A plugin that an op builds on first use, checks, times, and otherwise replaces by its reference.

    get() tries get_plugin() once per process. If that fails for any reason
    (no CUDA toolkit, CPU-only PyTorch, compiler error), it warns once that the
    op falls back to its slower reference implementation, with the cause and
    the compiler's error lines, and returns None from then on. trusted() runs
    the op's self-check for each new configuration, faster() times the kernel
    against the reference for each new shape (see the module docstring).
    """

    device_type = 'cuda'  # tensors on other devices always take the reference path
    verdicts = _DropsPlans()
    choices = _DropsPlans()
    timer = staticmethod(time_call)  # (fn, device) -> milliseconds; the tests install a fake clock

    def __init__(self, op_name: str, module_name: str, sources: Sequence[str], headers: Sequence[str],
                 source_dir: str, **build_kwargs: Any):
        self.op_name = op_name  # name used in the warnings
        self.plugin_args = dict(module_name=module_name, sources=sources, headers=headers, source_dir=source_dir,
                                **build_kwargs)
        self.module = None  # the loaded extension, once built
        self.failed = False  # set after a failed build, so we never retry or warn twice
        self.plans: Dict[Hashable, Any] = {}  # the op's arguments' metadata -> how it serves them (see the ops)
        self.verdicts: Dict[Hashable, bool] = {}  # configuration -> passed its self-check (or was not checked)
        self.check_results: Dict[Hashable, dict] = {}  # configuration -> error, where, tolerance, milliseconds, cause
        self.choices: Dict[Hashable, dict] = {}  # configuration and shape -> kernel_ms, reference_ms, kernel

    def get(self):
        if self.module is None and not self.failed:
            try:
                self.module = get_plugin(**self.plugin_args)
            except Exception as err:  # any build failure means: use the reference implementation
                self.failed = True
                cause, details = (err.cause, err.details) if isinstance(err, BuildError) else \
                    (f'{type(err).__name__}: {" ".join(str(err).split())[:300]}', [])
                hint = '' if _flag(VERBOSE_BUILD_ENV, '0') else f' ({VERBOSE_BUILD_ENV}=1 shows the full build log)'
                warnings.warn('\n    '.join([f'{self.op_name}: CUDA kernel unavailable, using the slower reference '
                                            f'implementation{hint}: {cause}', *details]), RuntimeWarning,
                              stacklevel=3)
        return self.module

    def usable(self, device: torch.device) -> bool:
        """Whether tensors on `device` can take the kernel path (the plugin builds, or has been built)."""
        return device.type == self.device_type and self.get() is not None

    def trusted(self, config: Hashable, check: Callable[[], Tuple[float, str]], dtype: torch.dtype) -> bool:
        """Whether the kernel may serve `config` (which includes device and dtype).

        The first time a config appears, check() runs the kernel against the reference
        and returns (error, where). An error above SELF_CHECK_TOLERANCE[dtype], or any
        exception on the way (a launch failure, a CUDA error, a failed allocation), warns
        once and sends this config to the reference for the rest of the process; other
        configs keep the kernel.
        """
        verdict = self.verdicts.get(config)
        if verdict is None:
            verdict = True
            if _flag(SELF_CHECK_ENV, '1'):
                tolerance = SELF_CHECK_TOLERANCE.get(dtype, 1e-1)
                start = time.perf_counter()
                try:
                    with torch.inference_mode(False), torch.enable_grad(), \
                            torch.autocast(self.device_type, enabled=False):
                        error, where = check()  # ends in .item(): the time includes the device's work
                    cause = None if error <= tolerance else \
                        f'{where} off by {error:.2g} of its magnitude, tolerance {tolerance:g}'
                except Exception as err:  # pylint: disable=broad-except  # whatever failed, the reference works
                    error, where = float('nan'), 'exception'
                    cause = f'{type(err).__name__}: {" ".join(str(err).split())[:300]}'
                self.check_results[config] = dict(error=error, where=where, tolerance=tolerance, cause=cause,
                                                  ms=(time.perf_counter() - start) * 1e3)
                if cause is not None:
                    verdict = False
                    warnings.warn(f'{self.op_name}: the CUDA kernel failed its self-check for {_describe(config)} '
                                  f'({cause}); this configuration uses the reference implementation from now on, '
                                  f'others keep the kernel.', RuntimeWarning, stacklevel=3)
            self.verdicts[config] = verdict
        return verdict

    def faster(self, key: Hashable, kernel: Callable[[torch.Tensor], torch.Tensor],
               reference: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
        """Whether the kernel is at least as fast as the reference for `key` (a configuration and a shape).

        The first time a key appears, kernel(x) and reference(x) each run forward and
        backward on a copy of x (device time per call, by self.timer: see time_call) and
        the faster one serves the key for the rest of the process. GNGAN_OPS_AUTOTUNE=0:
        always the kernel, untimed.
        """
        if not _flag(AUTOTUNE_ENV, '1'):
            return True
        choice = self.choices.get(key)
        if choice is None:
            x = x.detach().clone().requires_grad_()

            def forward_backward(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
                with torch.inference_mode(False), torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
                    y = fn(x)
                    torch.autograd.grad(y, [x], torch.ones_like(y))
            kernel_ms = self.timer(lambda: forward_backward(kernel), x.device)
            reference_ms = self.timer(lambda: forward_backward(reference), x.device)
            choice = self.choices[key] = dict(kernel_ms=kernel_ms, reference_ms=reference_ms,
                                              kernel=kernel_ms <= reference_ms)
        return choice['kernel']
