"""Just-in-time build of the C++/CUDA extensions in ops/.

The sources are compiled with ninja through torch.utils.cpp_extension.load into
a per-user cache directory whose name carries a hash of everything that affects
the binary (the sources and headers, the torch and CUDA versions, the build
options). So a build happens once per machine and version of the code; later
processes only load the shared library. When several processes start at the
same time (one per GPU under torch.distributed), an OS-level file lock makes
one of them build while the others wait and then load its result; the lock is
released by the OS even if the building process dies.
"""

import hashlib
import os
import shutil
import warnings
from typing import Any, Optional, Sequence

import filelock  # a dependency of torch itself
import torch
import torch.utils.cpp_extension

_loaded_plugins: dict = {}  # cache key -> loaded module, so each plugin is loaded once per process


def _cache_root() -> str:
    """Where built extensions live: $TORCH_EXTENSIONS_DIR if set, else a per-user cache dir."""
    if os.environ.get('TORCH_EXTENSIONS_DIR'):
        return os.environ['TORCH_EXTENSIONS_DIR']
    cache_home = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(cache_home, 'gngan', 'torch_extensions')


def _check_build_environment() -> None:
    """Raise RuntimeError with a one-line reason when a CUDA extension cannot be built here."""
    if torch.version.cuda is None:
        raise RuntimeError(f'this PyTorch build ({torch.__version__}) has no CUDA support')
    if torch.utils.cpp_extension.CUDA_HOME is None:
        raise RuntimeError('the CUDA toolkit (nvcc) was not found; set CUDA_HOME')
    if not torch.utils.cpp_extension.is_ninja_available():
        raise RuntimeError('ninja was not found; pip install ninja')


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
               source_dir: Optional[str] = None, verbose: bool = False, **build_kwargs: Any):
    """Build (once) and import a C++/CUDA extension; returns the loaded Python module.

    sources/headers are file names, relative to source_dir when it is given.
    build_kwargs go to torch.utils.cpp_extension.load (e.g. extra_cuda_cflags).
    Raises RuntimeError (or the compiler's error) when the build is impossible or fails;
    callers that can fall back should catch it (see LazyPlugin).
    """
    headers = list(headers or [])
    if source_dir is not None:
        sources = [os.path.join(source_dir, name) for name in sources]
        headers = [os.path.join(source_dir, name) for name in headers]
    all_files = list(sources) + headers
    digest = _source_hash(all_files, build_kwargs)
    key = f'{module_name}-{digest}'
    if key in _loaded_plugins:
        return _loaded_plugins[key]
    _check_build_environment()

    # The build directory is specific to this version of the code, so a change
    # of the sources never mixes with an older build, and the copied sources
    # give ninja stable paths and timestamps (an unchanged build is a no-op).
    build_dir = os.path.join(_cache_root(), key)
    os.makedirs(build_dir, exist_ok=True)
    with filelock.FileLock(os.path.join(build_dir, 'build.flock')):
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
        copied_sources = [os.path.join(build_dir, os.path.basename(path)) for path in sources]
        module = torch.utils.cpp_extension.load(name=module_name, sources=copied_sources,
                                                build_directory=build_dir, verbose=verbose, **build_kwargs)
    _loaded_plugins[key] = module
    return module


class LazyPlugin:
    """A plugin that an op builds on first use and otherwise replaces by its reference.

    get() tries get_plugin() once per process. If that fails for any reason
    (no CUDA toolkit, CPU-only PyTorch, compiler error), it warns once, in one
    line, that the op falls back to its slower reference implementation, and
    returns None from then on.
    """

    def __init__(self, op_name: str, module_name: str, sources: Sequence[str], headers: Sequence[str],
                 source_dir: str, **build_kwargs: Any):
        self.op_name = op_name  # name used in the fallback warning
        self.plugin_args = dict(module_name=module_name, sources=sources, headers=headers, source_dir=source_dir,
                                **build_kwargs)
        self.module = None  # the loaded extension, once built
        self.failed = False  # set after the first failed attempt, so we never retry or warn twice

    def get(self):
        if self.module is None and not self.failed:
            try:
                self.module = get_plugin(**self.plugin_args)
            except Exception as err:  # any build failure means: use the reference implementation
                self.failed = True
                reason = ' '.join(str(err).split())[:300] or type(err).__name__
                warnings.warn(f'{self.op_name}: CUDA kernel unavailable ({reason}); '
                              f'falling back to the slower reference implementation.', RuntimeWarning, stacklevel=3)
        return self.module
