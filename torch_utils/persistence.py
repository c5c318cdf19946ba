"""Snapshots as plain data: networks are saved as (class name, constructor kwargs, state dict).

A pickle can execute arbitrary code when it is loaded, and GAN snapshots are routinely shared
between people. So a snapshot here never pickles a Python object graph. Instead:

  * every network class is decorated with `@persistent_class`, which records the keyword
    arguments its constructor was called with (`module.init_kwargs`) and puts the class on an
    allow-list;
  * `save_snapshot` turns each such module into {class name, init kwargs, state dict} and writes
    the result with `torch.save` (tensors + plain containers only), atomically;
  * `load_snapshot` reads it with `torch.load(weights_only=True)`, whose restricted unpickler
    builds tensors and plain containers and refuses every other global *before* running it,
    then rebuilds each network from the allow-list and loads its state dict.

A file that asks for anything else is refused with `UnsafeSnapshotError` and nothing of it runs.
So is a malformed or oversized file, before it can allocate much: the zip archive passes
torch_utils/bounded_read.py's check (entries stored uncompressed, as torch.save writes them, and
within the file; the pickled object graph at most MAX_PICKLE_BYTES; see its bound), nesting is
capped, every {'class_name': ...} dict passes dnnlib.util.check_class_kwargs, and each network
is first built on the meta device (shapes, no storage) and compared with its state dict, so that
kwargs asking for a huge network are refused before anything of that size is allocated.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import threading
import warnings
import zipfile
from typing import Any, BinaryIO, TypeVar

import numpy as np
import torch

import dnnlib
from torch_utils import bounded_read

#----------------------------------------------------------------------------

_SNAPSHOT_FORMAT = 'gngan-snapshot'
_SNAPSHOT_VERSION = 1
_MODULE_TAG = '__persistent_module__'

# Entries the training loop writes and the tools read; a snapshot whose entry has another type is refused.
_ENTRY_TYPES = {'G': torch.nn.Module, 'D': torch.nn.Module, 'G_ema': torch.nn.Module, 'training_set_kwargs': (dict, type(None)),
                'progress': dict, 'G_opt_state': dict, 'D_opt_state': dict, 'cfg': dict,
                'experiment': dict}

_registry: dict[str, type] = {}  # 'module.QualName' -> class, filled by @persistent_class.

T = TypeVar('T', bound=type)


class UnsafeSnapshotError(RuntimeError):
    """The file is not a snapshot that can be loaded safely: it asks for foreign code, is malformed, or is too large.

    The message is one line that names the file and what is wrong; nothing of the file has run.
    """


def class_name_of(cls: type) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


def persistent_class(cls: T) -> T:
    """Class decorator: record constructor kwargs on the instance and allow-list the class.

    The constructor must be called with keyword arguments of plain data only. After it returns,
    `self.init_kwargs` holds a deep copy of them (for a subclass of another persistent class the
    outermost constructor's kwargs win, since its wrapper finishes last).
    """
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TypeError('@persistent_class expects a torch.nn.Module subclass')
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        if args:
            raise TypeError(f'{cls.__name__}() takes keyword arguments only '
                            f'(they are recorded so that snapshots can rebuild it)')
        try:
            dnnlib.util.check_plain(kwargs, f'{cls.__name__}()')
        except dnnlib.util.ConfigError as e:
            raise TypeError(f'{e} (constructor arguments of persistent classes are recorded in snapshots)') from None
        orig_init(self, **kwargs)
        object.__setattr__(self, 'init_kwargs', dnnlib.EasyDict(copy.deepcopy(kwargs)))

    cls.__init__ = __init__
    _registry[class_name_of(cls)] = cls
    dnnlib.util.register_class(cls)
    return cls


def is_persistent(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module) and _registry.get(class_name_of(type(obj))) is type(obj)

#----------------------------------------------------------------------------
# Saving.


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, torch.nn.Module):
        if not is_persistent(value):
            raise TypeError(f'{where}: {type(value).__name__} is not decorated with @persistent_class')
        state = {k: v.detach().cpu().clone() for k, v in value.state_dict().items()}
        return {_MODULE_TAG: class_name_of(type(value)),
                'init_kwargs': dnnlib.util.to_plain(value.init_kwargs),
                'state_dict': state}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dnnlib.util.PLAIN_SCALARS):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f'{where}: snapshot dict keys must be str or int')
            out[k] = _encode(v, f'{where}.{k}')
        return out
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f'{where}[{i}]') for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    raise TypeError(f'{where}: cannot store {type(value).__name__} in a snapshot (plain data only)')


_TEMP_FILE = re.compile(r'\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp')  # .<name>.<writer pid>.<random>.tmp


def save_snapshot(path: str, data: dict[str, Any]) -> None:
    """Write `data` to `path` as plain data, atomically (temporary file + rename).

    A crash mid-write leaves at most a stray temporary file `.<name>.<pid>.<random>.tmp` (see
    remove_stale_temporaries), never a truncated snapshot. The file gets the permissions of any other
    new file (0666 less the umask).
    """
    payload = {'format': _SNAPSHOT_FORMAT, 'version': _SNAPSHOT_VERSION, 'data': _encode(data, 'snapshot')}
    with dnnlib.util.atomic_path(path) as tmp:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), 'wb') as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())


def remove_stale_temporaries(dirname: str) -> list[str]:
    """Delete the temporary files that save_snapshot left in `dirname` when its process was killed
    (kill -9, power loss) and return their paths. Files of a writer that is still running are kept."""
    removed = []
    for fname in sorted(os.listdir(dirname)) if os.path.isdir(dirname) else []:
        m = _TEMP_FILE.fullmatch(fname)
        if m is None or _process_alive(int(m.group('pid'))):
            continue
        try:
            os.remove(os.path.join(dirname, fname))
            removed.append(os.path.join(dirname, fname))
        except FileNotFoundError:
            pass  # Removed by someone else meanwhile.
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # Another user's process (or a pid we cannot probe): keep its file.
    return True

#----------------------------------------------------------------------------
# Loading.


def _check_archive(f: BinaryIO, where: str) -> None:
    """Refuse what torch.load could not read within bounded_read's bound, before it reads anything."""
    if not zipfile.is_zipfile(f):
        raise UnsafeSnapshotError(f'{where}: refused to load: not a snapshot (expected the zip archive that torch.save '
                                  f'writes; legacy pickles are not read); nothing in it was run')
    try:
        bounded_read.check_torch_archive(f, where)
    except bounded_read.RefusedFileError as e:
        raise UnsafeSnapshotError(str(e)) from None


def _check_tensor(t: torch.Tensor, where: str) -> None:
    """A tensor read from a file must hold the elements it shows: a broadcast view (stride 0) would let
    a few stored bytes stand for any number of elements, and so for a network of any size."""
    if t.numel() * t.element_size() > t.untyped_storage().nbytes() or any(
            stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride())):
        raise UnsafeSnapshotError(f'{where}: a tensor of shape {list(t.shape)} over only '
                                  f'{t.untyped_storage().nbytes()} stored bytes')


