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
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import pickle
import re
import tempfile
import warnings
from typing import Any, TypeVar

import numpy as np
import torch

import dnnlib

#----------------------------------------------------------------------------

_SNAPSHOT_FORMAT = 'gngan-snapshot'
_SNAPSHOT_VERSION = 1
_MODULE_TAG = '__persistent_module__'

# Top-level packages of this project: a snapshot may import a network module only from these.
_ALLOWED_PACKAGES = ('training', 'metrics', 'torch_utils', 'ops')

_registry: dict[str, type] = {}  # 'module.QualName' -> class, filled by @persistent_class.

_PLAIN_SCALARS = (bool, int, float, str, type(None))

T = TypeVar('T', bound=type)


class UnsafeSnapshotError(RuntimeError):
    """The file is not a snapshot that can be loaded without running foreign code."""


def _check_plain(value: Any, where: str) -> None:
    """Constructor kwargs must be plain data so a snapshot can rebuild the network exactly."""
    if isinstance(value, _PLAIN_SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f'{where}[{i}]')
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f'{where}: dict keys must be str, got {type(k).__name__}')
            _check_plain(v, f'{where}.{k}')
        return
    raise TypeError(f'{where}: constructor arguments of persistent classes must be plain data '
                    f'(int/float/str/bool/None/list/tuple/dict), got {type(value).__name__}')


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
        _check_plain(kwargs, f'{cls.__name__}()')
        orig_init(self, **kwargs)
        object.__setattr__(self, 'init_kwargs', dnnlib.EasyDict(copy.deepcopy(kwargs)))

    cls.__init__ = __init__
    _registry[class_name_of(cls)] = cls
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
    if isinstance(value, _PLAIN_SCALARS):
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


def save_snapshot(path: str, data: dict[str, Any]) -> None:
    """Write `data` to `path` as plain data, atomically (temporary file + rename).

    A crash mid-write leaves at most a stray temporary file, never a truncated snapshot.
    """
    payload = {'format': _SNAPSHOT_FORMAT, 'version': _SNAPSHOT_VERSION, 'data': _encode(data, 'snapshot')}
    dirname = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=dirname, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def remove_stale_temporaries(dirname: str) -> None:
    """Delete the hidden `.<name>.pkl.<random>.tmp` files that a writer killed mid-write (kill -9) left in `dirname`."""
    if not os.path.isdir(dirname):
        return
    for name in os.listdir(dirname):
        if name.startswith('.') and name.endswith('.tmp') and '.pkl.' in name:
            try:
                os.remove(os.path.join(dirname, name))
            except FileNotFoundError:
                pass

#----------------------------------------------------------------------------
# Loading.


def _lookup_class(name: str) -> type:
    if name not in _registry:
        module_name = name.rsplit('.', 1)[0]
        while module_name and module_name not in _registry:
            if module_name.split('.')[0] not in _ALLOWED_PACKAGES:
                break
            try:
                importlib.import_module(module_name)
                break
            except ModuleNotFoundError:
                module_name = module_name.rsplit('.', 1)[0] if '.' in module_name else ''
    if name not in _registry:
        raise UnsafeSnapshotError(f'snapshot asks for class "{name}", which is not one of this project\'s networks')
    return _registry[name]


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if _MODULE_TAG in value:
            cls = _lookup_class(value[_MODULE_TAG])
            module = cls(**value['init_kwargs'])
            module.load_state_dict(value['state_dict'])
            return module.eval().requires_grad_(False)
        return dnnlib.EasyDict({k: _decode(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v) for v in value)
    return value


def _unpickler_reason(error: Exception) -> str:
    """The informative part of torch's weights-only unpickler message (it also suggests weights_only=False,
    which is exactly what must not be done with an untrusted file)."""
    m = re.search(r'WeightsUnpickler error:\s*(.+?)(?:\n\n|$)', str(error), re.S)
    return m.group(1).strip() if m else type(error).__name__


def load_snapshot(path_or_url: str) -> dnnlib.EasyDict:
    """Load a snapshot written by `save_snapshot` from a path or URL, without running foreign code.

    Networks come back on the CPU, in eval mode, with requires_grad off.
    """
    with dnnlib.util.open_url(path_or_url, verbose=False) as f:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')  # torch warns about pickle protocols of foreign files.
                payload = torch.load(f, map_location='cpu', weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as e:
            raise UnsafeSnapshotError(f'{path_or_url}: refused to load: the file is not a plain-data snapshot '
                                      f'({_unpickler_reason(e)}); nothing in it was run') from None
    if not isinstance(payload, dict) or payload.get('format') != _SNAPSHOT_FORMAT:
        raise UnsafeSnapshotError(f'{path_or_url}: not a GN-GAN snapshot')
    if payload.get('version') != _SNAPSHOT_VERSION:
        raise UnsafeSnapshotError(f'{path_or_url}: unsupported snapshot version {payload.get("version")}')
    return _decode(payload['data'])
