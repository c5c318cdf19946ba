"""Just-in-time build of the C++/CUDA extensions in ops/.

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

Whether a built kernel then serves an op's call (self-check, timing against the
reference, fallback when the build fails) is decided in torch_utils/kernel_choice.py.
"""

import contextlib
import glob
import hashlib
import os
import re
import shutil
import subprocess
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import filelock  # a dependency of torch itself
import torch


def _import_cpp_extension() -> None:
    """torch.utils.cpp_extension, without the line a CUDA build of torch writes at its import on a machine without a GPU
    ("No CUDA runtime is found"; logged by current releases, printed to stderr by torch 2.5): this module finds the
    toolkit itself and says in one line why a kernel is not built."""
    import io
    import logging
    cpp_logger = logging.getLogger('torch.utils.cpp_extension')
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import torch.utils.cpp_extension  # noqa: F401
    finally:
        cpp_logger.setLevel(level)


_import_cpp_extension()

VERBOSE_BUILD_ENV = 'GNGAN_VERBOSE_BUILD'  # 1: show the toolkit found, the target architectures and the full build log

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


def env_flag(name: str, default: str) -> bool:
    """Whether the switch $name (`default` when unset) is on: anything but '', 0, false, no or off."""
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
    fall back should catch it (see kernel_choice.LazyPlugin).
    """
    headers = list(headers or [])
    if source_dir is not None:
        sources = [os.path.join(source_dir, name) for name in sources]
        headers = [os.path.join(source_dir, name) for name in headers]
    all_files = list(sources) + headers
    verbose = env_flag(VERBOSE_BUILD_ENV, '0')
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