class _ShapesOnly(torch.overrides.TorchFunctionMode):
    """Inside torch.device('meta'): keep tensors moved to an explicit device on meta too, and skip
    functions that return their input's shape and whose meta kernels are slow Python references
    (the in-place initializers; normalize, which spectral norm's power iteration calls)."""
    _SKIPPED = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_, torch.Tensor.copy_,
                torch.nn.functional.normalize}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._SKIPPED or func is torch.Tensor.cpu:
            return args[0]
        if 'device' in kwargs:
            kwargs = dict(kwargs, device='meta')
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, torch.device)):
            args = (args[0], 'meta', *args[2:])
        return func(*args, **kwargs)


_meta_cache: dict[tuple[str, str, int, int | None], torch.nn.Module] = {}  # G and G_ema share one probe.


def _shapes_of(cls: type, kwargs: dict, max_bytes: int, max_tensors: int | None = None) -> dict[str, tuple[int, ...]]:
    """State dict shapes of the network cls(**kwargs), built on the meta device without storage (_meta_network)."""
    return {k: tuple(v.shape) for k, v in _meta_network(cls, kwargs, max_bytes, max_tensors).state_dict().items()}


def _meta_network(cls: type, kwargs: dict, max_bytes: int, max_tensors: int | None = None) -> torch.nn.Module:
    """The network cls(**kwargs), built on the meta device without storage (kept for the same arguments).

    Building stops as soon as the registered parameters and buffers exceed max_bytes, or number more
    than max_tensors (None: any number), so a loop asking for millions of layers, however small,
    ends early too.
    """
    key = (class_name_of(cls), json.dumps(kwargs, sort_keys=True), max_bytes, max_tensors)
    if key in _meta_cache:
        return _meta_cache[key]
    nbytes, seen, thread = 0, set(), threading.get_ident()

    def count(_module: torch.nn.Module, _name: str, tensor: torch.Tensor | None) -> None:
        nonlocal nbytes
        if tensor is not None and id(tensor) not in seen and threading.get_ident() == thread:
            seen.add(id(tensor))  # Parametrizations register a tensor again under a new name.
            nbytes += tensor.numel() * tensor.element_size()
            if nbytes > max_bytes:
                raise UnsafeSnapshotError(f'asks for a network of more than {max_bytes:,} bytes of parameters and '
                                          f'buffers, far more than the file holds')
            if max_tensors is not None and len(seen) > max_tensors:
                raise UnsafeSnapshotError(f'asks for a network of more than {max_tensors:,} parameters and buffers, '
                                          f'far more than the file holds')
    hooks = [torch.nn.modules.module.register_module_parameter_registration_hook(count),
             torch.nn.modules.module.register_module_buffer_registration_hook(count)]
    try:
        with torch.device('meta'), _ShapesOnly():
            module = cls(**copy.deepcopy(kwargs))
    finally:
        for hook in hooks:
            hook.remove()
    _meta_cache[key] = module
    return module


def network_shapes(network_kwargs: dict) -> dict[str, tuple[int, ...]]:
    """State dict shapes of the network that `network_kwargs` (class_name + constructor kwargs) describes, built on
    the meta device without storage."""
    kwargs = dnnlib.util.to_plain(dict(network_kwargs))
    return _shapes_of(dnnlib.util.get_class(kwargs.pop('class_name')), kwargs, max_bytes=1 << 62)


def network_parameters(network_kwargs: dict) -> set[str]:
    """Names of the trainable parameters (those of its state dict that are not buffers, e.g. not Freeze-D's frozen
    weights) of the network that `network_kwargs` describes, built on the meta device without storage."""
    kwargs = dnnlib.util.to_plain(dict(network_kwargs))
    module = _meta_network(dnnlib.util.get_class(kwargs.pop('class_name')), kwargs, max_bytes=1 << 62)
    return {name for name, _ in module.named_parameters()}


def _decode_module(value: dict, where: str) -> torch.nn.Module:
    if set(value) != {_MODULE_TAG, 'init_kwargs', 'state_dict'}:
        raise UnsafeSnapshotError(f'{where}: a network entry holds exactly {_MODULE_TAG}, init_kwargs and state_dict')
    return rebuild_network(value[_MODULE_TAG], value['init_kwargs'], value['state_dict'], where)


def rebuild_network(name: Any, kwargs: Any, state: Any, where: str, max_tensors: int | None = None) -> torch.nn.Module:
    """The network `name` (one of this project's, by class name) built from `kwargs` read from a file, with the tensors
    `state` loaded strictly; on the CPU, in eval mode, requires_grad off. Raises UnsafeSnapshotError (one line starting
    with `where`) unless the class is ours, the kwargs are plain data it accepts, and they describe a network of
    exactly the state's shapes (compared on the meta device, before anything of that size is allocated, and stopped
    once it registers more than `max_tensors` parameters and buffers, when given: a class that registers no more
    than it saves can so be bounded in layers too)."""
    try:
        cls = dnnlib.util.get_class(name)
    except dnnlib.util.ConfigError as e:
        raise UnsafeSnapshotError(f'{where}: {e}') from None
    if _registry.get(name) is not cls:
        raise UnsafeSnapshotError(f'{where}: snapshot asks for class "{name}", which is not one of this project\'s networks')
    if not isinstance(kwargs, dict):
        raise UnsafeSnapshotError(f'{where}.init_kwargs: expected a dict, got {type(kwargs).__name__}')
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise UnsafeSnapshotError(f'{where}.state_dict: expected a dict of named tensors')
    for k, v in state.items():
        _check_tensor(v, f'{where}.state_dict.{k}')
    try:
        dnnlib.util.check_plain(kwargs, f'{where}.init_kwargs')
        dnnlib.util.check_arguments(cls, kwargs, f'{where}.init_kwargs')
    except dnnlib.util.ConfigError as e:
        raise UnsafeSnapshotError(str(e)) from None

    # Build on the meta device first: kwargs asking for more than the state dict holds (bytes, or with
    # max_tensors layers) are refused before anything is allocated, and before a loop of many layers has run
    # long. The bound on bytes leaves room for what is registered but not saved (non-persistent buffers such
    # as filters, tensors a parametrization replaces).
    file_shapes = {k: tuple(v.shape) for k, v in state.items()}
    stored = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in state.values()}  # Shared once.
    max_bytes = 2 * sum(stored.values()) + 2 ** 20
    try:
        shapes = _shapes_of(cls, kwargs, max_bytes, max_tensors)
    except UnsafeSnapshotError as e:
        raise UnsafeSnapshotError(f'{where}: {name} {e}') from None
    except Exception as e:  # The kwargs come from the file: any failure of the constructor means a bad file.
        raise UnsafeSnapshotError(f'{where}: cannot build {name} from its init_kwargs: {dnnlib.util.first_line(e, 300)}') from None
    if shapes != file_shapes:
        missing = sorted(set(shapes) - set(file_shapes))
        unexpected = sorted(set(file_shapes) - set(shapes))
        other = sorted(k for k in set(shapes) & set(file_shapes) if shapes[k] != file_shapes[k])
        detail = (f'{missing[0]} is missing' if missing else f'{unexpected[0]} is unexpected' if unexpected else
                  f'{other[0]} has shape {list(file_shapes[other[0]])} instead of {list(shapes[other[0]])}')
        raise UnsafeSnapshotError(f'{where}.state_dict does not match the {name} its init_kwargs describe: {detail}')
    try:
        module = cls(**kwargs)
        module.load_state_dict(state)
    except Exception as e:
        raise UnsafeSnapshotError(f'{where}: cannot rebuild {name}: {dnnlib.util.first_line(e, 300)}') from None
    return module.eval().requires_grad_(False)


def _decode(value: Any, where: str, depth: int = 0) -> Any:
    if depth > dnnlib.util.MAX_PLAIN_DEPTH:
        raise UnsafeSnapshotError(f'{where}: nested deeper than {dnnlib.util.MAX_PLAIN_DEPTH} levels')
    if isinstance(value, dict):
        if _MODULE_TAG in value:
            return _decode_module(value, where)
        if not all(isinstance(k, (str, int)) for k in value):
            raise UnsafeSnapshotError(f'{where}: dict keys must be str or int')
        decoded = dnnlib.EasyDict({k: _decode(v, f'{where}.{k}', depth + 1) for k, v in value.items()})
        if 'class_name' in decoded:  # Whatever reads it may build it: it must pass the allow-list.
            try:
                dnnlib.util.check_class_kwargs(decoded, where)
            except dnnlib.util.ConfigError as e:
                raise UnsafeSnapshotError(str(e)) from None
        return decoded
    if isinstance(value, torch.Tensor):
        _check_tensor(value, where)
        return value
    if isinstance(value, list):
        return [_decode(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_decode(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(value))
    return value


def _unpickler_reason(error: Exception) -> str:
    """The informative part of torch's weights-only unpickler message (it also suggests weights_only=False,
    which is exactly what must not be done with an untrusted file)."""
    m = re.search(r'WeightsUnpickler error:\s*(.+?)(?:\n\n|$)', str(error), re.S)
    return m.group(1).strip().splitlines()[0] if m else dnnlib.util.first_line(error, 300)


def load_snapshot(path_or_url: str) -> dnnlib.EasyDict:
    """Load a snapshot written by `save_snapshot` from a path or URL, without running foreign code.

    Networks come back on the CPU, in eval mode, with requires_grad off; every {'class_name': ...}
    dict in it (training_set_kwargs, the preset's kwargs) has passed dnnlib.util.check_class_kwargs.
    Raises UnsafeSnapshotError (one line) for any file that is not such a snapshot, OSError when the
    file cannot be read.
    """
    with dnnlib.util.open_url(path_or_url, verbose=False) as f:
        _check_archive(f, path_or_url)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')  # torch warns about pickle protocols of foreign files.
                payload = torch.load(f, map_location='cpu', weights_only=True)
        except Exception as e:  # Whatever the unpickler raises, the file is not a loadable snapshot.
            raise UnsafeSnapshotError(f'{path_or_url}: refused to load: the file is not a plain-data snapshot '
                                      f'({_unpickler_reason(e)}); nothing in it was run') from None
    if not isinstance(payload, dict) or payload.get('format') != _SNAPSHOT_FORMAT:
        raise UnsafeSnapshotError(f'{path_or_url}: not a GN-GAN snapshot')
    if payload.get('version') != _SNAPSHOT_VERSION:
        raise UnsafeSnapshotError(f'{path_or_url}: unsupported snapshot version {str(payload.get("version"))[:20]}')
    if not isinstance(payload.get('data'), dict):
        raise UnsafeSnapshotError(f'{path_or_url}: not a GN-GAN snapshot (no data)')
    try:
        data = _decode(payload['data'], 'snapshot')
    except UnsafeSnapshotError as e:
        raise UnsafeSnapshotError(f'{path_or_url}: {e}') from None
    for key, types in _ENTRY_TYPES.items():
        if key in data and not isinstance(data[key], types):
            raise UnsafeSnapshotError(f'{path_or_url}: snapshot.{key} is a {type(data[key]).__name__}, '
                                      f'not a {getattr(types, "__name__", "dict")}')
    if data.get('training_set_kwargs') is not None:  # The tools build the dataset from it.
        try:
            dnnlib.util.check_class_kwargs(data.training_set_kwargs, 'snapshot.training_set_kwargs')
        except dnnlib.util.ConfigError as e:
            raise UnsafeSnapshotError(f'{path_or_url}: {e}') from None
    return data
